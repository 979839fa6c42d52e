package reclaimer_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim/reclaimtest"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

type observer struct{ allocs []reclaim.Alloc }

func (o *observer) Observe(context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error) {
	gpus := map[string]reclaim.GPU{}
	for _, a := range o.allocs {
		for _, id := range a.GPUs {
			gpus[id] = reclaim.GPU{Utilization: 0, Healthy: true}
		}
	}
	return o.allocs, gpus, nil
}

type actor struct{ did []string }

func (a *actor) StopJob(_ context.Context, ns, job string) (string, error) {
	a.did = append(a.did, "stop job "+ns+"/"+job)
	return "evaluation e1", nil
}
func (a *actor) StopAlloc(_ context.Context, id string) (string, error) {
	a.did = append(a.did, "stop alloc "+id)
	return "evaluation e2", nil
}

const policySrc = `
queue "dev" { priority = 40 }
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  mode       = "enforce"
}
reclaim "idle-dev" {
  workload   = "dev"
  idle_below = 5
  idle_for   = "30m"
  action     = "stop"
  grace      = "5m"
  mode       = "enforce"
}
reclaim_settings {
  retention = "24h"
}
reclaim "watch" {
  max_lifetime = "1h"
  action       = "stop"
}
`

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func setup(t *testing.T, recs *reclaimtest.Mem, allocs ...reclaim.Alloc) (*reclaimer.Reclaimer, *actor, *time.Time) {
	now := t0
	ids := 0
	a := &actor{}
	return &reclaimer.Reclaimer{Log: hclog.NewNullLogger(), Records: recs, Observer: &observer{allocs}, Actor: a,
		Policies: testbuild.Fixed{P: testbuild.Policy(t, policySrc)}, Clock: clock.Func(func() time.Time { return now }),
		NewID: func() string { ids++; return fmt.Sprintf("00000000-0000-4000-8000-%012d", ids) }}, a, &now
}

func states(recs *reclaimtest.Mem) string {
	all, _ := recs.List(context.Background())
	var out []string
	for _, r := range all {
		out = append(out, r.Rule+":"+string(r.State))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func TestAnUnadmittedJobIsRecordedThenStoppedOnce(t *testing.T) {
	recs := reclaimtest.NewMem()
	bypass := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "direct", StartedAt: t0, GPUs: []string{"g0"}}
	r, act, _ := setup(t, recs, bypass)
	if err := r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(act.did) != "[stop job vision/direct]" || states(recs) != "unadmitted:executed" {
		t.Fatalf("actions %v, records %s", act.did, states(recs))
	}
	all, _ := recs.List(context.Background())
	if rec := all[0]; rec.Result != "evaluation e1" || rec.ActingSince.IsZero() || rec.ExecutedAt.IsZero() || rec.Evidence != "a1: no valid admission stamp" {
		t.Errorf("record %+v", rec)
	}
	// Still running in the next pass (Nomad is slow): nothing new.
	r.Pass(context.Background())
	if all, _ = recs.List(context.Background()); len(act.did) != 1 || len(all) != 1 {
		t.Errorf("acted or recorded again: %v", act.did)
	}
}

func TestGraceCancelDryRunAndRetention(t *testing.T) {
	recs := reclaimtest.NewMem()
	notebook := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "nb", Admitted: true, Workload: "dev", StartedAt: t0, GPUs: []string{"g0"}}
	r, act, now := setup(t, recs, notebook)
	r.Pass(context.Background())
	*now = t0.Add(31 * time.Minute) // idle 30m: decided, grace 5m; watch (dry-run) past 1h? not yet
	r.Pass(context.Background())
	if states(recs) != "idle-dev:proposed" || len(act.did) != 0 {
		t.Fatalf("records %s, actions %v", states(recs), act.did)
	}
	// Cancelled during its grace: never carried out.
	all, _ := recs.List(context.Background())
	cancelled := all[0]
	cancelled.State = reclaim.Cancelled
	if ok, _ := recs.Update(context.Background(), cancelled); !ok {
		t.Fatal("cancel lost")
	}
	*now = t0.Add(2 * time.Hour)
	r.Pass(context.Background())
	if len(act.did) != 0 || states(recs) != "idle-dev:cancelled watch:dry-run" {
		t.Fatalf("records %s, actions %v", states(recs), act.did)
	}
	// Past retention, finished records go.
	*now = t0.Add(3 * 24 * time.Hour)
	r.Observer = &observer{}
	r.Pass(context.Background())
	if states(recs) != "" {
		t.Errorf("kept past retention: %s", states(recs))
	}
}

func TestTheNextLeaderFinishesAClaimedDecisionAndRaisesNothingTwice(t *testing.T) {
	recs := reclaimtest.NewMem()
	notebook := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "nb", Admitted: true, Workload: "dev", StartedAt: t0, GPUs: []string{"g0"}}
	first, act, now := setup(t, recs, notebook)
	first.Pass(context.Background())
	*now = t0.Add(30 * time.Minute)
	first.Pass(context.Background())
	// The first leader claimed it and died before acting.
	all, _ := recs.List(context.Background())
	claimed := all[0]
	claimed.ActingSince = t0.Add(35 * time.Minute)
	recs.Update(context.Background(), claimed)

	next, nextAct, nextNow := setup(t, recs, notebook)
	*nextNow = t0.Add(36 * time.Minute)
	next.Pass(context.Background())
	if len(act.did) != 0 || fmt.Sprint(nextAct.did) != "[stop job vision/nb]" || states(recs) != "idle-dev:executed" {
		t.Errorf("first %v, next %v, records %s", act.did, nextAct.did, states(recs))
	}
}

func TestRunWaitsThePolicysPeriodJittered(t *testing.T) {
	recs := reclaimtest.NewMem()
	r, _, _ := setup(t, recs)
	ctx, cancel := context.WithCancel(context.Background())
	var waits []time.Duration
	r.Clock = waitClock(func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		if len(waits) == 3 {
			cancel()
			return nil // never: Run must end on ctx
		}
		c := make(chan time.Time, 1)
		c <- t0
		return c
	})
	r.Run(ctx)
	for _, d := range waits {
		if d > 30*time.Second || d < 27*time.Second {
			t.Errorf("waited %s, want the default 30s less up to a tenth", d)
		}
	}
	if len(waits) != 3 {
		t.Errorf("%d waits", len(waits))
	}
}

type requeuer struct{ did []string }

func (q *requeuer) Requeue(_ context.Context, rec reclaim.Record) (string, error) {
	q.did = append(q.did, rec.Namespace+"/"+rec.Job)
	return "requeued as " + rec.ID, nil
}

func TestAPreemptedBorrowedJobGoesBackToTheQueue(t *testing.T) {
	recs := reclaimtest.NewMem()
	preempted := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "borrower", Admitted: true, Borrowed: true, Preempted: true,
		StartedAt: t0, GPUs: []string{"g0"}}
	r, act, _ := setup(t, recs, preempted)
	q := &requeuer{}
	r.Requeue = q
	r.Pass(context.Background())
	all, _ := recs.List(context.Background())
	if fmt.Sprint(q.did) != "[vision/borrower]" || len(act.did) != 0 || len(all) != 1 || all[0].Rule != "preempted-borrowed" ||
		all[0].State != reclaim.Executed || all[0].Result != "requeued as "+all[0].ID {
		t.Errorf("requeued %v, actions %v, records %+v", q.did, act.did, all)
	}
}

type queued []queue.Entry

func (q queued) List(context.Context) ([]queue.Entry, error) { return q, nil }

// The queue's waiting jobs reach make-room, oldest first; parked ones and
// those being registered wait for nothing it could give them.
func TestMakeRoomRequeuesForAWaitingJobOnly(t *testing.T) {
	recs := reclaimtest.NewMem()
	running := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "notebook", Admitted: true, Tenant: "vision", Queue: "dev",
		StartedAt: t0, GPUs: []string{"g0"}}
	r, _, _ := setup(t, recs, running)
	r.Policies = testbuild.Fixed{P: testbuild.Policy(t, `
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 1
}
make_room_grace = "0s"
`)}
	q := &requeuer{}
	r.Requeue = q
	entry := func(id string, edit func(*queue.Entry)) queue.Entry {
		e := queue.Entry{ID: id, JobID: id, Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1, SubmittedAt: t0}
		edit(&e)
		return e
	}
	r.Queued = queued{
		entry("parked", func(e *queue.Entry) { e.Parked = "refused" }),
		entry("claimed", func(e *queue.Entry) { e.Admitting = t0 }),
	}
	if err := r.Pass(context.Background()); err != nil || len(q.did) != 0 {
		t.Fatalf("for a parked or claimed job: requeued %v (%v)", q.did, err)
	}
	r.Queued = append(r.Queued.(queued), entry("train", func(*queue.Entry) {}))
	if err := r.Pass(context.Background()); err != nil || fmt.Sprint(q.did) != "[vision/notebook]" {
		t.Fatalf("requeued %v (%v)", q.did, err)
	}
	all, _ := recs.List(context.Background())
	if len(all) != 1 || all[0].Rule != "make-room" || all[0].State != reclaim.Executed || !strings.Contains(all[0].Evidence, "vision/train (queue training, 1 GPUs)") {
		t.Errorf("records %+v", all)
	}
}

// waitClock is a clock at t0 whose waits the test answers.
type waitClock func(time.Duration) <-chan time.Time

func (waitClock) Now() time.Time                           { return t0 }
func (w waitClock) After(d time.Duration) <-chan time.Time { return w(d) }

// regionalActor is another region's actor, as the reclaimer reaches it.
type regionalActor struct{ actor }

func (*regionalActor) Job(context.Context, string, string) (*api.Job, error) { return nil, nil }

// The rules see every region the broker governs: a decision on another
// region's allocation is recorded with its region and carried out there,
// by that region's actor; the watchers see the broker's own region only.
func TestADecisionOnAnotherRegionsJobIsCarriedOutThere(t *testing.T) {
	recs := reclaimtest.NewMem()
	home := reclaim.Alloc{ID: "a1", Namespace: "vision", JobID: "direct", StartedAt: t0, GPUs: []string{"g0"}}
	r, act, _ := setup(t, recs, home)
	west := &regionalActor{}
	r.Elsewhere = &reclaimer.Elsewhere{Log: hclog.NewNullLogger(),
		Observers: map[string]reclaimer.RegionObserver{"west": &regionObserver{allocs: []reclaim.Alloc{
			{ID: "w1", Namespace: "vision", JobID: "direct", StartedAt: t0, GPUs: []string{"w0"}}}}},
		In: func(region string) reclaimer.RegionalActor {
			if region != "west" {
				t.Errorf("acted in region %q", region)
			}
			return west
		}}
	var watched, sampled []string
	r.Watchers = []reclaimer.Watcher{watcher(func(allocs []reclaim.Alloc) {
		for _, a := range allocs {
			watched = append(watched, a.ID)
		}
	}), everyRegionWatcher{func(allocs []reclaim.Alloc) {
		for _, a := range allocs {
			sampled = append(sampled, a.ID+"@"+a.Region)
		}
	}}}
	if err := r.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(act.did) != "[stop job vision/direct]" || fmt.Sprint(west.did) != "[stop job vision/direct]" {
		t.Errorf("the broker's own region did %v, west %v; want the job of the same name stopped in each", act.did, west.did)
	}
	all, _ := recs.List(context.Background())
	regions := []string{}
	for _, rec := range all {
		regions = append(regions, rec.Region)
	}
	sort.Strings(regions)
	if fmt.Sprint(regions) != "[ west]" {
		t.Errorf("decisions in regions %q, want one in the broker's own and one in west", regions)
	}
	if fmt.Sprint(watched) != "[a1]" || fmt.Sprint(sampled) != "[a1@ w1@west]" {
		t.Errorf("the watchers saw %v, and one of every region (right-sizing) %v; want the broker's own region's a1 alone, and both", watched, sampled)
	}
}

// watcher is a Watcher of the allocations each pass shows it.
type watcher func([]reclaim.Alloc)

func (w watcher) Observed(_ context.Context, _ time.Time, allocs []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	w(allocs)
	return nil
}

// everyRegionWatcher is a watcher of every region's allocations, as
// right-sizing is.
type everyRegionWatcher struct{ watcher }

func (everyRegionWatcher) EveryRegion() {}
