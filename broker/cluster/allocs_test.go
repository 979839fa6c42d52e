package cluster

import (
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func allocIDs(v *View) []string {
	var out []string
	for _, a := range v.GPUAllocs() {
		out = append(out, a.ID)
	}
	return out
}

func TestGPUAllocationsFollowTheirEvents(t *testing.T) {
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	v := NewView(nil)
	v.Reset(Snapshot{Jobs: []*api.Job{testbuild.Job("vision", "train").Group("g", 2, 1, "gpu").ModifyIndex(7).Build()}})
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", "train", "n1", 10, "gpu-0").Started(start).Restarted(start.Add(time.Minute)).Build())
	v.ObserveAlloc(testbuild.Alloc("a2", "vision", "train", "n1", 11, "gpu-1").Status(api.AllocDesiredStatusRun, api.AllocClientStatusPending, 11).Build())
	v.ObserveAlloc(testbuild.Alloc("cpu", "vision", "web", "n1", 12).Build())

	got := v.GPUAllocs()
	want := []Alloc{
		{ID: "a1", Namespace: "vision", JobID: "train", Group: "g", NodeID: "n1", CreateIndex: 10, ModifyIndex: 10, JobIndex: 7,
			GPUs: []string{"gpu-0"}, Tasks: []string{"t"}, StartedAt: start, Restarts: []time.Time{time.Unix(0, start.Add(time.Minute).UnixNano())}},
		{ID: "a2", Namespace: "vision", JobID: "train", Group: "g", NodeID: "n1", CreateIndex: 11, ModifyIndex: 11, JobIndex: 7,
			GPUs: []string{"gpu-1"}, Tasks: []string{"t"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("GPU allocations:\n got %+v\nwant %+v", got, want)
	}

	// An older event about a2 changes nothing; a1 completing drops it.
	v.ObserveAlloc(testbuild.Alloc("a2", "vision", "train", "n1", 9, "gpu-1").Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 9).Build())
	v.ObserveAlloc(testbuild.Alloc("a1", "vision", "train", "n1", 10, "gpu-0").Status(api.AllocDesiredStatusRun, api.AllocClientStatusComplete, 20).Build())
	if got := allocIDs(v); !reflect.DeepEqual(got, []string{"a2"}) {
		t.Fatalf("after a1 completed: %v, want [a2]", got)
	}
	// Evicted by preemption: kept, marked, until a listing no longer has it.
	v.ObserveAlloc(testbuild.Alloc("a2", "vision", "train", "n1", 11, "gpu-1").PreemptedBy("owner", 21).Status(api.AllocDesiredStatusEvict, api.AllocClientStatusComplete, 22).Build())
	if got := v.GPUAllocs(); len(got) != 1 || !got[0].Preempted || got[0].PreemptedAt != 21 {
		t.Fatalf("after preemption: %+v, want a2 preempted at 21 (its AllocModifyIndex, not its client's later update)", got)
	}
	v.Reset(Snapshot{})
	if got := allocIDs(v); got != nil {
		t.Fatalf("after a listing without them: %v", got)
	}
}

// The ledger charges an allocation up to its end. The view keeps one that
// stopped holding GPUs, charged as running while its tasks still run, with
// its end once its client tells it, and what a listing shows ended while
// events were not followed.
func TestTheViewKeepsEndedAllocationsForTheLedger(t *testing.T) {
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	now := start.Add(time.Hour)
	v := NewView(nil)
	v.SetClock(clock.Func(func() time.Time { return now }))
	v.Reset(Snapshot{Allocs: []*api.Allocation{testbuild.Alloc("gap", "vision", "train", "n1", 5, "gpu-9").Started(start).Build()}})
	alloc := func(id string, index uint64, gpu string) *testbuild.AllocBuilder {
		return testbuild.Alloc(id, "vision", "train", "n1", index, gpu).Started(start)
	}
	v.ObserveAlloc(alloc("a1", 10, "gpu-0").Build())
	v.ObserveAlloc(alloc("a2", 11, "gpu-1").Build())
	v.ObserveAlloc(testbuild.Alloc("never", "vision", "train", "n1", 12, "gpu-2").Build())
	ended := func() map[string]time.Time {
		out := map[string]time.Time{}
		for _, a := range v.EndedAllocs() {
			out[a.ID] = a.EndedAt
		}
		return out
	}
	v.ObserveAlloc(alloc("a1", 10, "gpu-0").Status(api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 20).Build())
	v.ObserveAlloc(testbuild.Alloc("never", "vision", "train", "n1", 12, "gpu-2").Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 21).Build())
	if got, want := ended(), map[string]time.Time{"a1": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a1 being stopped, one that never started: %v, want %v", got, want)
	}
	end := start.Add(10 * time.Minute)
	v.ObserveAlloc(alloc("a1", 10, "gpu-0").Finished(end).Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 22).Build())
	v.ObserveAlloc(alloc("a1", 10, "gpu-0").Status(api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 21).Build()) // older
	v.ObserveAlloc(alloc("a2", 11, "gpu-1").PreemptedBy("owner", 23).Build())
	if got, want := ended(), map[string]time.Time{"a1": end, "a2": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a1 ended, a2 preempted while its task runs: %v, want %v", got, want)
	}
	if a := v.EndedAllocs()[0]; a.StartedAt != start || !reflect.DeepEqual(a.GPUs, []string{"gpu-0"}) {
		t.Errorf("ended a1 lost what it held: %+v", a)
	}
	// Events lost: a listing without a2 and gap says they ended by now.
	v.Reset(Snapshot{})
	if got, want := ended(), map[string]time.Time{"a1": end, "a2": now, "gap": now}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after a listing: %v, want %v", got, want)
	}
	// An hour after, the next end forgets them.
	now = now.Add(time.Hour + time.Minute)
	v.ObserveAlloc(alloc("a3", 30, "gpu-3").Build())
	v.ObserveAlloc(alloc("a3", 30, "gpu-3").Finished(now).Status(api.AllocDesiredStatusRun, api.AllocClientStatusComplete, 31).Build())
	if got, want := ended(), map[string]time.Time{"a3": now}; !reflect.DeepEqual(got, want) {
		t.Fatalf("an hour later: %v, want %v", got, want)
	}
}

func TestNodeGPUsComeFromTheNode(t *testing.T) {
	v := NewView(nil)
	if v.Synced() {
		t.Fatal("synced before any listing")
	}
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 1, 1)}})
	if !v.Synced() {
		t.Fatal("not synced after a listing")
	}
	if got, want := v.NodeGPUs("n1"), map[string]GPU{"n1-0": {Model: testbuild.H100, Healthy: true, PCIBusID: "0000:01:00.0"}, "n1-1": {Model: testbuild.H100, Why: "other", PCIBusID: "0000:02:00.0"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("health %v, want %v", got, want)
	}
}

// A stopped or scaled-down job's allocations count as used until their
// client says their tasks ended, not when Nomad asks them to stop. A task
// may checkpoint for its whole kill_timeout, and what it holds is not
// admitted twice in between.
func TestGPUsStayUsedUntilTheAllocationsEnd(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	running := func(id string, index uint64, gpus ...string) *api.Allocation {
		return testbuild.Alloc(id, "vision", "train", "n", index, gpus...).Build()
	}
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n", testbuild.H100, 8, 0)},
		Jobs:   []*api.Job{testbuild.Job("vision", "train").Group("g", 2, 2, "nvidia/gpu").ModifyIndex(5).Build()},
		Allocs: []*api.Allocation{running("a1", 6, "n-0", "n-1"), running("a2", 6, "n-2", "n-3")}})
	used := func() float64 { return v.Usage(p).Tenants["vision"].Used.Total() }
	if used() != 4 {
		t.Fatalf("running: %g", used())
	}
	// Scaled down to one: a2 still runs until its tasks end.
	v.ObserveJob(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu").ModifyIndex(7).Build())
	if used() != 4 {
		t.Errorf("scaled down, a2 still running: %g used, want 4", used())
	}
	alloc := func(id string, desired, client string, index uint64, gpus ...string) *api.Allocation {
		return testbuild.Alloc(id, "vision", "train", "n", 6, gpus...).Status(desired, client, index).Build()
	}
	v.ObserveAlloc(alloc("a2", api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 8, "n-2", "n-3"))
	if used() != 4 {
		t.Errorf("a2 asked to stop, its tasks still running: %g used, want 4", used())
	}
	v.ObserveAlloc(alloc("a2", api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 9, "n-2", "n-3"))
	if used() != 2 {
		t.Errorf("a2 ended: %g used, want 2", used())
	}
	// Stopped: a1's GPUs stay used until its tasks end.
	v.ObserveJob(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu").ModifyIndex(10).Stopped().Build())
	v.ObserveAlloc(alloc("a1", api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 11, "n-0", "n-1"))
	if used() != 2 {
		t.Errorf("job stopped, a1 checkpointing: %g used, want 2", used())
	}
	v.ObserveAlloc(alloc("a1", api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 12, "n-0", "n-1"))
	if used() != 0 {
		t.Errorf("all ended: %g used", used())
	}
	// Stopped before its tasks ran: it holds nothing, and its client may
	// never say so.
	v.ObserveJob(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu").ModifyIndex(13).Build())
	v.ObserveAlloc(alloc("a3", api.AllocDesiredStatusRun, api.AllocClientStatusPending, 14, "n-4", "n-5"))
	v.ObserveJob(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu").ModifyIndex(15).Stopped().Build())
	v.ObserveAlloc(alloc("a3", api.AllocDesiredStatusStop, api.AllocClientStatusPending, 16, "n-4", "n-5"))
	if used() != 0 {
		t.Errorf("stopped while pending: %g used", used())
	}
}
