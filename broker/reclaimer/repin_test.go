package reclaimer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// A batch job pinned to a node that drains before it runs is pinned to
// another node and registered with a stamp that binds the new pin. One whose
// node still takes work waits RepinAfter first. A job moved to a sub-band
// (verified through its grant) is pinned again at its priority now.
func TestTheRepinnerPinsAJobAgainBeforeItRuns(t *testing.T) {
	p := bandPolicy(t, "")
	st := nomadjob.Stamper{Key: []byte("k")}
	view := cluster.NewView(st.VerifyCounting)
	view.ObserveNode(testbuild.Node("n1", "H100", 8, 0))
	view.ObserveNode(testbuild.Node("n2", "H100", 8, 0))
	pinned := func(id, node string, prio int) *api.Job { return pinnedJob(st, id, node, prio) }
	drained, waiting, moved := pinned("drained", "n1", 20), pinned("waiting", "n2", 20), pinned("moved", "n1", 20)
	moved.Priority = ptr(23) // moved to a sub-band: verified through its grant
	g := grants{"moved": {Stamp: moved.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 1}, Admitted: map[string]int{"g": 1},
		StampedPriority: 20, Priority: 23, From: 20, SubBand: true}}
	nomad := &promoteJobs{jobs: map[string]*api.Job{"drained": drained, "waiting": waiting, "moved": moved}}
	for _, j := range []*api.Job{drained, waiting, moved} {
		view.ObserveJob(j)
	}
	n1 := testbuild.Node("n1", "H100", 8, 0)
	n1.SchedulingEligibility = api.NodeSchedulingIneligible
	view.ObserveNode(n1)
	r := &reclaimer.Repinner{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, View: view, Jobs: nomad, Records: decide.Records{Grants: g},
		Stamper: st, Lock: view.LockJob}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := r.Observed(context.Background(), now, nil, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]*api.Job{}
	for _, req := range nomad.registered {
		got[*req.Job.ID] = req.Job
	}
	if len(got) != 2 || got["drained"] == nil || got["moved"] == nil {
		t.Fatalf("pinned again: %v, want drained and moved (waiting's node takes work)", keysOf(got))
	}
	for id, j := range got {
		if pin := j.TaskGroups[0].Constraints; len(pin) != 1 || pin[0].RTarget != "n2" {
			t.Errorf("%s pinned to %+v, want n2", id, pin)
		}
		if !st.Verify(j) || !strings.HasPrefix(j.Meta[nomadjob.MetaAdmission], "v5:") {
			t.Errorf("%s: its new stamp does not verify it (priority %d)", id, *j.Priority)
		}
	}
	if *got["moved"].Priority != 23 {
		t.Errorf("moved registered at %d, want its sub-band 23", *got["moved"].Priority)
	}
	// waiting, unplaced on a node that takes work: after RepinAfter.
	nomad.registered = nil
	if err := r.Observed(context.Background(), now.Add(reclaimer.RepinAfter), nil, nil); err != nil {
		t.Fatal(err)
	}
	if !containsJob(nomad.registered, "waiting") {
		t.Errorf("waiting not pinned again after %s: %d registered", reclaimer.RepinAfter, len(nomad.registered))
	}
}

// pinnedJob is a borrowed batch job of vision the broker admitted at prio
// and pinned to node.
func pinnedJob(st nomadjob.Stamper, id, node string, prio int) *api.Job {
	j := testbuild.Job("vision", id).Type(api.JobTypeBatch).Priority(prio).Group("g", 1, 2, "nvidia/gpu").ModifyIndex(7).Build()
	j.TaskGroups[0].Constraints = []*api.Constraint{{LTarget: "${node.unique.id}", Operand: "set_contains_any", RTarget: node}}
	return admittedBorrowed(st, j)
}

// A job the broker placed in another region it governs is pinned again on
// that region's nodes, read and registered through that region's client.
func TestTheRepinnerPinsAgainInEveryRegion(t *testing.T) {
	p := bandPolicy(t, "")
	st := nomadjob.Stamper{Key: []byte("k")}
	home, west := cluster.NewView(st.VerifyCounting), cluster.NewView(st.VerifyCounting)
	west.SetRegion("west")
	home.ObserveNode(testbuild.Node("e1", "H100", 8, 0))
	w1 := testbuild.Node("w1", "H100", 8, 0)
	west.ObserveNode(w1)
	west.ObserveNode(testbuild.Node("w2", "H100", 8, 0))
	job := pinnedJob(st, "far", "w1", 20)
	west.ObserveJob(job)
	w1.SchedulingEligibility = api.NodeSchedulingIneligible
	west.ObserveNode(w1)
	homeNomad, westNomad := &promoteJobs{jobs: map[string]*api.Job{}}, &promoteJobs{jobs: map[string]*api.Job{"far": job}}
	r := &reclaimer.Repinner{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, View: home, Jobs: homeNomad,
		Elsewhere: map[string]reclaimer.RepinRegion{"west": {View: west, Jobs: westNomad}}, Stamper: st, Lock: home.LockJob}
	if err := r.Observed(context.Background(), time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(homeNomad.registered) != 0 || len(westNomad.registered) != 1 {
		t.Fatalf("registered: %d in the broker's own region, %d in west; want far once, in west", len(homeNomad.registered), len(westNomad.registered))
	}
	if pin := westNomad.registered[0].Job.TaskGroups[0].Constraints; len(pin) != 1 || pin[0].RTarget != "w2" {
		t.Errorf("far pinned to %+v, want w2, west's node that takes work", pin)
	}
}

func keysOf(m map[string]*api.Job) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func containsJob(reqs []api.JobRegisterRequest, id string) bool {
	for _, r := range reqs {
		if *r.Job.ID == id {
			return true
		}
	}
	return false
}
