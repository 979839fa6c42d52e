package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// twoRegions is east (the broker's own) and west, one 8-GPU H100 node each.
func twoRegions() (*Regions, *View, *View) {
	east, west := NewView(stamper.Verify), NewView(stamper.Verify)
	west.SetRegion("west")
	east.ObserveNode(testbuild.Node("e1", testbuild.H100, 8, 0))
	west.ObserveNode(testbuild.Node("w1", testbuild.H100, 8, 0))
	return NewRegions("east", east, map[string]*View{"west": west}), east, west
}

// A tenant's limit counts its GPUs in every region: what it holds in west
// leaves east only the rest, and each job is placed on its own region's
// nodes.
func TestOneQuotaOverRegions(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy) // vision: guaranteed 4, limit 8
	r, _, west := twoRegions()
	held := admitted(testbuild.Job("vision", "w-train").Group("g", 1, 6, "nvidia/gpu"), admission.Decision{Tenant: "vision",
		Queue: "training", Outcome: admission.AdmitBorrowed, Priority: 22})
	west.ObserveJob(held)
	west.ObserveAlloc(testbuild.Alloc("a0", "vision", "w-train", "w1", 5, "w1-0", "w1-1", "w1-2", "w1-3", "w1-4", "w1-5").Build())

	three := admission.Job{ID: "e-three", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 3}}}
	if d, _ := r.Admit(p, three); d.Outcome != admission.Queue {
		t.Fatalf("3 GPUs in east with 6 held in west (limit 8): %s (%s), want queue", d.Outcome, d.Reason)
	}
	if u := r.UsageFor(p, three); u.Tenants["vision"].Used.Total() != 6 {
		t.Errorf("east's usage counts vision's %v GPUs, want the 6 held in west", u.Tenants["vision"].Used.Total())
	}
	two := admission.Job{ID: "e-two", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 2}}}
	d, res := r.Admit(p, two)
	if d.Outcome != admission.AdmitBorrowed || !slices.Equal(d.Placed["g"], []string{"e1"}) {
		t.Fatalf("2 GPUs in east: %s on %v (%s), want admitted on e1", d.Outcome, d.Placed, d.Reason)
	}
	defer res.Release()
	// West sees east's reservation too: no GPU is left to vision anywhere.
	one := admission.Job{ID: "w-one", Namespace: "vision", Where: admission.Where{Region: "west"},
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}}
	if d, _ := r.Admit(p, one); d.Outcome != admission.Queue {
		t.Errorf("1 GPU in west at vision's limit: %s (%s), want queue", d.Outcome, d.Reason)
	}
	if got := r.Capacity(); got != 16 {
		t.Errorf("capacity %d, want both regions' 16", got)
	}
}

// A request names its region as Nomad reads it: none, "global" or the
// broker's own name is the own region; a region the broker does not
// govern is refused with the reason.
func TestRegionsAreNamedAsNomadNamesThem(t *testing.T) {
	r, east, west := twoRegions()
	for _, name := range []string{"", "global", "east"} {
		if v, key, ok := r.In(name); !ok || v != east || key != "" {
			t.Errorf("In(%q) = %v, %q, %v; want east's view, \"\"", name, v == east, key, ok)
		}
	}
	if v, key, ok := r.In("west"); !ok || v != west || key != "west" {
		t.Errorf("In(west) = %v, %q, %v", v == west, key, ok)
	}
	if r.Governs("south") {
		t.Error("south is governed")
	}
	p := testbuild.Policy(t, visionPolicy)
	d, _ := r.Admit(p, admission.Job{ID: "j", Namespace: "vision", Where: admission.Where{Region: "south"},
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	if d.Outcome != admission.Reject || d.Rule != "region" {
		t.Errorf("a job for south: %s by %q, want rejected by rule region", d.Outcome, d.Rule)
	}
	got := r.Status()
	if len(got) != 2 || got[0].Name != "east" || !got[0].Own || got[1].Name != "west" || got[1].GPUs != 8 || got[1].Free != 8 || got[1].Nodes != 1 {
		t.Errorf("status %+v", got)
	}
	for _, n := range r.Map(0) {
		if want := map[string]string{"e1": "east", "w1": "west"}[n.ID]; n.Region != want {
			t.Errorf("node %s in region %q on the map, want %q", n.ID, n.Region, want)
		}
	}
	if rooms := r.Rooms(); len(rooms) != 2 || rooms[0].Region != "" || rooms[1].Region != "west" {
		t.Errorf("rooms %+v", rooms)
	}
}

// A job is found in the one other region that has it, by id or prefix; a
// job of the broker's own region, or of none, is left to it.
func TestAJobIsFoundInItsRegion(t *testing.T) {
	r, east, west := twoRegions()
	west.ObserveJob(testbuild.Job("vision", "train-7").Group("g", 1, 1, "nvidia/gpu").Build())
	east.ObserveJob(testbuild.Job("vision", "serve").Group("g", 1, 1, "nvidia/gpu").Build())
	// Dispatched to west, then finished: still found there (Nomad keeps it
	// for its job_gc_threshold); one never dispatched is forgotten once it ends.
	done := testbuild.Job("vision", "done").Type("batch").Group("g", 1, 1, "nvidia/gpu").Meta("nomad-gpu.dispatched-region", "west").Build()
	west.ObserveJob(done)
	done.Status, done.ModifyIndex = ptr("dead"), ptr(uint64(1)) // ended after its registration
	west.ObserveJob(done)
	other := testbuild.Job("vision", "other").Type("batch").Group("g", 1, 1, "nvidia/gpu").Build()
	west.ObserveJob(other)
	other.Status, other.ModifyIndex = ptr("dead"), ptr(uint64(1)) // ended after its registration
	west.ObserveJob(other)
	for _, c := range []struct {
		ns, id string
		prefix bool
		want   string
	}{
		{"vision", "train-7", false, "west"}, {"vision", "train", true, "west"}, {"vision", "train", false, ""},
		{"other", "train-7", false, ""}, {"vision", "serve", false, ""}, {"vision", "nothing", true, ""},
		{"vision", "done", false, "west"}, {"vision", "do", true, "west"}, {"vision", "other", false, ""},
	} {
		if got := r.RegionOf(c.ns, c.id, c.prefix); got != c.want {
			t.Errorf("RegionOf(%s, %s, prefix %t) = %q, want %q", c.ns, c.id, c.prefix, got, c.want)
		}
	}
	// The leader's loops (an approval's expiry) find a live GPU job in its
	// region, the broker's own as "".
	for id, want := range map[string]string{"train-7": "west", "serve": "", "nothing": "-"} {
		got, ok := r.JobRegion("vision", id)
		if !ok {
			got = "-"
		}
		if got != want {
			t.Errorf("JobRegion(vision, %s) = %q, want %q (-: none)", id, got, want)
		}
	}
}

// A drained region takes no new work: a job for it is queued, passed over
// by the queue, saying who drained it; one running there is decided as
// ever; once it resumes, the same job is admitted.
func TestADrainedRegionTakesNoNewWork(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	r, _, west := twoRegions()
	west.ObserveJob(testbuild.Job("vision", "running").Group("g", 1, 1, "nvidia/gpu").Build())
	r.SetDrained(map[string]string{"west": "by ops at 2026-12-04T10:00:00Z"})
	job := func(id string) admission.Job {
		return admission.Job{ID: id, Namespace: "vision", Where: admission.Where{Region: "west"}, Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}}
	}
	d, res := r.Admit(p, job("new"))
	if d.Outcome != admission.Queue || d.WaitsFor != admission.WaitLimit || res != nil ||
		d.Reason != "region west is drained (by ops at 2026-12-04T10:00:00Z): no new work goes there; queued until it resumes (gpu-broker region resume)" {
		t.Fatalf("a new job in drained west: %s (%s), %v", d.Outcome, d.Reason, res)
	}
	if d := admission.Decide(p, job("new"), r.UsageFor(p, job("new"))); d.Outcome != admission.Queue {
		t.Errorf("a preview of a new job in drained west: %s, want queue", d.Outcome)
	}
	if d, res := r.Admit(p, job("running")); d.Outcome != admission.Admit {
		t.Errorf("an update of a job running in drained west: %s (%s)", d.Outcome, d.Reason)
	} else {
		res.Release()
	}
	if st := r.Status(); st[1].Drained == "" || st[0].Drained != "" {
		t.Errorf("status: %+v, want west drained alone", st)
	}
	r.SetDrained(nil)
	if d, _ := r.Admit(p, job("new")); d.Outcome != admission.Admit {
		t.Errorf("a new job in west resumed: %s (%s)", d.Outcome, d.Reason)
	}
}

// A tenant's region block caps what it holds in that region, whatever its
// limit over all regions: beyond it a job there is queued, saying so.
func TestARegionCapHoldsATenantsWorkThere(t *testing.T) {
	// vision: guaranteed 4, limit 8, and at most 2 GPUs in west.
	p := testbuild.Policy(t, strings.Replace(visionPolicy, "  limit = 8\n}", "  limit = 8\n  region \"west\" {\n    limit = 2\n  }\n}", 1))
	r, _, _ := twoRegions()
	job := func(id, region string, gpus int) admission.Job {
		return admission.Job{ID: id, Namespace: "vision", Where: admission.Where{Region: region}, Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: gpus}}}
	}
	d, res := r.Admit(p, job("w1", "west", 2))
	if d.Outcome != admission.Admit {
		t.Fatalf("2 GPUs in west, capped at 2: %s (%s)", d.Outcome, d.Reason)
	}
	defer res.Release()
	if d, _ := r.Admit(p, job("w2", "west", 1)); d.Outcome != admission.Queue ||
		d.Reason != `tenant "vision" would hold 3 of its limit of 2 GPUs in region west; queued until its own jobs there free GPUs` {
		t.Errorf("a third GPU in west: %s (%s)", d.Outcome, d.Reason)
	}
	if d, res := r.Admit(p, job("e1", "", 2)); d.Outcome != admission.Admit {
		t.Errorf("2 GPUs in east, no cap there: %s (%s)", d.Outcome, d.Reason)
	} else {
		res.Release()
	}
}

// A job the broker dispatched to a region is kept as Nomad returned it. Once
// the region is lost and the job requeued elsewhere, Lose drops it: its
// allocations end then, for the ledger. Its tenant holds nothing there but
// against its limit (the job may run there still) until the region is
// listed again.
func TestALostRegionsJobIsDroppedAndItsAllocationsEndNow(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy) // vision: guaranteed 4, limit 8
	r, _, west := twoRegions()
	start := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	now := start.Add(time.Hour)
	west.SetClock(clock.Func(func() time.Time { return now }))
	d := admission.Decision{Outcome: admission.Admit, Tenant: "vision", Queue: "training", Priority: 60}
	job := admitted(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu").Meta(nomadjob.MetaDispatched, "west"), d)
	west.ObserveJob(job)
	west.ObserveAlloc(testbuild.Alloc("a1", "vision", "train", "w1", 10, "w1-0", "w1-1").Started(start).Build())
	if got := west.Dispatched(); len(got) != 1 || *got[0].ID != "train" {
		t.Fatalf("dispatched %v, want train", got)
	}
	if used := west.UsageWithout(p, "vision", "").Tenants["vision"].Used.Total(); used != 2 {
		t.Fatalf("vision holds %g in west before, want 2", used)
	}
	west.Lose("vision", "train")
	if used := west.UsageWithout(p, "vision", "").Tenants["vision"].Used.Total(); used != 0 || len(west.Dispatched()) != 0 {
		t.Errorf("after Lose: vision holds %g, dispatched %v; want nothing", used, west.Dispatched())
	}
	if ended := west.EndedAllocs(); len(ended) != 1 || ended[0].ID != "a1" || !ended[0].EndedAt.Equal(now) {
		t.Errorf("ended %+v, want a1 ended now (%s), charged up to then", ended, now)
	}
	seven := admission.Job{ID: "e-seven", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 7}}}
	if d, _ := r.Admit(p, seven); d.Outcome != admission.Queue ||
		!strings.Contains(d.Reason, `would hold 9 of its limit of 8 GPUs, counting 2 of its jobs' in regions the broker cannot reach`) {
		t.Errorf("7 GPUs in east while train may run in lost west: %s (%s), want queued", d.Outcome, d.Reason)
	}
	west.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("w1", testbuild.H100, 8, 0)}})
	west.reached()
	if d, res := r.Admit(p, seven); d.Outcome != admission.AdmitBorrowed {
		t.Errorf("7 GPUs in east once west is listed without train: %s (%s), want borrowed", d.Outcome, d.Reason)
	} else {
		res.Release()
	}
}

// Only a reservation given up for good sets off a queue pass (Release).
// One the queue's pass withdraws itself, or a decision held back by a
// drained region, sets off none. Else each pass would wake the next, and
// the leader would pass in a loop while nothing changed.
func TestOnlyAReleaseSetsOffAPass(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	r, east, _ := twoRegions()
	r.SetDrained(map[string]string{"west": "by ops at 2026-12-04T10:00:00Z"})
	changed := r.Changed(t.Context())
	signalled := func() bool {
		select {
		case <-changed:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}
	for signalled() { // the nodes' and SetDrained's own, from each region
	}
	job := func(id, region string) admission.Job {
		return admission.Job{ID: id, Namespace: "vision", Where: admission.Where{Region: region}, Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}}
	}
	if d, _ := r.Admit(p, job("held", "west")); d.Outcome != admission.Queue || signalled() {
		t.Errorf("a job held back by drained west: %s, and a pass set off", d.Outcome)
	}
	_, res := r.Admit(p, job("waits", ""))
	gen := east.Generation()
	if res.Withdraw(); signalled() || east.Generation() != gen {
		t.Error("a withdrawn reservation set off a pass")
	}
	_, res = r.Admit(p, job("refused", ""))
	if res.Release(); !signalled() {
		t.Error("a released reservation set off no pass")
	}
}

// The regions' generation moves when any region's view changes, so that
// the leader's queue skips a pass while nothing it decides on changed.
func TestTheRegionsGenerationMovesWithAnyView(t *testing.T) {
	home, west := NewView(nil), NewView(nil)
	r := NewRegions("east", home, map[string]*View{"west": west})
	g := r.Generation()
	if r.Generation() != g {
		t.Fatalf("the generation moved with nothing changed")
	}
	west.ObserveNode(testbuild.Node("w1", testbuild.H100, 8, 0))
	if g2 := r.Generation(); g2 == g {
		t.Errorf("a change in west did not move the generation")
	} else if home.ObserveNode(testbuild.Node("e1", testbuild.H100, 8, 0)); r.Generation() == g2 {
		t.Errorf("a change at home did not move the generation")
	}
}
