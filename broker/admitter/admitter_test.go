package admitter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/admitter"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// nomad records registrations; fail makes the next one fail.
type nomad struct {
	registered []string
	priorities map[string]float64
	fail       bool
	down       error  // every registration fails with it while set
	lost       bool   // Nomad takes each registration, and the answer is lost
	flaky      string // a job id whose registrations Nomad answers 500
	// While set, flaky's registration fails only once another has begun,
	// which then waits for that failure.
	begun, slow chan struct{}
	mu          sync.Mutex
	bodies      map[string]string
	plans       int    // Registered calls
	refuse      string // a job id Nomad refuses
	tokens      map[string]policy.Grants
	stable      map[string]*api.Job // latest stable versions, by job id
	revoked     bool                // Nomad refuses the broker's own token
}

type revoked struct{}

func (revoked) Error() string      { return "Nomad answered 403: ACL token not found" }
func (revoked) TokenRefused() bool { return true }

type refused struct{}

func (refused) Error() string { return "Nomad answered 400: task group g: invalid" }
func (refused) Refused() bool { return true }

func (n *nomad) Job(context.Context, string, string) (*api.Job, error) { return nil, nil }

func (n *nomad) Registered(_ context.Context, _, id string, body []byte) (uint64, bool, error) {
	n.mu.Lock() // a test switches down while registrations are under way
	defer n.mu.Unlock()
	n.plans++
	if n.down != nil {
		return 0, false, n.down
	}
	var had, now any // compared as Nomad's plan compares: by value
	json.Unmarshal([]byte(n.bodies[id]), &had)
	json.Unmarshal(body, &now)
	return uint64(len(n.registered)), had != nil && reflect.DeepEqual(had, now), nil
}

// unanswered is Nomad's answer 500 or 429.
type unanswered struct{ status int }

func (u unanswered) Error() string   { return fmt.Sprintf("register job: Nomad answered %d", u.status) }
func (u unanswered) Refused() bool   { return false }
func (u unanswered) Throttled() bool { return u.status == 429 }

func (n *nomad) StableJob(_ context.Context, _, id string) (*api.Job, error) {
	return n.stable[id], nil
}

func (n *nomad) Grants(_ context.Context, accessor string) (policy.Grants, bool, error) {
	if n.revoked {
		return policy.Grants{}, false, revoked{}
	}
	g, ok := n.tokens[accessor]
	return g, ok, nil
}

func (n *nomad) Register(_ context.Context, ns string, body []byte) (uint64, error) {
	if n.revoked {
		return 0, revoked{}
	}
	if n.fail {
		n.fail = false
		return 0, errors.New("nomad unreachable")
	}
	var req struct{ Job map[string]any }
	json.Unmarshal(body, &req)
	id := req.Job["ID"].(string)
	n.mu.Lock()
	down := n.down
	n.mu.Unlock()
	if down != nil || id == n.flaky {
		if n.slow != nil {
			<-n.begun
			defer close(n.slow)
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		n.registered = append(n.registered, "failed")
		return 0, unanswered{500}
	}
	if n.slow != nil {
		close(n.begun)
		<-n.slow
		n.mu.Lock()
		defer n.mu.Unlock()
	}
	if id == n.refuse {
		return 0, refused{}
	}
	n.registered = append(n.registered, ns+"/"+id)
	n.priorities[id] = req.Job["Priority"].(float64)
	if n.bodies == nil {
		n.bodies = map[string]string{}
	}
	n.bodies[id] = string(body)
	if n.lost {
		return 0, errors.New("register job: connection reset by peer")
	}
	return uint64(len(n.registered)), nil
}

func entry(id string, gpus int, age time.Duration, now time.Time) queue.Entry {
	req := fmt.Sprintf(`{"Job":{"ID":%q,"Namespace":"vision","TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":%d}]}}]}]}}`, id, gpus)
	return queue.Entry{ID: "q-" + id, JobID: id, Namespace: "vision", Tenant: "vision", Queue: "training",
		Demand: float64(gpus), SubmittedAt: now.Add(-age), Request: json.RawMessage(req)}
}

func setup(t testing.TB, src string, capacity int) (*admitter.Admitter, *queuetest.Mem, *nomad, *cluster.View, time.Time) {
	p := testbuild.Policy(t, src)
	view := cluster.NewView(nil)
	view.ObserveNode(testbuild.Node("n", "H100", capacity, 0))
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	q := queuetest.NewMem()
	n := &nomad{priorities: map[string]float64{}, tokens: map[string]policy.Grants{}}
	a := &admitter.Admitter{Log: hclog.NewNullLogger(), Queue: q, Nomad: n, Cluster: view, Policies: testbuild.Fixed{P: p},
		Stamper: nomadjob.Stamper{Key: []byte("k")}, Clock: clock.Func(func() time.Time { return now })}
	return a, q, n, view, now
}

const visionPolicy = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues = ["training"]
  guaranteed = 4
  limit = 8
}
borrowing {
  enabled = true
  priority = 20
}`

func TestPassAdmitsInOrderWholeAndOnce(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	for _, e := range []queue.Entry{entry("old-2", 2, time.Hour, now), entry("new-2", 2, time.Minute, now),
		entry("big-6", 6, 30*time.Minute, now)} {
		q.Put(context.Background(), e)
	}
	// In age order: old-2 (within guarantee, 60), big-6 (would be 8: borrowed needs 6 idle, has 6) ...
	got, err := a.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 || fmt.Sprint(n.registered) != "[vision/old-2 vision/big-6]" {
		t.Fatalf("admitted %d: %v", got, n.registered)
	}
	if n.priorities["old-2"] != 60 || n.priorities["big-6"] != 20 {
		t.Errorf("priorities %v", n.priorities)
	}
	// new-2 would take vision to 10, above its limit of 8: it stays queued.
	if ids := q.IDs(); !ids["q-new-2"] || len(ids) != 1 {
		t.Errorf("queue after the pass: %v", ids)
	}
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 2 {
		t.Errorf("a second pass admitted again: %v", n.registered)
	}
}

func TestWaitingForCapacityIsNotOvertakenByBorrowers(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy+`
tenant "search" {
  namespaces = ["search"]
  queues = ["training"]
  guaranteed = 4
  limit = 8
}`, 8)
	// vision holds its guarantee of 4, search 2 of its 4: 2 GPUs are idle.
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 4, "gpu").Build())
	view.ObserveJob(testbuild.Job("search", "held").Group("g", 1, 2, "gpu").Build())
	// In order: first (aged an hour), then owed and small.
	q.Put(context.Background(), entry("first", 3, time.Hour, now))   // borrowed: needs 3 idle
	q.Put(context.Background(), entry("small", 1, time.Minute, now)) // borrowed: would fit the 2 idle
	owed := entry("owed", 2, time.Second, now)                       // within search's guarantee
	owed.Namespace, owed.Tenant = "search", "search"
	owed.Request = json.RawMessage(strings.Replace(string(owed.Request), `"Namespace":"vision"`, `"Namespace":"search"`, 1))
	q.Put(context.Background(), owed)
	// small may not take GPUs first waits for; search is owed its GPUs.
	if got, _ := a.Pass(context.Background()); got != 1 || fmt.Sprint(n.registered) != "[search/owed]" || n.priorities["owed"] != 60 {
		t.Fatalf("admitted %d: %v %v", got, n.registered, n.priorities)
	}
	if ids := q.IDs(); len(ids) != 2 || !ids["q-first"] || !ids["q-small"] {
		t.Errorf("queue after the pass: %v", ids)
	}
}

func TestRegisterFailureKeepsTheEntry(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	q.Put(context.Background(), entry("j", 2, time.Minute, now))
	n.fail = true
	if _, err := a.Pass(context.Background()); err == nil {
		t.Fatal("want the registration error")
	}
	if !q.IDs()["q-j"] {
		t.Fatal("a job Nomad did not take was removed from the queue")
	}
	a.Clock = clock.Func(func() time.Time { return now.Add(admitter.RetryFirst) })
	if got, _ := a.Pass(context.Background()); got != 1 {
		t.Fatal("not admitted on the next pass")
	}
}

// A job requeued to make room waits in the queue until Nomad has stopped
// the version the requeue stops. Decided on before, it would count as that
// running version's replacement (the GPUs it gives back its own) and be
// admitted ahead of the job the room was made for, and then stopped.
func TestARequeuedJobWaitsForItsStop(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy, 8)
	view.ObserveJob(testbuild.Job("vision", "old").Group("g", 1, 4, "gpu").ModifyIndex(7).Build())
	e := entry("old", 4, time.Hour, now)
	e.Stopping, e.StoppingSince = 7, now.Add(-time.Second)
	q.Put(context.Background(), e)
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 0 {
		t.Fatalf("admitted while Nomad still runs the version it stops: %v", n.registered)
	}
	// Nomad's event for the stopped job may come before the one for its
	// allocation: the allocation still runs, so the entry still waits.
	alloc := testbuild.Alloc("old-1", "vision", "old", "n1", 7, "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	view.ObserveAlloc(alloc.Build())
	view.ObserveJob(testbuild.Job("vision", "old").Group("g", 1, 4, "gpu").ModifyIndex(8).Stopped().Build())
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 0 {
		t.Fatalf("admitted while the stopped job's allocation still runs: %v", n.registered)
	}
	// Asked to stop, its tasks still run (a checkpoint within kill_timeout):
	// it holds its GPUs until its client says they ended.
	view.ObserveAlloc(alloc.Status(api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 9).Build())
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 0 {
		t.Fatalf("admitted while the stopped allocation's tasks still run: %v", n.registered)
	}
	view.ObserveAlloc(alloc.Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 10).Build())
	if got, _ := a.Pass(context.Background()); got != 1 || fmt.Sprint(n.registered) != "[vision/old]" {
		t.Fatalf("not admitted once its tasks ended: %v", n.registered)
	}

	// A stop that failed leaves the job running: its entry waits StopWait,
	// then is decided as the running version's replacement, not forever.
	view.ObserveJob(testbuild.Job("vision", "kept").Group("g", 1, 2, "gpu").ModifyIndex(9).Build())
	e = entry("kept", 2, time.Hour, now)
	e.Stopping, e.StoppingSince = 9, now.Add(-queue.StopWait+time.Second)
	q.Put(context.Background(), e)
	if got, _ := a.Pass(context.Background()); got != 0 {
		t.Fatalf("admitted within StopWait: %v", n.registered)
	}
	e.StoppingSince = now.Add(-queue.StopWait)
	q.Put(context.Background(), e)
	if got, _ := a.Pass(context.Background()); got != 1 || fmt.Sprint(n.registered) != "[vision/old vision/kept]" {
		t.Fatalf("still waiting after StopWait: %v", n.registered)
	}
}

// stale is a queue whose listing is read before a user cancels entry gone:
// what a pass works from can be older than the queue.
type stale struct {
	*queuetest.Mem
	gone string
}

func (s stale) List(ctx context.Context) ([]queue.Entry, error) {
	entries, err := s.Mem.List(ctx)
	e, _ := s.Mem.Get(ctx, s.gone)
	s.Mem.Remove(ctx, e)
	return entries, err
}

func TestAnEntryCancelledDuringThePassIsNotRegistered(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	q.Put(context.Background(), entry("cancelled", 2, time.Hour, now))
	q.Put(context.Background(), entry("kept", 2, time.Minute, now))
	a.Queue = stale{q, "q-cancelled"}
	got, err := a.Pass(context.Background())
	if err != nil || got != 1 || fmt.Sprint(n.registered) != "[vision/kept]" {
		t.Errorf("admitted %d (%v): %v", got, err, n.registered)
	}
}

// A policy change never deletes a queued job: one the policy in force
// rejects (here an empty policy, as a truncated file reads) is parked with
// the reason, and waits, then runs, once the policy takes it again.
func TestAJobThePolicyNowRejectsIsParkedUntilThePolicyTakesItBack(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	q.Put(context.Background(), entry("j", 2, time.Minute, now))
	a.Policies = testbuild.Fixed{P: testbuild.Policy(t, ``)}
	for i := 0; i < 2; i++ {
		if got, err := a.Pass(context.Background()); err != nil || got != 0 || len(n.registered) != 0 {
			t.Fatalf("pass %d under the empty policy: admitted %d (%v): %v", i, got, err, n.registered)
		}
	}
	e, err := q.Get(context.Background(), "q-j")
	if err != nil || !e.ParkedByPolicy || !strings.Contains(e.Parked, "the policy in force rejects it (rule unmapped-namespace") {
		t.Fatalf("the entry under the empty policy: %+v (%v)", e, err)
	}
	a.Policies = testbuild.Fixed{P: testbuild.Policy(t, visionPolicy)}
	a.Pass(context.Background()) // waits again
	if got, err := a.Pass(context.Background()); err != nil || got != 1 || fmt.Sprint(n.registered) != "[vision/j]" {
		t.Errorf("once the policy is back: admitted %d (%v): %v", got, err, n.registered)
	}
}

func TestJobNomadRefusesIsParkedAndDoesNotBlock(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	n.refuse = "bad"
	q.Put(context.Background(), entry("bad", 2, time.Hour, now))
	q.Put(context.Background(), entry("good", 2, time.Minute, now))
	broken := entry("unreadable", 1, 2*time.Hour, now)
	broken.Request = json.RawMessage(`{"Job":{"ID":"unreadable","TaskGroups":[{"Count":1,"count":2}]}}`)
	q.Put(context.Background(), broken)
	got, err := a.Pass(context.Background())
	if err != nil || got != 1 || fmt.Sprint(n.registered) != "[vision/good]" {
		t.Fatalf("admitted %d (%v): %v", got, err, n.registered)
	}
	for _, id := range []string{"q-bad", "q-unreadable"} {
		e, err := q.Get(context.Background(), id)
		if err != nil || e.Parked == "" {
			t.Errorf("%s not parked: %+v %v", id, e, err)
		}
	}
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 1 {
		t.Errorf("parked entries were tried again: %v", n.registered)
	}
}

func TestJobWhoseSubmitterMayNoLongerSubmitIsParked(t *testing.T) {
	writer := policy.Grants{Policies: []string{"vision-write"}, Version: "v1"}
	for _, c := range []struct {
		name      string
		exclusive bool
		now       map[string]policy.Grants // the tokens' grants when the leader admits
		parked    string                   // the job parked, "" none
		why       string
	}{
		{name: "token deleted", now: map[string]policy.Grants{}, parked: "job", why: "no longer exists"},
		{name: "passthrough, grants unchanged", now: map[string]policy.Grants{"acc": writer}},
		{name: "passthrough, a policy changed", now: map[string]policy.Grants{"acc": {Policies: writer.Policies, Version: "v2"}},
			parked: "job", why: "changed since it was queued"},
		{name: "exclusive, still a submitter", exclusive: true,
			now: map[string]policy.Grants{"acc": {Policies: writer.Policies, Version: "v2"}}},
		{name: "exclusive, no longer a submitter", exclusive: true, now: map[string]policy.Grants{"acc": {Version: "v1"}},
			parked: "job", why: "holds none of tenant vision's submitters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, q, n, _, now := setup(t, strings.Replace(visionPolicy, "queues = [", `submitters = ["policy:vision-write"]
  queues = [`, 1), 8)
			a.Exclusive, n.tokens = c.exclusive, c.now
			job := entry("job", 2, time.Hour, now)
			job.Accessor, job.Grants = "acc", "v1"
			other := entry("other", 2, time.Minute, now) // queued without ACLs
			q.Put(context.Background(), job)
			q.Put(context.Background(), other)
			want := "[vision/job vision/other]"
			if c.parked != "" {
				want = "[vision/other]"
			}
			if got, err := a.Pass(context.Background()); err != nil || fmt.Sprint(n.registered) != want {
				t.Fatalf("admitted %d (%v): %v, want %s", got, err, n.registered, want)
			}
			if c.parked == "" {
				return
			}
			if e, _ := q.Get(context.Background(), "q-job"); !strings.Contains(e.Parked, c.why) {
				t.Errorf("parked with %q, want %q", e.Parked, c.why)
			}
		})
	}
}

// gated lets registrations through only in groups of size: each waits until
// size of them are in Nomad's hands at once.
type gated struct {
	*nomad
	mu      sync.Mutex
	size    int
	waiting int
	open    chan struct{}
}

func (g *gated) Register(ctx context.Context, ns string, body []byte) (uint64, error) {
	g.mu.Lock()
	if g.waiting++; g.waiting == g.size {
		close(g.open)
		g.waiting, g.open = 0, make(chan struct{})
	} else {
		open := g.open
		g.mu.Unlock()
		select {
		case <-open:
		case <-time.After(5 * time.Second):
			return 0, fmt.Errorf("registrations were not in flight %d at once", g.size)
		}
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	return g.nomad.Register(ctx, ns, body)
}

func TestRegistrationsOverlapWithoutOvercommitting(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	a.Nomad, a.Parallel = &gated{nomad: n, size: 4, open: make(chan struct{})}, 4
	for i := range 10 {
		q.Put(context.Background(), entry(fmt.Sprintf("j%d", i), 1, time.Duration(10-i)*time.Minute, now))
	}
	got, err := a.Pass(context.Background())
	if err != nil || got != 8 || len(n.registered) != 8 {
		t.Fatalf("admitted %d (%v): %v", got, err, n.registered)
	}
	// The vision limit is 8 and the node has 8 GPUs: the two youngest wait.
	if ids := q.IDs(); len(ids) != 2 || !ids["q-j8"] || !ids["q-j9"] {
		t.Errorf("queue after the pass: %v", ids)
	}
}

// listings counts the queue's listings.
type listings struct {
	*queuetest.Mem
	n chan struct{}
}

func (l listings) List(ctx context.Context) ([]queue.Entry, error) {
	defer func() { l.n <- struct{}{} }()
	return l.Mem.List(ctx)
}

func TestChangesPassOnlyWhileJobsAreQueued(t *testing.T) {
	a, q, _, view, now := setup(t, visionPolicy, 8)
	counted := listings{q, make(chan struct{}, 10)}
	a.Queue = counted
	changed, tick := make(chan struct{}), make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx, changed, tick)
	listed := func(want bool) {
		t.Helper()
		select {
		case <-counted.n:
			if !want {
				t.Fatal("a change listed an empty queue")
			}
		case <-time.After(200 * time.Millisecond):
			if want {
				t.Fatal("no pass")
			}
		}
	}
	listed(true) // the first pass
	changed <- struct{}{}
	listed(false)
	// Something waits for its tenant's limit: the next tick finds it, and
	// changes pass again.
	view.ObserveJob(testbuild.Job("vision", "all").Group("g", 1, 8, "gpu").Build())
	q.Put(context.Background(), entry("more", 2, time.Minute, now))
	tick <- now
	listed(true)
	changed <- struct{}{}
	listed(true)
}

// blocked counts the re-evaluations asked of Nomad.
type blocked struct{ n chan struct{} }

func (b blocked) ReevaluateBlocked(context.Context) (int, error) {
	b.n <- struct{}{}
	return 1, nil
}

func TestBlockedJobsAreEvaluatedAgainWhenGPUsComeBackEvenWithinOnePass(t *testing.T) {
	a, _, _, view, now := setup(t, visionPolicy, 8)
	reevaluated := blocked{make(chan struct{}, 10)}
	a.Blocked, a.GPUsCameBack = reevaluated, view.GPUsCameBack
	changed, tick := make(chan struct{}), make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx, changed, tick)
	asked := func(want bool) {
		t.Helper()
		select {
		case <-reevaluated.n:
			if !want {
				t.Fatal("re-evaluated with no GPU back")
			}
		case <-time.After(200 * time.Millisecond):
			if want {
				t.Fatal("not re-evaluated")
			}
		}
	}
	tick <- now
	asked(false) // nothing came back since the loop started
	// A GPU goes sick and recovers between two looks of the loop.
	view.ObserveNode(testbuild.Node("n", "H100", 7, 1))
	view.ObserveNode(testbuild.Node("n", "H100", 8, 0))
	tick <- now
	asked(true)
	tick <- now
	asked(false) // once per recovery
}

// A queued update whose deployment may revert counts its stable version,
// read from Nomad when the pass decides: it waits while that does not fit.
func TestAQueuedUpdateThatMayRevertCountsItsStableVersion(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy, 16)
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 4, "gpu").Build())
	n.stable = map[string]*api.Job{"web": testbuild.Job("vision", "web").Group("g", 1, 6, "gpu").Stable().Build()}
	e := entry("web", 2, time.Minute, now)
	e.Request = json.RawMessage(`{"Job":{"ID":"web","Namespace":"vision","Type":"service","Update":{"AutoRevert":true},"TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":2}]}}]}]}}`)
	q.Put(context.Background(), e)
	if got, err := a.Pass(context.Background()); err != nil || got != 0 {
		t.Fatalf("admitted %d (%v): 4 held + 6 it may revert to is above the limit of 8", got, err)
	}
	n.stable["web"] = testbuild.Job("vision", "web").Group("g", 1, 3, "gpu").Stable().Build()
	if got, err := a.Pass(context.Background()); err != nil || got != 1 {
		t.Errorf("admitted %d (%v): 4 held + 3 it may revert to is within the limit of 8", got, err)
	}
}

// Nomad refusing the broker's own token is no job's fault: nothing is
// parked, the pass stops, and once the token is valid again both run.
func TestARefusedBrokerTokenParksNothing(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	q.Put(context.Background(), entry("a", 2, time.Hour, now))
	q.Put(context.Background(), entry("b", 2, time.Minute, now))
	// Queued for a submitter: the broker reads the submitter's token with its
	// own first (exclusive enforcement), which Nomad refuses as well.
	c := entry("c", 2, time.Second, now)
	c.Accessor = "acc-ana"
	n.tokens["acc-ana"] = policy.Grants{}
	q.Put(context.Background(), c)
	n.revoked = true
	for i := 0; i < 2; i++ {
		if got, err := a.Pass(context.Background()); !errors.As(err, &revoked{}) || got != 0 {
			t.Fatalf("pass %d with the broker's token refused: admitted %d, error %v", i, got, err)
		}
	}
	// The reading of a submitter's token alone tells it too.
	a.Queue.Remove(context.Background(), entry("a", 2, time.Hour, now))
	a.Queue.Remove(context.Background(), entry("b", 2, time.Minute, now))
	a2, _, _, _, _ := setup(t, visionPolicy, 8)
	a2.Queue, a2.Nomad = q, n
	if _, err := a2.Pass(context.Background()); !errors.As(err, &revoked{}) {
		t.Errorf("a refused read of the submitter's token: %v", err)
	}
	q.Put(context.Background(), entry("a", 2, time.Hour, now))
	q.Put(context.Background(), entry("b", 2, time.Minute, now))
	entries, _ := q.List(context.Background())
	for _, e := range entries {
		if e.Parked != "" {
			t.Errorf("%s parked: %s", e.ID, e.Parked)
		}
	}
	n.revoked = false
	if got, err := a.Pass(context.Background()); err != nil || got != 3 {
		t.Errorf("with the token valid again: admitted %d (%v)", got, err)
	}
}

// listCounter counts the queue's listings: what an idle pass costs.
type listCounter struct {
	*queuetest.Mem
	lists atomic.Int32
}

func (c *listCounter) List(ctx context.Context) ([]queue.Entry, error) {
	c.lists.Add(1)
	return c.Mem.List(ctx)
}

// A tick with nothing changed since a pass that admitted nothing makes no
// pass (a long queue costs nothing while it waits); a change of the queue,
// or IdlePass gone by, makes one. So with the regions the agent gives the
// leader: their generation was once not seen, and every tick made a pass
// that read every queued job again.
func TestATickWithNothingChangedMakesNoPass(t *testing.T) {
	for _, regions := range []bool{false, true} {
		t.Run(fmt.Sprintf("regions=%t", regions), func(t *testing.T) { tickWithNothingChanged(t, regions) })
	}
}

func tickWithNothingChanged(t *testing.T, regions bool) {
	a, q, _, view, now := setup(t, visionPolicy, 8)
	if regions {
		a.Cluster = cluster.NewRegions("global", view, nil)
	}
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 8, "gpu").Build()) // vision at its limit
	counted := &listCounter{Mem: q}
	a.Queue = counted
	at := now
	var mu sync.Mutex
	a.Clock = clock.Func(func() time.Time { mu.Lock(); defer mu.Unlock(); return at })
	q.Put(context.Background(), entry("waits", 2, time.Minute, now))
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx, make(chan struct{}), tick); close(done) }()
	defer func() { cancel(); <-done }()
	ticks := func(n int) {
		for i := 0; i < n; i++ {
			tick <- now
		}
		tick <- now // the one before has been handled
	}
	ticks(5)
	if n := counted.lists.Load(); n != 1 {
		t.Fatalf("%d listings for the first pass and 6 ticks with nothing changed, want 1", n)
	}
	q.Put(context.Background(), entry("another", 1, time.Second, now))
	ticks(3)
	if n := counted.lists.Load(); n != 2 {
		t.Fatalf("%d listings after the queue changed, want 2", n)
	}
	mu.Lock()
	at = at.Add(admitter.DefaultIdlePass)
	mu.Unlock()
	ticks(2)
	if n := counted.lists.Load(); n != 3 {
		t.Errorf("%d listings once IdlePass went by, want 3", n)
	}
}

// The queue decides on a job only while no other decision on it (a scale
// or a registration through the gate) is in flight, and holds the gate's
// off until Nomad answered its registration.
func TestTheQueueWaitsForTheGatesDecisionOnTheSameJob(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy, 8)
	q.Put(context.Background(), entry("j", 2, time.Minute, now))
	unlock := view.LockJob("vision", "j") // a scale of j through the gate, in flight
	done := make(chan struct{})
	go func() {
		a.Pass(context.Background())
		close(done)
	}()
	select {
	case <-done:
		t.Fatalf("the queue decided on j while the gate held it: %v", n.registered)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	<-done
	if fmt.Sprint(n.registered) != "[vision/j]" {
		t.Errorf("registered %v once the gate let go", n.registered)
	}
	view.LockJob("vision", "j")() // free again
}

// A requeue must never end work silently (D2: a requeued sysbatch job was
// registered again, Nomad placed nothing, and the queue was empty). When
// Nomad places nothing for a requeued job it registered again, the entry
// stays, parked with what Nomad said. An entry that was never requeued is
// not asked about.
func TestARequeuedJobNomadDoesNotPlaceStaysInTheQueue(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy, 8)
	asked := 0
	a.Placed = func(_ context.Context, _, ns, id string, _ uint64) (string, error) {
		asked++
		return "its evaluation finished without placing an allocation", nil
	}
	view.ObserveJob(testbuild.Job("vision", "sweep").Group("g", 1, 2, "gpu").ModifyIndex(7).Stopped().Build())
	requeued := entry("sweep", 2, time.Hour, now)
	requeued.Stopping, requeued.StoppingSince = 7, now.Add(-time.Minute)
	q.Put(context.Background(), requeued)
	q.Put(context.Background(), entry("fresh", 1, time.Minute, now))
	if _, err := a.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(n.registered) != 2 || asked != 1 {
		t.Fatalf("registered %v, asked %d times", n.registered, asked)
	}
	left, _ := q.List(context.Background())
	if len(left) != 1 || left[0].JobID != "sweep" || !strings.Contains(left[0].Parked, "Nomad placed nothing for it: its evaluation finished") {
		t.Errorf("queue after the pass: %+v", left)
	}
}

// Nomad answering 500 to every registration: each entry is sent again only
// after a backoff that doubles, and while every one backs off, one of them
// every ProbeEvery (Nomad's probe); no pass registers anything before the
// latest failure's quiet ends. Once Nomad answers, the probe finds it
// within ProbeEvery and every entry is due at once: the queue drains at
// Nomad's pace, not when each entry's doubled backoff ends (32 s later,
// after a minute of failures).
func TestRegistrationsWithoutAnAnswerBackOff(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	at := now
	a.Clock = clock.Func(func() time.Time { return at })
	for i := range 3 {
		q.Put(context.Background(), entry(fmt.Sprintf("j%d", i), 1, time.Duration(10-i)*time.Minute, now))
	}
	n.down = unanswered{500}
	for range 600 { // a pass every 100 ms for a minute, as a busy cluster's changes would make
		a.Pass(context.Background())
		at = at.Add(100 * time.Millisecond)
	}
	// Each entry is sent 6 times by its own backoff, about 0, 1, 3, 7, 15
	// and 31 s after its first (600 passes, one a second at most sending).
	// Its first is a registration, each later one a plan (Nomad may have
	// taken one whose answer was lost) that fails too. One probe goes every
	// ProbeEvery at most.
	if probes := int(time.Minute / admitter.ProbeEvery); len(n.registered) != 3 || n.plans < 15 || n.plans > 15+probes {
		t.Errorf("in a minute of Nomad answering 500: registrations %v, plans %d (want 3, and 15 to %d)", n.registered, n.plans, 15+probes)
	}
	n.down = nil
	recovered := at
	for len(q.IDs()) > 0 && at.Sub(recovered) < 2*admitter.RetryMax {
		a.Pass(context.Background())
		at = at.Add(100 * time.Millisecond)
	}
	if took := at.Sub(recovered); len(q.IDs()) > 0 || took > admitter.ProbeEvery+200*time.Millisecond {
		t.Errorf("once Nomad answers, the queue took %s to empty (%d left), want at most %s", took, len(q.IDs()), admitter.ProbeEvery+200*time.Millisecond)
	}
}

// An entry backing off keeps its place: a younger one that fits only in
// its GPUs waits behind it, even when another registration's answer ended
// the pass-wide quiet.
func TestAnEntryBackingOffKeepsItsPlace(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 6)
	at := now
	a.Clock = clock.Func(func() time.Time { return at })
	a.Parallel = 2
	q.Put(context.Background(), entry("old", 4, time.Hour, now))
	q.Put(context.Background(), entry("other", 1, 50*time.Minute, now))
	n.flaky, n.begun, n.slow = "old", make(chan struct{}), make(chan struct{}) // other's answer comes after old's failure
	a.Pass(context.Background())
	if fmt.Sprint(n.registered) != "[failed vision/other]" {
		t.Fatalf("first pass: %v", n.registered)
	}
	n.flaky, n.begun, n.slow = "", nil, nil
	q.Put(context.Background(), entry("young", 2, time.Minute, now))
	at = at.Add(admitter.RetryFirst / 2)
	a.Pass(context.Background())
	if fmt.Sprint(n.registered) != "[failed vision/other]" {
		t.Fatalf("registered during old's backoff: %v", n.registered)
	}
	at = at.Add(admitter.RetryFirst)
	if got, _ := a.Pass(context.Background()); got != 1 || fmt.Sprint(n.registered) != "[failed vision/other vision/old]" {
		t.Errorf("after the backoff: admitted %d: %v", got, n.registered)
	}
}

// An entry whose registration Nomad never answers keeps its place, and is
// sent less and less often while Nomad answers others, at most every
// ProbeEvery while it alone fails; the entries behind it are admitted.
func TestAnEntryNomadNeverAnswersDoesNotStopThoseBehindIt(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	at := now
	a.Clock = clock.Func(func() time.Time { return at })
	q.Put(context.Background(), entry("poison", 2, time.Hour, now))
	q.Put(context.Background(), entry("w1", 1, time.Minute, now))
	q.Put(context.Background(), entry("w2", 1, time.Second, now))
	n.flaky = "poison"
	for range 100 { // 10 s
		a.Pass(context.Background())
		at = at.Add(100 * time.Millisecond)
	}
	// poison at 0, 1 and 3 s by its backoff (each later one planned first).
	// w1 and w2 once the quiet after poison's second failure ended, at 2 s.
	// Then, as nothing got through since its failure at 3 s, as Nomad's
	// probe at 5, 7 (its backoff's end too) and 9 s.
	if fmt.Sprint(n.registered) != "[failed failed vision/w1 vision/w2 failed failed failed failed]" || n.plans != 5 || len(q.IDs()) != 1 {
		t.Errorf("registrations %v, plans %d, queued %v", n.registered, n.plans, q.IDs())
	}
}

// Nomad took a registration and its answer was lost: the next pass finds
// the job in Nomad exactly as it would register it, and does not send it
// again.
func TestARegistrationWhoseAnswerWasLostIsNotSentAgain(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	at := now
	a.Clock = clock.Func(func() time.Time { return at })
	q.Put(context.Background(), entry("j", 2, time.Minute, now))
	n.lost = true
	if _, err := a.Pass(context.Background()); err == nil {
		t.Fatal("want the lost answer's error")
	}
	n.lost = false
	at = at.Add(admitter.RetryFirst)
	if got, err := a.Pass(context.Background()); got != 1 || err != nil {
		t.Fatalf("admitted %d (%v)", got, err)
	}
	if len(n.registered) != 1 || n.plans != 1 {
		t.Errorf("registrations %v, plans %d: want one of each", n.registered, n.plans)
	}
	if len(q.IDs()) != 0 {
		t.Errorf("queue: %v", q.IDs())
	}
}

// throttled answers 429 to the first registration, and counts how many are
// in Nomad's hands at once.
type throttled struct {
	*nomad
	mu         sync.Mutex
	calls, now int
	most       []int // most at once, by pass
	// expect is how many the pass should send at once: each call is held
	// until that many are in flight (at most a second), so that a slow
	// machine does not answer the first before the others start.
	expect int
}

func (t *throttled) Register(ctx context.Context, ns string, body []byte) (uint64, error) {
	t.mu.Lock()
	t.calls++
	t.now++
	t.most[len(t.most)-1] = max(t.most[len(t.most)-1], t.now)
	first := t.calls == 1
	t.mu.Unlock()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		t.mu.Lock()
		all := t.most[len(t.most)-1] >= t.expect
		t.mu.Unlock()
		if all {
			break
		}
	}
	time.Sleep(5 * time.Millisecond)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now--
	if first {
		return 0, unanswered{429}
	}
	return t.nomad.Register(ctx, ns, body)
}

// A 429 (the broker's address holds more connections than Nomad allows
// one client) halves the registrations a pass sends at once; each pass
// that gets through without one doubles them back.
func TestA429LowersTheRegistrationsSentAtOnce(t *testing.T) {
	a, q, n, _, now := setup(t, strings.ReplaceAll(visionPolicy, "limit = 8", "limit = 80"), 80)
	at := now
	a.Clock = clock.Func(func() time.Time { return at })
	th := &throttled{nomad: n}
	a.Nomad, a.Parallel = th, 8
	for i := range 60 {
		q.Put(context.Background(), entry(fmt.Sprintf("j%02d", i), 1, time.Duration(100-i)*time.Minute, now))
	}
	pass := func(expect int) {
		th.mu.Lock()
		th.most, th.expect = append(th.most, 0), expect
		th.mu.Unlock()
		a.Pass(context.Background())
		at = at.Add(admitter.RetryMax)
	}
	pass(8) // 8 at once, one answered 429: the pass ends
	pass(4) // 4 at once
	for i := range 20 {
		q.Put(context.Background(), entry(fmt.Sprintf("k%02d", i), 1, time.Duration(10-i)*time.Second, now))
	}
	pass(8) // 8 again
	if fmt.Sprint(th.most) != "[8 4 8]" || len(q.IDs()) != 0 {
		t.Errorf("registrations at once, by pass: %v (want [8 4 8]); still queued: %d", th.most, len(q.IDs()))
	}
}

// No pass before the view listed Nomad: every GPU would look free.
func TestNoPassBeforeTheViewListed(t *testing.T) {
	a, q, n, _, now := setup(t, visionPolicy, 8)
	listed := false
	a.Synced = func() bool { return listed }
	q.Put(context.Background(), entry("j", 2, time.Minute, now))
	if got, _ := a.Pass(context.Background()); got != 0 || len(n.registered) != 0 {
		t.Errorf("admitted %d before the view listed: %v", got, n.registered)
	}
	listed = true
	if got, _ := a.Pass(context.Background()); got != 1 {
		t.Errorf("once listed: admitted %d", got)
	}
}

// A tenant below its guarantee whose oldest queued job, beyond the
// guarantee, waited reserve_after gets a node held for it at the end of a
// pass. Once its borrowed work ends there, the next pass admits the job,
// pinned to that node; then the node is free again.
func TestALargeJobWaitingGetsANodeHeld(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy+"\nplacement {\n  reserve_after = \"1h\"\n}\n", 8)
	view.ObserveNode(testbuild.Node("m", "H100", 8, 0))
	// Both nodes run other borrowed work: 2 GPUs busy on each.
	d := admission.Decision{Tenant: "search", Queue: "training", Outcome: admission.AdmitBorrowed, Priority: 20}
	for i, node := range []string{"n", "m"} {
		id := fmt.Sprintf("busy-%d", i)
		view.ObserveJob(testbuild.Job("search", id).Priority(20).Meta(nomadjob.MetaBorrowed, "true").Meta(nomadjob.MetaTenant, d.Tenant).Group("g", 1, 2, "gpu").Build())
		view.ObserveAlloc(testbuild.Alloc("a"+id, "search", id, node, 5, node+"-0", node+"-1").Build())
	}
	shared := &sharedHolds{}
	a.Holds = shared
	big := entry("big", 8, 2*time.Hour, now) // vision holds nothing: 8 > its guarantee of 4
	big.Request = json.RawMessage(strings.Replace(string(big.Request), `"ID":"big",`, `"ID":"big","Type":"batch",`, 1))
	q.Put(context.Background(), big)
	if got, _ := a.Pass(context.Background()); got != 0 {
		t.Fatalf("admitted %d: %v", got, n.registered)
	}
	held := view.HeldNodes()
	if len(held) != 1 || held["m"] != "vision/big" && held["n"] != "vision/big" {
		t.Fatalf("nodes held after the pass: %v, want one for vision/big", held)
	}
	if !maps.Equal(shared.last, held) {
		t.Errorf("the other brokers were told %v, want %v", shared.last, held)
	}
	var node string
	for id := range held {
		node = id
	}
	// Its borrowed work ends; other borrowed work that only that node could
	// take is not admitted there.
	other := map[string]string{"n": "0", "m": "1"}[node]
	view.ObserveAlloc(testbuild.Alloc("abusy-"+other, "search", "busy-"+other, node, 9, node+"-0", node+"-1").
		Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 9).Build())
	view.ObserveJob(testbuild.Job("search", "busy-"+other).Priority(20).Group("g", 1, 2, "gpu").Stopped().ModifyIndex(9).Build())
	if dec, _ := view.Admit(testbuild.Policy(t, visionPolicy), admission.Job{ID: "small", Namespace: "vision",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 8}}}); dec.Outcome != admission.Queue {
		t.Errorf("8 borrowed GPUs of another job onto the held node: %s placed %v, want queued", dec.Outcome, dec.Placed)
	}
	// The job it is held for is admitted there, pinned.
	if got, _ := a.Pass(context.Background()); got != 1 {
		t.Fatalf("after the node drained: admitted %d", got)
	}
	if body := n.bodies["big"]; !strings.Contains(body, `"RTarget":"`+node+`"`) || !strings.Contains(body, "set_contains_any") {
		t.Errorf("big registered without its pin to %s:\n%s", node, body)
	}
	if held := view.HeldNodes(); len(held) != 0 || len(shared.last) != 0 {
		t.Errorf("nodes still held with the queue empty: %v (told the others %v)", held, shared.last)
	}
}

// sharedHolds is the store the leader tells the other brokers its holds by.
type sharedHolds struct{ last map[string]string }

func (s *sharedHolds) Put(_ context.Context, held map[string]string) error {
	s.last = maps.Clone(held)
	return nil
}

// manual is a clock that moves only when the test moves it; After's
// channels fire as it passes their time.
type manual struct {
	mu     sync.Mutex
	now    time.Time
	timers []timer
}

type timer struct {
	at time.Time
	c  chan time.Time
}

func (m *manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *manual) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := make(chan time.Time, 1)
	m.timers = append(m.timers, timer{m.now.Add(d), c})
	return c
}

func (m *manual) advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	left := m.timers[:0]
	for _, t := range m.timers {
		if t.at.After(m.now) {
			left = append(left, t)
		} else {
			t.c <- m.now
		}
	}
	m.timers = left
}

// While Nomad answers 500, a pass that finds every entry it may admit
// backing off sends nothing and sets off no other pass. The reservations it
// made for them and gave up are its own; the leader made 26,754 passes in
// 40 s of such a fault, each woken by the one before. Passes come when a
// backoff, the quiet or the probe's wait ends, without a tick; and once
// Nomad answers, the queue is empty within ProbeEvery.
func TestAPassIsNotSetOffByItsOwnFailures(t *testing.T) {
	a, q, n, view, now := setup(t, visionPolicy, 8)
	c := &manual{now: now}
	a.Clock = c
	counted := &listCounter{Mem: q}
	a.Queue = counted
	for i := range 3 {
		q.Put(context.Background(), entry(fmt.Sprintf("j%d", i), 1, time.Duration(10-i)*time.Minute, now))
	}
	n.mu.Lock()
	n.down = unanswered{500}
	n.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx, view.Changed(), make(chan time.Time)); close(done) }()
	defer func() { cancel(); <-done }()
	steps := func(n int) {
		for range n {
			c.advance(100 * time.Millisecond)
			time.Sleep(10 * time.Millisecond)
		}
	}
	steps(100) // 10 s of Nomad answering 500
	time.Sleep(100 * time.Millisecond)
	passes := counted.lists.Load()
	time.Sleep(300 * time.Millisecond) // the clock stands still: so do the passes
	if again := counted.lists.Load(); again != passes || passes > 20 || passes < 5 {
		t.Fatalf("%d passes in 10 s of Nomad failing, %d more with the clock still (want 5 to 20, and none more)", passes, again-passes)
	}
	n.mu.Lock()
	n.down = nil
	n.mu.Unlock()
	recovered := c.Now()
	for len(q.IDs()) > 0 && c.Now().Sub(recovered) < time.Minute {
		steps(1)
	}
	if took := c.Now().Sub(recovered); len(q.IDs()) > 0 || took > admitter.ProbeEvery+100*time.Millisecond {
		t.Errorf("once Nomad answered, the queue took %s to empty (%d left)", took, len(q.IDs()))
	}
}

// bodiesGone is a queue whose entries lose their bodies once gone is set,
// their versions kept: a pass that reads a body then parks the entry.
type bodiesGone struct {
	*queuetest.Mem
	gone atomic.Bool
}

func (q *bodiesGone) List(ctx context.Context) ([]queue.Entry, error) {
	entries, err := q.Mem.List(ctx)
	if q.gone.Load() {
		for i := range entries {
			entries[i].Request = json.RawMessage(`{"not a job`)
		}
	}
	return entries, err
}

// A waiting entry is decided on again as the pass before prepared it, its
// body not read, while its version, the policy and the nodes are as they
// were; other allocations do not count. A change of the nodes reads it
// again (here: a body gone, so the entry is parked).
func TestAWaitingEntryIsNotReadAgainWhileNothingItsJobReadChanged(t *testing.T) {
	a, mem, _, view, now := setup(t, visionPolicy, 8)
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 8, "gpu").Build()) // vision at its limit
	q := &bodiesGone{Mem: mem}
	a.Queue = q
	mem.Put(context.Background(), entry("waits", 2, time.Minute, now))
	pass := func() {
		t.Helper()
		if _, err := a.Pass(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	parked := func() string {
		e, _ := mem.Get(context.Background(), "q-waits")
		return e.Parked
	}
	pass()
	q.gone.Store(true)
	view.ObserveAlloc(testbuild.Alloc("other", "search", "web", "n", 30, "n-0").Build()) // not the nodes
	pass()
	if p := parked(); p != "" {
		t.Fatalf("the entry's body was read again with nothing its job read changed: parked %q", p)
	}
	view.ObserveNode(testbuild.Node("n2", "H100", 8, 0))
	pass()
	if parked() == "" {
		t.Errorf("a node joined, and the entry was not read again")
	}
}

// A job that leaves its region to the broker is prepared anew at every
// pass: the region chosen follows the regions' usage, which the kept job
// does not record.
func TestAnAutoRegionEntryIsReadAgainAtEveryPass(t *testing.T) {
	a, mem, _, view, now := setup(t, visionPolicy, 8)
	west := cluster.NewView(nil)
	west.ObserveNode(testbuild.Node("w", "H100", 8, 0))
	a.Cluster = cluster.NewRegions("global", view, map[string]*cluster.View{"west": west})
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 8, "gpu").Build()) // vision at its limit
	q := &bodiesGone{Mem: mem}
	a.Queue = q
	e := entry("waits", 2, time.Minute, now)
	e.Request = json.RawMessage(strings.Replace(string(e.Request), `"Namespace":"vision",`, `"Namespace":"vision","Meta":{"nomad-gpu.region":"auto"},`, 1))
	mem.Put(context.Background(), e)
	if _, err := a.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	q.gone.Store(true)
	if _, err := a.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := mem.Get(context.Background(), "q-waits"); got.Parked == "" {
		t.Errorf("an auto-region entry was decided on as kept, its body not read again")
	}
}

// A broker standing by prepares the queued jobs as a pass would, so that
// its first pass as leader decides on them without reading their bodies
// (here: bodies gone after Warm's round, and nothing parked); Warm makes no
// round while Run runs.
func TestAStandbyPreparesTheQueueForItsFirstPass(t *testing.T) {
	a, mem, _, view, now := setup(t, visionPolicy, 8)
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 8, "gpu").Build()) // vision at its limit
	q := &bodiesGone{Mem: mem}
	a.Queue = q
	for _, id := range []string{"a", "b", "c"} {
		mem.Put(context.Background(), entry(id, 2, time.Minute, now))
	}
	ctx, cancel := context.WithCancel(context.Background())
	tick, done := make(chan time.Time), make(chan struct{})
	go func() {
		defer close(done)
		a.Warm(ctx, tick)
	}()
	tick <- now // a round
	tick <- now // the first is over once the second is taken
	cancel()
	<-done
	q.gone.Store(true)
	if _, err := a.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if e, _ := mem.Get(context.Background(), "q-"+id); e.Parked != "" {
			t.Errorf("%s was read again at the first pass, its standby's work unused: parked %q", id, e.Parked)
		}
	}
}
