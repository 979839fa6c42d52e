package reclaim_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// examplePolicy is the example policy set, with issue 7's reclaim rules.
func examplePolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, diags := policyhcl.LoadDir("../../policies", 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	return p
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// dev is an admitted dev allocation of job j started at t0 on gpus.
func dev(id, job string, gpus ...string) reclaim.Alloc {
	return reclaim.Alloc{ID: id, Namespace: "vision", JobID: job, Group: "g", Admitted: true, Tenant: "vision",
		Queue: "dev", Workload: "dev", StartedAt: t0, GPUs: gpus}
}

// utilization gives every GPU of ids the same utilisation, healthy.
func utilization(pct float64, ids ...string) map[string]reclaim.GPU {
	out := map[string]reclaim.GPU{}
	for _, id := range ids {
		out[id] = reclaim.GPU{Utilization: pct, Healthy: true}
	}
	return out
}

// only keeps the rules named.
func only(p *policy.Policy, names ...string) []*policy.ReclaimRule {
	var out []*policy.ReclaimRule
	for _, n := range names {
		out = append(out, p.Reclaim[n])
	}
	return out
}

func summary(ds []reclaim.Decision) string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s %s %s/%s %v whole=%t gpus=%d", d.Rule, d.Action, d.Namespace, d.JobID, d.Allocs, d.WholeJob, d.GPUs))
	}
	return strings.Join(out, "; ")
}

func TestIdleIsTheMinimumNotTheAverage(t *testing.T) {
	p := examplePolicy(t)
	e := reclaim.New()
	a := dev("a1", "notebook", "g0", "g1")
	idle := utilization(0, "g0", "g1")
	pass := func(at time.Duration, gpus map[string]reclaim.GPU) []reclaim.Decision {
		return e.Pass(t0.Add(at), only(p, "idle-dev"), []reclaim.Alloc{a}, gpus)
	}
	if ds := pass(0, idle); len(ds) != 0 {
		t.Fatalf("decided at once: %s", summary(ds))
	}
	if ds := pass(29*time.Minute, idle); len(ds) != 0 {
		t.Fatalf("decided before idle_for: %s", summary(ds))
	}
	ds := pass(30*time.Minute, idle)
	if summary(ds) != "idle-dev stop vision/notebook [a1] whole=true gpus=2" || !ds[0].ActAfter.Equal(t0.Add(35*time.Minute)) ||
		ds[0].Mode != policy.ModeEnforce || !strings.Contains(ds[0].Evidence, "every GPU below 5% since 2026-11-30T12:00:00Z (30m0s)") {
		t.Fatalf("want one decision acting after the 5m grace, got %s %+v", summary(ds), ds)
	}
	if ds := pass(31*time.Minute, idle); len(ds) != 0 {
		t.Errorf("the same condition raised again: %s", summary(ds))
	}
	// One busy sample on one GPU resets the clock and clears the condition.
	busy := utilization(0, "g0")
	busy["g1"] = reclaim.GPU{Utilization: 60, Healthy: true}
	pass(32*time.Minute, busy)
	if ds := pass(33*time.Minute, idle); len(ds) != 0 {
		t.Errorf("idle right after a busy sample: %s", summary(ds))
	}
	if ds := pass(62*time.Minute, idle); len(ds) != 0 {
		t.Errorf("decided before idle_for counted from the busy sample: %s", summary(ds))
	}
	if ds := pass(63*time.Minute, idle); len(ds) != 1 {
		t.Errorf("a condition that cleared and recurred raises a new decision, got %s", summary(ds))
	}
	// A GPU with no sample is not idle.
	e2 := reclaim.New()
	for _, at := range []time.Duration{0, time.Hour} {
		if ds := e2.Pass(t0.Add(at), only(p, "idle-dev"), []reclaim.Alloc{a}, utilization(0, "g0")); len(ds) != 0 {
			t.Errorf("idle without samples of g1: %s", summary(ds))
		}
	}
}

func TestLifetimeAndTheJobsOwnTTL(t *testing.T) {
	p := examplePolicy(t)
	cases := []struct {
		ttl       time.Duration
		age       time.Duration
		decidesAt bool
	}{
		{0, 8*time.Hour - time.Second, false},
		{0, 8 * time.Hour, true},
		{2 * time.Hour, 2 * time.Hour, true},   // shorter: always allowed
		{10 * time.Hour, 9 * time.Hour, false}, // longer: within max_extend
		{20 * time.Hour, 12 * time.Hour, true}, // beyond max_extend: capped at 8h + 4h
		{20 * time.Hour, 12*time.Hour - 1, false},
	}
	for _, c := range cases {
		a := dev("a1", "notebook", "g0")
		a.TTL = c.ttl
		ds := reclaim.New().Pass(t0.Add(c.age), only(p, "dev-ttl"), []reclaim.Alloc{a}, utilization(90, "g0"))
		if (len(ds) == 1) != c.decidesAt {
			t.Errorf("ttl %s at age %s: %s", c.ttl, c.age, summary(ds))
		}
	}
	pending := dev("a1", "notebook", "g0")
	pending.StartedAt = time.Time{} // not started yet: no age
	if ds := reclaim.New().Pass(t0, only(p, "dev-ttl"), []reclaim.Alloc{pending}, utilization(90, "g0")); len(ds) != 0 {
		t.Errorf("an allocation that never started expired: %s", summary(ds))
	}
}

func TestSickGPUReschedulesOnlyItsAllocation(t *testing.T) {
	p := examplePolicy(t)
	e := reclaim.New()
	allocs := []reclaim.Alloc{dev("a1", "train", "g0"), dev("a2", "train", "g1")}
	gpus := utilization(90, "g0", "g1")
	gpus["g1"] = reclaim.GPU{Utilization: 0, Healthy: false}
	e.Pass(t0, only(p, "sick-gpu"), allocs, gpus)
	if ds := e.Pass(t0.Add(time.Minute), only(p, "sick-gpu"), allocs, gpus); len(ds) != 0 {
		t.Fatalf("decided before device_unhealthy_for: %s", summary(ds))
	}
	ds := e.Pass(t0.Add(2*time.Minute), only(p, "sick-gpu"), allocs, gpus)
	if summary(ds) != "sick-gpu reschedule vision/train [a2] whole=false gpus=1" || !strings.Contains(ds[0].Evidence, "g1 unhealthy since") {
		t.Errorf("got %s", summary(ds))
	}
}

func TestCrashLoopCountsRestartsWithinTheWindow(t *testing.T) {
	p := examplePolicy(t)
	now := t0.Add(time.Hour)
	for _, c := range []struct {
		restarts []time.Duration // ago
		decides  bool
	}{
		{[]time.Duration{1, 2, 3, 4, 5}, false},
		{[]time.Duration{1, 2, 3, 4, 5, 6}, true},
		{[]time.Duration{1, 2, 3, 4, 5, 31}, false}, // the sixth is outside within
	} {
		a := dev("a1", "train", "g0")
		for _, m := range c.restarts {
			a.Restarts = append(a.Restarts, now.Add(-m*time.Minute))
		}
		ds := reclaim.New().Pass(now, only(p, "crash-loop"), []reclaim.Alloc{a}, utilization(0, "g0"))
		if (len(ds) == 1) != c.decides {
			t.Errorf("restarts %v minutes ago: %s", c.restarts, summary(ds))
		}
	}
}

func TestUnadmittedAndSelectors(t *testing.T) {
	p := examplePolicy(t)
	bypass := reclaim.Alloc{ID: "b1", Namespace: "vision", JobID: "direct", StartedAt: t0.Add(-24 * time.Hour), GPUs: []string{"g0"}}
	admitted := dev("a1", "notebook", "g1")
	training := dev("t1", "train", "g2")
	training.Queue, training.Workload = "training", "training"
	training.StartedAt = t0.Add(-24 * time.Hour)
	admitted.StartedAt = t0.Add(-24 * time.Hour)
	ds := reclaim.New().Pass(t0, only(p, "unadmitted", "dev-ttl"), []reclaim.Alloc{bypass, admitted, training}, utilization(0, "g0", "g1", "g2"))
	// dev-ttl selects workload dev: the admitted dev job, not training, and
	// not the unadmitted job (its meta is not the broker's).
	want := "unadmitted stop vision/direct [b1] whole=true gpus=1; dev-ttl stop vision/notebook [a1] whole=true gpus=1"
	if summary(ds) != want {
		t.Errorf("got  %s\nwant %s", summary(ds), want)
	}
	// A job using GPUs it does not ask for holds none, and is unadmitted.
	sneaky := reclaim.Alloc{ID: "s1", Namespace: "vision", JobID: "sneaky", Undeclared: `task "t" of group "g" sets NVIDIA_VISIBLE_DEVICES`}
	ds = reclaim.New().Pass(t0, only(p, "unadmitted"), []reclaim.Alloc{sneaky}, nil)
	if summary(ds) != "unadmitted stop vision/sneaky [s1] whole=true gpus=0" || ds[0].Evidence != `s1: uses GPUs without asking for them: task "t" of group "g" sets NVIDIA_VISIBLE_DEVICES` {
		t.Errorf("undeclared GPU access: %s (%+v)", summary(ds), ds)
	}
}

func TestARuleMatchingSomeAllocationsOfAJobStopsThoseOnly(t *testing.T) {
	p := examplePolicy(t)
	e := reclaim.New()
	allocs := []reclaim.Alloc{dev("a1", "notebook", "g0"), dev("a2", "notebook", "g1")}
	gpus := utilization(0, "g0", "g1")
	gpus["g1"] = reclaim.GPU{Utilization: 80, Healthy: true}
	e.Pass(t0, only(p, "idle-dev"), allocs, gpus)
	if ds := e.Pass(t0.Add(30*time.Minute), only(p, "idle-dev"), allocs, gpus); summary(ds) != "idle-dev stop vision/notebook [a1] whole=false gpus=1" {
		t.Errorf("got %s", summary(ds))
	}
}

func TestAPreemptedBorrowedJobIsRequeuedWithoutARule(t *testing.T) {
	p := examplePolicy(t)
	borrowed := dev("a1", "borrower", "g0")
	borrowed.Borrowed, borrowed.Preempted = true, true
	owned := dev("a2", "owner", "g1")
	owned.Preempted = true // preempted, but not borrowing: Nomad's own business
	bypass := reclaim.Alloc{ID: "a3", Namespace: "vision", JobID: "direct", Preempted: true, Borrowed: true, GPUs: []string{"g2"}}
	ds := reclaim.New().Pass(t0, only(p, "idle-dev", "unadmitted"), []reclaim.Alloc{borrowed, owned, bypass}, utilization(0, "g0", "g1", "g2"))
	// No other rule looks at preempted allocations (they hold no GPUs), and an
	// unverified borrowed flag is not trusted.
	if got := summary(ds); got != "preempted-borrowed requeue vision/borrower [a1] whole=true gpus=1" {
		t.Errorf("got %s", got)
	}
}

func TestEndsIsTheFirstEnforcedLifetime(t *testing.T) {
	p := testbuild.Policy(t, `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
}
reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "8h"
  max_extend   = "4h"
  action       = "stop"
  grace        = "1m"
  mode         = "enforce"
}
reclaim "watch" {
  max_lifetime = "1h"
  action       = "notify"
}
`)
	a := reclaim.Alloc{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", Workload: "dev",
		StartedAt: t0, GPUs: []string{"g0"}}
	if end, ok := reclaim.Ends(p.ReclaimRules(), a); !ok || !end.Equal(t0.Add(8*time.Hour+time.Minute)) {
		t.Errorf("max_lifetime: %v %t", end, ok)
	}
	a.TTL = 2 * time.Hour
	if end, _ := reclaim.Ends(p.ReclaimRules(), a); !end.Equal(t0.Add(2*time.Hour + time.Minute)) {
		t.Errorf("its own ttl: %v", end)
	}
	a.Workload = "training" // only the dry-run rule selects it: no end known
	if _, ok := reclaim.Ends(p.ReclaimRules(), a); ok {
		t.Error("an end from a dry-run rule")
	}
}

// A limit lowered below what a tenant holds: after over_limit_grace, its
// newest work is requeued, borrowed first, until it is within the limit,
// once; approvals in force count as limit; over_limit = "wait" waits.
func TestATenantOverItsLimitHasItsNewestBorrowedWorkRequeued(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 2
  limit      = 3
}
over_limit_grace = "5m"
`)
	job := func(id, queue string, borrowed bool, started time.Time, gpus ...string) reclaim.Alloc {
		return reclaim.Alloc{ID: id + "-a", Namespace: "vision", JobID: id, Admitted: true, Tenant: "vision", Queue: queue,
			Borrowed: borrowed, StartedAt: started, GPUs: gpus}
	}
	allocs := []reclaim.Alloc{
		job("old-train", "training", false, t0, "g1", "g2"),
		job("new-train", "training", false, t0.Add(time.Hour), "g3"),
		job("dev", "dev", false, t0.Add(time.Minute), "g4"),
		job("borrowed", "training", true, t0, "g5"),
	}
	gpus := utilization(50, "g1", "g2", "g3", "g4", "g5")
	e := reclaim.New()
	now := t0.Add(2 * time.Hour)
	if got := e.OverLimit(now, p, allocs, gpus, nil, ""); len(got) != 0 {
		t.Fatalf("within the grace: %+v", got)
	}
	got := e.OverLimit(now.Add(5*time.Minute), p, allocs, gpus, nil, "")
	var jobs []string
	for _, d := range got {
		jobs = append(jobs, d.JobID)
		if d.Rule != "over-limit" || d.Action != policy.ActionRequeue || !d.WholeJob ||
			!strings.Contains(d.Evidence, `tenant "vision" holds 5 GPUs, above its limit of 3`) {
			t.Errorf("decision %+v", d)
		}
	}
	// 5 held, limit 3: the borrowed job (1), then the lowest band (dev, 1).
	if fmt.Sprint(jobs) != "[borrowed dev]" {
		t.Errorf("requeued %v, want [borrowed dev]", jobs)
	}
	if again := e.OverLimit(now.Add(6*time.Minute), p, allocs, gpus, nil, ""); len(again) != 0 {
		t.Errorf("decided twice: %+v", again)
	}
	if got := reclaim.New().OverLimit(now, p, allocs, gpus, map[string]float64{"vision": 2}, ""); len(got) != 0 {
		t.Errorf("with 2 GPUs granted by approval: %+v", got)
	}
	p.OverLimit = policy.OverWait
	w := reclaim.New()
	w.OverLimit(now, p, allocs, gpus, nil, "")
	if got := w.OverLimit(now.Add(time.Hour), p, allocs, gpus, nil, ""); len(got) != 0 {
		t.Errorf("over_limit = wait: %+v", got)
	}
}

// Work no decision covers (unadmitted, in a tenant's namespace) that puts
// the tenant over its limit goes at once, newest first, before any admitted
// work, which still waits out the grace. Under the limit it is left to the
// unadmitted rule.
func TestWorkNobodyAdmittedOverALimitIsRequeuedAtOnce(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 3
}
over_limit_grace = "5m"
`)
	admitted := reclaim.Alloc{ID: "a", Namespace: "vision", JobID: "a", Admitted: true, Tenant: "vision", Queue: "training", StartedAt: t0, GPUs: []string{"g1", "g2"}}
	old := reclaim.Alloc{ID: "o", Namespace: "vision", JobID: "old", StartedAt: t0, GPUs: []string{"g3"}}
	revived := reclaim.Alloc{ID: "r", Namespace: "vision", JobID: "revived", StartedAt: t0.Add(time.Minute), GPUs: []string{"g4", "g5"}}
	other := reclaim.Alloc{ID: "x", Namespace: "default", JobID: "x", StartedAt: t0, GPUs: []string{"g6"}}
	gpus := utilization(50, "g1", "g2", "g3", "g4", "g5", "g6")
	e := reclaim.New()
	if got := e.OverLimit(t0.Add(time.Hour), p, []reclaim.Alloc{admitted, old, other}, gpus, nil, ""); len(got) != 0 {
		t.Errorf("3 held of a limit of 3, one unadmitted: %+v", got)
	}
	got := e.OverLimit(t0.Add(time.Hour), p, []reclaim.Alloc{admitted, old, revived, other}, gpus, nil, "")
	if len(got) != 1 || got[0].JobID != "revived" || got[0].Action != policy.ActionRequeue || !got[0].ActAfter.Equal(t0.Add(time.Hour)) ||
		!strings.Contains(got[0].Evidence, `tenant "vision" holds 5 GPUs, above its limit of 3, with work no decision of the broker's covers`) {
		t.Errorf("5 held of 3, 3 unadmitted: want the newest unadmitted job requeued at once; got %+v", got)
	}
}

// A region's cap is a limit too: admitted work above it goes after the
// grace, in that region only; work nobody admitted above it at once.
func TestATenantOverARegionCapHasItsWorkThereRequeued(t *testing.T) {
	capIn := func(region string) *policy.Policy {
		return testbuild.Policy(t, fmt.Sprintf(`
queue "training" { priority = 60 }
tenant "dub" {
  namespaces = ["dub"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 4
  region %q {
    limit = 1
  }
}
over_limit_grace = "5m"
`, region))
	}
	p := capIn("west")
	alloc := func(id, region string, admitted bool, started time.Duration, gpu string) reclaim.Alloc {
		a := reclaim.Alloc{ID: id, Namespace: "dub", JobID: id, Region: region, StartedAt: t0.Add(started), GPUs: []string{gpu}}
		if admitted {
			a.Admitted, a.Tenant, a.Queue = true, "dub", "training"
		}
		return a
	}
	gpus := utilization(50, "e1", "w1", "w2", "w3")
	allocs := []reclaim.Alloc{alloc("home", "", true, 0, "e1"), alloc("w-old", "west", true, 0, "w1"), alloc("w-new", "west", true, time.Minute, "w2")}
	e := reclaim.New()
	if got := e.OverLimit(t0.Add(time.Hour), p, allocs, gpus, nil, "east"); len(got) != 0 {
		t.Fatalf("2 in west, cap 1, within the grace: %+v", got)
	}
	got := e.OverLimit(t0.Add(time.Hour+5*time.Minute), p, allocs, gpus, nil, "east")
	if len(got) != 1 || got[0].JobID != "w-new" || got[0].Region != "west" || !strings.Contains(got[0].Evidence, `above its cap of 1 in region west`) {
		t.Errorf("after the grace: want west's newest requeued; got %+v", got)
	}
	// The home region named by its cap: the broker's own allocations count.
	if got := reclaim.New().OverLimit(t0, capIn("east"), append(allocs, alloc("sneak", "", false, 2*time.Minute, "w3")), gpus, nil, "east"); len(got) != 1 || got[0].JobID != "sneak" {
		t.Errorf("an unadmitted job in the home region over its cap of 1: want it requeued at once; got %+v", got)
	}
}

// A tenant at its guarantee whose inference job waits: after
// make_room_grace, as much of its own lower-band work as the job needs is
// requeued (borrowed, then the lowest band, then the newest), once. Never
// another tenant's work nor its own of the job's band. make_room = "wait"
// waits, and a job its tenant's lower work cannot make room for waits.
func TestMakeRoomRequeuesTheTenantsOwnLowerWork(t *testing.T) {
	p := testbuild.Policy(t, `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["inference", "training", "dev"]
  guaranteed = 4
  limit      = 6
}
tenant "search" {
  namespaces = ["search"]
  queues     = ["dev"]
  guaranteed = 2
  limit      = 2
}
make_room_grace = "1m"
`)
	job := func(ns, id, queue string, borrowed bool, started time.Time, gpus ...string) reclaim.Alloc {
		return reclaim.Alloc{ID: id + "-a", Namespace: ns, JobID: id, Admitted: true, Tenant: ns, Queue: queue,
			Borrowed: borrowed, StartedAt: started, GPUs: gpus}
	}
	allocs := []reclaim.Alloc{
		job("vision", "train", "training", false, t0, "g1"),
		job("vision", "old-dev", "dev", false, t0, "g2"),
		job("vision", "new-dev", "dev", false, t0.Add(time.Hour), "g3"),
		job("vision", "infer", "inference", false, t0, "g4"),
		job("vision", "lent", "dev", true, t0.Add(time.Minute), "g5"),
		job("search", "theirs", "dev", false, t0.Add(2*time.Hour), "g6", "g7"),
	}
	gpus := utilization(50, "g1", "g2", "g3", "g4", "g5", "g6", "g7")
	waiting := []reclaim.Waiting{
		{Namespace: "vision", JobID: "late-dev", Tenant: "vision", Queue: "dev", GPUs: 1},
		{Namespace: "vision", JobID: "serve", Tenant: "vision", Queue: "inference", GPUs: 2},
	}
	now := t0.Add(3 * time.Hour)
	e := reclaim.New()
	if got := e.MakeRoom(now, p, allocs, gpus, waiting); len(got) != 0 {
		t.Fatalf("within the grace: %s", summary(got))
	}
	got := e.MakeRoom(now.Add(time.Minute), p, allocs, gpus, waiting)
	// 5 held of 4 guaranteed, serve needs 2: the borrowed dev job, then
	// the newest dev job, then the older one (5 - 3 + 2 = 4).
	if summary(got) != "make-room requeue vision/lent [lent-a] whole=true gpus=1; make-room requeue vision/new-dev [new-dev-a] whole=true gpus=1; "+
		"make-room requeue vision/old-dev [old-dev-a] whole=true gpus=1" {
		t.Errorf("got %s", summary(got))
	}
	for _, d := range got {
		if !strings.Contains(d.Evidence, `tenant "vision"'s job vision/serve (queue inference, 2 GPUs) has waited since 2026-11-30T15:00:00Z with 5 of its guarantee of 4 GPUs held`) {
			t.Errorf("evidence %q", d.Evidence)
		}
	}
	if again := e.MakeRoom(now.Add(2*time.Minute), p, allocs, gpus, waiting); len(again) != 0 {
		t.Errorf("decided twice: %s", summary(again))
	}

	// A training job of 4: dev work (3) would not make room; training's own is not taken.
	if got := reclaim.New().MakeRoom(now, p, allocs, gpus, []reclaim.Waiting{{Namespace: "vision", JobID: "big", Tenant: "vision", Queue: "training", GPUs: 4}}); len(got) != 0 {
		t.Errorf("no room to make: %s", summary(got))
	}
	w := reclaim.New()
	for _, at := range []time.Duration{0, time.Hour} {
		if got := w.MakeRoom(now.Add(at), p, allocs, gpus, []reclaim.Waiting{{Namespace: "search", JobID: "s", Tenant: "search", Queue: "dev", GPUs: 1}}); len(got) != 0 {
			t.Errorf("search's dev job took its own dev work or another tenant's: %s", summary(got))
		}
	}
	p.MakeRoom = policy.OverWait
	w = reclaim.New()
	w.MakeRoom(now, p, allocs, gpus, waiting)
	if got := w.MakeRoom(now.Add(time.Hour), p, allocs, gpus, waiting); len(got) != 0 {
		t.Errorf("make_room = wait: %s", summary(got))
	}
}

// Work an over-limit decision is about counts as gone for make-room, and
// the other way round.
func TestOverLimitAndMakeRoomDoNotTakeTheSameWorkTwice(t *testing.T) {
	p := testbuild.Policy(t, `
queue "inference" { priority = 80 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["inference", "dev"]
  guaranteed = 2
  limit      = 2
}
over_limit_grace = "0s"
make_room_grace  = "0s"
`)
	dev := func(id string, started time.Duration, gpu string) reclaim.Alloc {
		return reclaim.Alloc{ID: id, Namespace: "vision", JobID: id, Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0.Add(started), GPUs: []string{gpu}}
	}
	allocs := []reclaim.Alloc{dev("d1", 0, "g1"), dev("d2", time.Minute, "g2"), dev("d3", 2*time.Minute, "g3")}
	gpus := utilization(50, "g1", "g2", "g3")
	e := reclaim.New()
	over := e.OverLimit(t0, p, allocs, gpus, nil, "")
	room := e.MakeRoom(t0, p, allocs, gpus, []reclaim.Waiting{{Namespace: "vision", JobID: "serve", Tenant: "vision", Queue: "inference", GPUs: 1}})
	// 3 held, limit 2: d3 goes over the limit; serve then needs d2's GPU.
	if summary(over) != "over-limit requeue vision/d3 [d3] whole=true gpus=1" || summary(room) != "make-room requeue vision/d2 [d2] whole=true gpus=1" {
		t.Errorf("over limit: %s\nmake room: %s", summary(over), summary(room))
	}
	e.Retract(room[0])
	if again := e.MakeRoom(t0, p, allocs, gpus, []reclaim.Waiting{{Namespace: "vision", JobID: "serve", Tenant: "vision", Queue: "inference", GPUs: 1}}); summary(again) != summary(room) {
		t.Errorf("after a retract: %s", summary(again))
	}
}
