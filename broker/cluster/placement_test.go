package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// The rooms admission places work on: per node, GPUs no live allocation
// holds, less what an admission placed there that Nomad has not placed
// yet; the borrowed allocations on each, at their job's priority.
func TestRoomsCountPlacementsUntilTheirAllocationsShow(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	v := NewView(stamper.Verify)
	v.SetClock(clock.Func(func() time.Time { return now }))
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveNode(testbuild.Node("n2", testbuild.H100, 8, 0))
	borrowed := admitted(testbuild.Job("vision", "old").Group("g", 1, 3, "nvidia/gpu"), admission.Decision{Tenant: "vision", Queue: "training",
		Outcome: admission.AdmitBorrowed, Priority: 22})
	v.ObserveJob(borrowed)
	v.ObserveAlloc(testbuild.Alloc("a0", "vision", "old", "n1", 5, "n1-0", "n1-1", "n1-2").Started(now.Add(-time.Hour)).Build())
	free := func() []int {
		var out []int
		for _, r := range v.Rooms() {
			out = append(out, r.Free)
		}
		return out
	}
	if got := free(); !slices.Equal(got, []int{5, 8}) {
		t.Fatalf("free %v, want [5 8]", got)
	}
	if r := v.Rooms()[0]; r.Borrowed != 3 || len(r.Held) != 1 || r.Held[0].Priority != 22 || !r.Held[0].Since.Equal(now.Add(-time.Hour)) {
		t.Errorf("n1's borrowed work: %+v", r)
	}
	// Admitted and placed on n1 (best fit): n1 counts it at once.
	j := admission.Job{ID: "new", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 4}}}
	d, res := v.Admit(p, j)
	if !slices.Equal(d.Placed["g"], []string{"n1"}) {
		t.Fatalf("placed %v, want n1", d.Placed)
	}
	if got := free(); !slices.Equal(got, []int{1, 8}) {
		t.Errorf("after the admission: free %v, want [1 8]", got)
	}
	// Its allocation shows: counted once, as an allocation.
	res.Confirm(10)
	v.ObserveJob(admitted(testbuild.Job("vision", "new").Type(api.JobTypeBatch).Group("g", 1, 4, "nvidia/gpu").ModifyIndex(10), d))
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", "new", "n1", 11, "n1-3", "n1-4", "n1-5", "n1-6").Build())
	if got := free(); !slices.Equal(got, []int{1, 8}) {
		t.Errorf("its allocation seen: free %v, want [1 8]", got)
	}
	// One released (Nomad did not take it) frees its node at once.
	_, res = v.Admit(p, admission.Job{ID: "gone", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	if got := free(); !slices.Equal(got, []int{0, 8}) {
		t.Errorf("after a second admission: free %v, want [0 8]", got)
	}
	res.Release()
	if got := free(); !slices.Equal(got, []int{1, 8}) {
		t.Errorf("released: free %v, want [1 8]", got)
	}
	// One never seen ends with its reservation.
	v.Admit(p, admission.Job{ID: "lost", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	now = now.Add(ReservationHold)
	if got := free(); !slices.Equal(got, []int{1, 8}) {
		t.Errorf("expired: free %v, want [1 8]", got)
	}
	// A job bound to nodes sees only those.
	u := v.UsageFor(p, admission.Job{ID: "x", Namespace: "vision", Where: admission.Where{Nodes: []string{"n2"}}})
	if len(u.Nodes) != 1 || u.Nodes[0].ID != "n2" {
		t.Errorf("a job pinned to n2 by its user sees %+v", u.Nodes)
	}
	u = v.UsageFor(p, admission.Job{ID: "x", Namespace: "vision", Where: admission.Where{Datacenters: []string{"dc9*"}}})
	if len(u.Nodes) != 0 || u.Nodes == nil {
		t.Errorf("a job of another datacenter sees %+v, want no node (known)", u.Nodes)
	}
}

// A dispatched child is decided under a key of the broker's and placed
// there; Nomad names it: its placement moves to that id with its
// reservation, so that the child's allocation shows it taken, and its end
// frees the node. (Left under the broker's key, the node looked taken
// until the placement expired: a dispatch in west sent the next job of
// another tenant to east.)
func TestADispatchedChildsPlacementEndsWithItsAllocation(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	v := NewView(nil)
	v.SetClock(clock.Func(func() time.Time { return now }))
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	free := func() int { return v.Rooms()[0].Free }
	d, res := v.Admit(p, admission.Job{ID: "parent/dispatch-broker-key", Namespace: "vision",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 4}}})
	if !slices.Equal(d.Placed["g"], []string{"n1"}) || free() != 4 {
		t.Fatalf("placed %v, free %d, want n1 and 4", d.Placed, free())
	}
	const child = "parent/dispatch-1700000000-abcd"
	res.ConfirmAs(child, 40)
	v.ObserveJob(testbuild.Job("vision", child).Group("g", 1, 4, "gpu").ModifyIndex(40).Build())
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", child, "n1", 41, "n1-0", "n1-1", "n1-2", "n1-3").Build())
	if got := free(); got != 4 {
		t.Errorf("the child's allocation seen: free %d, want 4 (counted once)", got)
	}
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", child, "n1", 42, "n1-0", "n1-1", "n1-2", "n1-3").Status("stop", "complete", 42).Build())
	v.ObserveJob(testbuild.Job("vision", child).Type(api.JobTypeBatch).Group("g", 1, 4, "gpu").ModifyIndex(40).Dead().Build())
	if got := free(); got != 8 {
		t.Errorf("the child done: free %d, want 8", got)
	}
}

// A batch job the broker pinned whose pinned group has no live allocation
// waits for a placement; its node gone, it is pinned again at once.
func TestUnplacedPinnedJobs(t *testing.T) {
	v := NewView(stamper.Verify)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	pinned := testbuild.Job("vision", "train").Type(api.JobTypeBatch).Group("g", 1, 2, "nvidia/gpu")
	job := pinned.Build()
	job.TaskGroups[0].Constraints = []*api.Constraint{{LTarget: "${node.unique.id}", Operand: "set_contains_any", RTarget: "n1"}}
	v.ObserveJob(admitted(testbuild.Job("vision", "unpinned").Type(api.JobTypeBatch).Group("g", 1, 2, "nvidia/gpu"),
		admission.Decision{Tenant: "vision", Queue: "training", Outcome: admission.Admit, Priority: 60}))
	d := admission.Decision{Tenant: "vision", Queue: "training", Outcome: admission.Admit, Priority: 60}
	for k, val := range nomadjob.BrokerMeta(d, stamper.Stamp("vision", job, d)) {
		job.Meta[k] = val
	}
	job.Priority = ptr(60)
	v.ObserveJob(job)
	if got := v.Unplaced(); !slices.Equal(got, []Unplaced{{Namespace: "vision", ID: "train"}}) {
		t.Fatalf("unplaced %+v, want train (only the pinned job)", got)
	}
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", "train", "n1", 5, "n1-0", "n1-1").Build())
	if got := v.Unplaced(); len(got) != 0 {
		t.Errorf("placed: unplaced %+v", got)
	}
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", "train", "n1", 6, "n1-0", "n1-1").Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 6).Build())
	drained := testbuild.Node("n1", testbuild.H100, 8, 0)
	drained.SchedulingEligibility = api.NodeSchedulingIneligible
	v.ObserveNode(drained)
	if got := v.Unplaced(); !slices.Equal(got, []Unplaced{{Namespace: "vision", ID: "train", NodeGone: true}}) {
		t.Errorf("its allocation stopped on a drained node: unplaced %+v", got)
	}
}
