// Package admitter is the leader's loop that admits queued jobs when quota or
// capacity frees: in queue order, each job whole or not at all, each only once.
package admitter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Queue is the durable queue.
type Queue interface {
	List(ctx context.Context) ([]queue.Entry, error)
	Remove(ctx context.Context, e queue.Entry) (bool, error)
	Park(ctx context.Context, e queue.Entry, reason string, at time.Time) (bool, error)
	// Claim marks e as being admitted, if it has not changed since read.
	Claim(ctx context.Context, e queue.Entry, at time.Time) (queue.Entry, bool, error)
	// Index moves whenever an entry is added, changed or removed (0: not
	// known, as while the queue is not followed).
	Index() uint64
}

// refusal is an error in which Nomad refused a job (a 4xx), as opposed to
// not being reached: such a job is parked, not retried.
type refusal interface{ Refused() bool }

// throttling is an error in which Nomad refused the broker's address more
// connections (429, http_max_conns_per_client): fewer registrations are sent
// at once until a pass gets through without one.
type throttling interface{ Throttled() bool }

// tokenRefusal is an error in which Nomad refused the broker's own token
// (deleted, expired): no job is at fault, so none is parked; every pass
// stops there until the token is valid again.
type tokenRefusal interface{ TokenRefused() bool }

// Registrar registers an admitted job with Nomad, and reads the version it runs.
type Registrar interface {
	// Register returns the job's new JobModifyIndex.
	Register(ctx context.Context, namespace string, body []byte) (uint64, error)
	// Registered reports whether Nomad already has the job exactly as the
	// register request body would make it, at which JobModifyIndex.
	Registered(ctx context.Context, namespace, id string, body []byte) (uint64, bool, error)
	// Job returns the job Nomad has, or nil if none.
	Job(ctx context.Context, namespace, id string) (*api.Job, error)
	// StableJob returns the job's latest stable version, or nil if none.
	StableJob(ctx context.Context, namespace, id string) (*api.Job, error)
	// Grants reads an ACL token's grants by accessor; exists is false when the
	// token is gone or expired.
	Grants(ctx context.Context, accessor string) (g policy.Grants, exists bool, err error)
}

// Cluster is what a pass decides against (decide.Cluster), and the job
// locks and running jobs it waits on.
type Cluster interface {
	decide.Cluster
	// UsageWithout is the usage without job namespace/jobID ("": all).
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	// LockJob holds off other decisions on one job (the gate's too) from
	// reading it to Nomad's answer.
	LockJob(namespace, id string) (unlock func())
	// Rooms are the nodes as admission places work on them; HeldNodes and
	// HoldNodes the nodes held for waiting jobs (node id → job key).
	Rooms() []admission.NodeRoom
	HeldNodes() map[string]string
	HoldNodes(map[string]string)
	// Running reports whether Nomad, as far as the view has seen, still
	// runs the job or an allocation of it (a requeued entry waits for its
	// stop: queue.Entry.Stopping).
	Running(namespace, id string) bool
	// Generation moves whenever what a decision reads changes;
	// NodesGeneration whenever what preparing a job reads of the nodes does.
	Generation() uint64
	NodesGeneration() uint64
}

// Unblocker re-evaluates jobs Nomad left blocked.
type Unblocker interface {
	ReevaluateBlocked(ctx context.Context) (int, error)
}

// Admitter admits from the queue.
type Admitter struct {
	Log      hclog.Logger
	Queue    Queue
	Nomad    Registrar
	Cluster  Cluster
	Policies policy.Source
	Stamper  nomadjob.Stamper
	Clock    clock.Clock
	// GPUsCameBack counts the times healthy, schedulable GPUs grew (a GPU
	// recovered, a node came back): each time it moved, jobs Nomad left
	// Blocked are evaluated again. A count, not the number of GPUs, so that a
	// dip and its recovery during one pass are not missed. Optional.
	GPUsCameBack func() uint64
	Blocked      Unblocker
	// Exclusive: the submitter must still be one of the tenant's submitters;
	// otherwise its token's grants must be those Nomad checked at queueing.
	Exclusive bool
	Metrics   *metrics.Metrics // nil: none
	Audit     *audit.Log       // nil: none
	// Approvals in force raise a queued job's limit or band; Version moves
	// whenever they change.
	Approvals interface {
		Current() []approval.Approval
		Version() uint64
	}
	// Preemptions are jobs' preemptions while borrowed, for their re-borrow
	// backoff (nil: none kept).
	Preemptions admission.Preemptions
	// Stops are the jobs the broker admitted that Nomad stopped since (nil:
	// none kept): a requeued job registered again is revived from them.
	Stops decide.StopRecords
	// Owed is set at each pass to what the queue owes its tenants'
	// guarantees (queue.Owed), for the gate's admissions (nil: not kept).
	Owed *queue.OwedBook
	// Writes are the JobModifyIndexes of the broker's own writes (nil: none
	// kept): a queued job registered is recorded in them.
	Writes decide.RegistrationRecords
	// Placed tells, for a requeued job registered again, why Nomad placed
	// nothing for that version ("" when it did; nil: not asked).
	// region is the one it was registered in ("": the broker's own).
	Placed func(ctx context.Context, region, namespace, id string, index uint64) (string, error)
	// FairShare gives the decayed GPU-hours the policy's fair_share orders by.
	FairShare interface {
		Decayed(ctx context.Context, now time.Time, halfLife time.Duration) (map[string]float64, error)
	}
	// Parallel bounds the registrations in flight at once (0 or 1: one at a
	// time). Decisions stay sequential, in queue order, each reserving its GPUs
	// in the view; only the round trips to Nomad and Consul overlap, which is
	// what a drain after a large release waits on.
	Parallel int
	// Synced reports whether the cluster view has listed Nomad once: until
	// it has, every GPU looks free, and no pass is made (nil: taken as
	// listed, for a view built by hand).
	Synced func() bool
	// Holds shares the nodes held for waiting jobs with the other brokers'
	// gates (nil: this broker's view only).
	Holds interface {
		Put(ctx context.Context, held map[string]string) error
	}
	// IdlePass is the longest Run goes without a pass while nothing it can
	// see changed (budgets reset with time alone); 0: DefaultIdlePass.
	IdlePass time.Duration

	listed int // entries the last pass found (Run's own)
	// retries are the entries whose registration did not reach Nomad, or
	// whose answer was lost, by id: each is sent again only after a backoff
	// that doubles with every failure (Nomad answering 500 drew hundreds of
	// registrations a second). A pass still holds such an entry's GPUs in
	// its place, so that nothing behind it takes them meanwhile.
	retries map[string]retry
	// prepared are, by entry id, the jobs of entries a pass left waiting, as
	// preparing them read (decide.Prepare), with what that read depended
	// on: a later pass decides on them again without reading their bodies
	// while none of it changed. Only the pass's goroutine uses it, or
	// Warm's while no pass runs (running).
	prepared map[string]preparedJob
	// running is held by Run, and by a round of Warm; leading is set while
	// Run runs, and ends such a round.
	running sync.Mutex
	leading atomic.Bool
	warmed  map[warmKey]bool // the entries Warm tried, kept or not
	// quiet is RetryFirst after the latest registration without an answer:
	// until then no pass registers anything (Nomad may be failing every
	// one), so that, however many entries are queued, Nomad gets one pass of
	// them a second at most. It is shorter than an entry's own backoff after
	// its second failure: an entry Nomad never answers holds its place, and
	// the entries behind it go on.
	quiet time.Time
	// probeAt is ProbeEvery after the latest registration without an
	// answer: from then on, each pass sends one entry still backing off
	// (waitsOut), so that Nomad's recovery is seen within ProbeEvery, not at
	// the end of the longest backoff. Zero once a registration got through:
	// Nomad answers, and what still fails waits out its own backoff.
	probeAt time.Time
	// resumed: a registration got through while others backed off, which
	// are due now; the next pass comes at once.
	resumed bool
	// parallel is how many registrations a pass sends at once now: halved
	// at each 429, doubled back (to Parallel) by each pass without one.
	parallel int
	passed   time.Time  // when the last pass started
	mu       sync.Mutex // retries, quiet, parallel, passed
	// idle is what the last pass that admitted nothing saw, and when.
	idle   passState
	idleAt time.Time
}

// DefaultIdlePass bounds how long a budget reset waits for a pass.
const DefaultIdlePass = time.Minute

// retry is when an entry's registration may be sent again, how many times
// it failed in a row, and when it last did.
type retry struct {
	failures int
	at       time.Time
	failed   time.Time
}

// Backoff of an entry whose registration did not get an answer from Nomad:
// the first wait, and the longest. While entries back off, one of them is
// sent every ProbeEvery. Once Nomad answers it, the outage is over: every
// entry that failed before it was sent is due at once, and the queue
// drains at Nomad's pace instead of at each entry's doubled backoff.
const (
	RetryFirst = time.Second
	RetryMax   = time.Minute
	ProbeEvery = 2 * time.Second
)

// passState is what a pass's decisions depend on, as far as Run can see it
// change: the queue (Consul's index), the cluster view, the policy and the
// approvals. ok is false when the queue cannot tell (a pass is then made).
// The parts are required of the Queue, Cluster and Approvals, not probed
// for: the broker's Regions once lacked Generation, and every tick made a
// pass that read every queued job again.
type passState struct {
	queue, view, approvals uint64
	policy                 *policy.Policy
	ok                     bool
}

// state is the passState now.
func (a *Admitter) state() passState {
	s := passState{policy: a.Policies.Current(), queue: a.Queue.Index(), view: a.Cluster.Generation()}
	s.ok = s.queue != 0
	if a.Approvals != nil {
		s.approvals = a.Approvals.Version()
	}
	return s
}

// unchanged reports whether a tick can skip its pass: the last pass admitted
// nothing, and nothing it depends on changed since, within IdlePass.
func (a *Admitter) unchanged() bool {
	idle := a.IdlePass
	if idle == 0 {
		idle = DefaultIdlePass
	}
	s := a.state()
	now := a.Clock.Now()
	wait, due := a.wake(now)
	return s.ok && s == a.idle && now.Sub(a.idleAt) < idle && !(due && wait == 0)
}

// wake is how long from now until a backoff alone makes a pass due: the
// quiet's end, an entry's backoff ending, or Nomad's next probe. Each counts
// only if it came after the last pass began: a pass that found nothing it
// could send waits for what changes, never for itself. due is false when no
// backoff is pending.
func (a *Admitter) wake(now time.Time) (wait time.Duration, due bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.resumed {
		return 0, true
	}
	var next time.Time
	at := func(t time.Time) {
		if t.After(a.passed) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, r := range a.retries {
		at(r.at)
	}
	if len(a.retries) > 0 {
		at(a.quiet)
		at(a.probeAt)
	}
	if next.IsZero() {
		return 0, false
	}
	if next.Before(a.quiet) { // nothing is sent before it ends
		next = a.quiet
	}
	return max(next.Sub(now), 0), true
}

// waitsOut reports whether entry id waits for its backoff at now, unless
// it is the pass's probe of Nomad. The probe is the first entry the pass may
// send that failed the fewest times, once ProbeEvery went by since the
// latest failure and no registration got through since. An entry Nomad
// always fails has failed more often than the others, and is not the one
// that finds Nomad back; alone, it is sent every ProbeEvery.
func (a *Admitter) waitsOut(id string, now time.Time, r *registrations) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	mine, ok := a.retries[id]
	if !ok || !now.Before(mine.at) {
		return false
	}
	if r.probed || a.probeAt.IsZero() || now.Before(a.probeAt) {
		return true
	}
	for _, other := range a.retries {
		if other.failures < mine.failures {
			return true
		}
	}
	r.probed = true
	return false
}

// retryGrid is what backoffs' ends are rounded up to.
const retryGrid = 250 * time.Millisecond

// ceil is t rounded up to a multiple of d.
func ceil(t time.Time, d time.Duration) time.Time {
	if r := t.Truncate(d); r.Before(t) {
		return r.Add(d)
	}
	return t
}

// backOff notes that entry id's registration got no answer: its backoff
// doubles, no pass registers anything for RetryFirst, and a 429 halves the
// registrations sent at once.
func (a *Admitter) backOff(id string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retries == nil {
		a.retries = map[string]retry{}
	}
	now := a.Clock.Now()
	r := a.retries[id]
	r.failures++
	// Rounded up to a grid: entries that failed together (a pass's
	// registrations in flight at once) are due together, in one pass.
	r.at, r.failed = ceil(now.Add(min(RetryFirst<<min(r.failures-1, 16), RetryMax)), retryGrid), now
	a.retries[id] = r
	a.quiet, a.probeAt = now.Add(RetryFirst), now.Add(ProbeEvery)
	var t throttling
	if was := a.inFlight(); errors.As(err, &t) && t.Throttled() && was > 1 {
		a.parallel = max(was/2, 1)
		a.Log.Warn("queue: Nomad refuses the broker's address more connections (429); sending fewer registrations at once "+
			"(raise http_max_conns_per_client in Nomad's limits block)", "at_once", a.parallel)
	}
}

// succeeded forgets entry id's backoff: Nomad answers again. Every entry
// that failed before id was sent (at sent) failed for the outage that is
// over now: it is due at once, not at the end of its own backoff.
func (a *Admitter) succeeded(id string, sent time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.retries, id)
	a.quiet, a.probeAt = time.Time{}, time.Time{}
	now := a.Clock.Now()
	for other, r := range a.retries {
		if r.failed.Before(sent) && now.Before(r.at) {
			r.at = now
			a.retries[other] = r
			a.resumed = true
		}
	}
}

// start begins a pass at now: false while registrations back off.
func (a *Admitter) start(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.passed, a.resumed = now, false
	return !now.Before(a.quiet)
}

// inFlight is how many registrations a pass sends at once now (a.mu held).
func (a *Admitter) inFlight() int {
	if a.parallel == 0 {
		a.parallel = max(a.Parallel, 1)
	}
	return a.parallel
}

// forgetGone drops the backoff of entries no longer queued.
func (a *Admitter) forgetGone(entries []queue.Entry) {
	queued := make(map[string]bool, len(entries))
	for _, e := range entries {
		queued[e.ID] = true
	}
	for id := range a.prepared {
		if !queued[id] {
			delete(a.prepared, id)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.retries {
		if !queued[id] {
			delete(a.retries, id)
		}
	}
}

// preparedJob is an entry's job as a pass prepared it, and what preparing
// it read: the entry's version, the policy, and the nodes.
type preparedJob struct {
	version uint64
	policy  *policy.Policy
	nodes   uint64
	job     admission.Job
}

// decideKept decides on e as an earlier pass prepared it, while nothing
// preparing it read changed since. True: that settles e for this pass (it
// waits); false: e is to be read and prepared again (it may go now, or
// nothing was kept of it).
func (a *Admitter) decideKept(r *registrations, p *policy.Policy, seq *decide.Sequence, pass *queue.Pass, e queue.Entry) bool {
	j, ok := a.preparedFor(e, p)
	if !ok || e.ParkedByPolicy {
		return false
	}
	d, res := seq.Decide(p, j, decide.Reserve)
	res.Withdraw() // held again by the fresh decision, if it goes
	if pass.Admits(d) {
		return false
	}
	if d.Outcome == admission.Queue {
		r.waits(e, j)
	}
	return true
}

// preparedFor is e's job as an earlier pass prepared it, while nothing that
// read depends on changed since.
func (a *Admitter) preparedFor(e queue.Entry, p *policy.Policy) (admission.Job, bool) {
	pj, ok := a.prepared[e.ID]
	if !ok || pj.version != e.ModifyIndex || pj.policy != p || pj.nodes != a.Cluster.NodesGeneration() {
		return admission.Job{}, false
	}
	return pj.job, true
}

// keepPrepared keeps j, prepared from e under p with the nodes as they were
// at nodes, for the passes after. It keeps nothing when preparing read more
// than the entry, the policy and the nodes: the job Nomad runs (counts it
// keeps, canaries, the version a deployment reverts to), or the regions'
// usage (a region the broker chooses).
func (a *Admitter) keepPrepared(e queue.Entry, p *policy.Policy, nodes uint64, prepared *decide.Request, j admission.Job) {
	if prepared.PreserveCounts || nomadjob.HasCanaries(prepared.Job) || nomadjob.AutoReverts(prepared.Job) || prepared.Auto {
		return
	}
	if a.prepared == nil {
		a.prepared = map[string]preparedJob{}
	}
	a.prepared[e.ID] = preparedJob{version: e.ModifyIndex, policy: p, nodes: nodes, job: j}
}

// Run makes a pass whenever the cluster changes while jobs are queued, and
// at every tick (which finds the first jobs queued, by any broker) unless
// nothing a pass depends on changed since one that admitted nothing. A
// change with nothing queued costs no round trip to Consul, a tick with
// nothing changed none either: a long queue costs nothing while it waits.
// While entries back off after Nomad failed them, it passes again when the
// earliest backoff ends, and the pass's own withdrawn reservations set off
// nothing: a pass that can send nothing sleeps until something changes.
func (a *Admitter) Run(ctx context.Context, changed <-chan struct{}, tick <-chan time.Time) {
	a.leading.Store(true)
	defer a.leading.Store(false)
	a.running.Lock()
	defer a.running.Unlock()
	var (
		cameBack uint64
		wake     <-chan time.Time // when a backoff ends (nil: none pending)
	)
	first, pass := true, true
	for {
		if pass {
			before, began := a.state(), a.Clock.Now()
			admitted, err := a.Pass(ctx)
			if err != nil && ctx.Err() == nil {
				a.Log.Warn("queue pass failed", "error", err)
			}
			now := a.Clock.Now()
			a.Metrics.Pass(metrics.LoopQueue, now.Sub(began), err)
			a.idle, a.idleAt = passState{}, time.Time{}
			if admitted == 0 && err == nil {
				a.idle, a.idleAt = before, now
			}
			wake = nil
			if wait, due := a.wake(now); due {
				wake = a.Clock.After(wait)
			}
		}
		if a.GPUsCameBack != nil && a.Blocked != nil {
			if c := a.GPUsCameBack(); c != cameBack || first {
				if !first {
					n, err := a.Blocked.ReevaluateBlocked(ctx)
					a.Log.Info("healthy GPUs came back, re-evaluated blocked jobs", "times", c-cameBack, "jobs", n, "error", err)
				}
				cameBack, first = c, false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			pass = a.listed > 0
		case <-tick:
			pass = !a.unchanged()
		case <-wake:
			pass = true
		}
	}
}

// Pass goes through the queue once in admission order, by queue.Pass's rule,
// and returns how many jobs it admitted.
func (a *Admitter) Pass(ctx context.Context) (int, error) {
	if a.Synced != nil && !a.Synced() || !a.start(a.Clock.Now()) {
		return 0, nil
	}
	a.mu.Lock()
	r := &registrations{sem: make(chan struct{}, a.inFlight())}
	a.mu.Unlock()
	err := a.decide(ctx, r)
	admitted, rerr := r.wait()
	if admitted > 0 && !r.throttled {
		a.mu.Lock()
		a.parallel = min(a.inFlight()*2, max(a.Parallel, 1))
		a.mu.Unlock()
	}
	return admitted, errors.Join(err, rerr)
}

// decide makes the pass's decisions and hands each admission to r.
func (a *Admitter) decide(ctx context.Context, r *registrations) error {
	entries, err := a.Queue.List(ctx)
	if err == nil {
		a.listed = len(entries)
		a.forgetGone(entries)
	}
	if err != nil {
		return err
	}
	p := a.Policies.Current()
	if len(entries) == 0 {
		a.reserve(ctx, p, nil, nil)
		return nil
	}
	used := a.Cluster.UsageWithout(p, "", "").UsedBy()
	var decayed map[string]float64
	if a.FairShare != nil && p.FairShare.Enabled {
		if decayed, err = a.FairShare.Decayed(ctx, a.Clock.Now(), p.FairShare.HalfLife); err != nil {
			return err
		}
	}
	if a.Owed != nil {
		a.Owed.Set(queue.Owed(entries, func(e queue.Entry) bool {
			n := 0
			if a.Preemptions != nil {
				n, _ = a.Preemptions(e.Namespace, e.JobID)
			}
			return queue.Owes(p, e, n)
		}))
	}
	queue.Order(entries, p, used, decayed, a.Clock.Now())
	seq := a.sequence()
	reads := newPreread(ctx, a.toRead(entries, p))
	defer reads.done()
	var pass queue.Pass
	for _, e := range entries {
		if r.failed() {
			return nil
		}
		if e.Parked != "" && !e.ParkedByPolicy {
			continue
		}
		if e.Stopping != 0 && a.Clock.Now().Sub(e.StoppingSince) < queue.StopWait && a.Cluster.Running(e.Namespace, e.JobID) {
			continue
		}
		if err := a.consider(ctx, r, p, seq, &pass, reads, e); errors.Is(err, errPassOver) {
			return nil
		} else if err != nil {
			return err
		}
	}
	a.reserve(ctx, p, r.waiting, used) // a pass cut short leaves the holds as they were
	return nil
}

// toRead are the entries, in order, whose requests the pass will read: those
// it decides on with no job an earlier pass prepared.
func (a *Admitter) toRead(entries []queue.Entry, p *policy.Policy) []queue.Entry {
	var out []queue.Entry
	for _, e := range entries {
		if _, kept := a.preparedFor(e, p); !kept && (e.Parked == "" || e.ParkedByPolicy) {
			out = append(out, e)
		}
	}
	return out
}

// reserve holds nodes for the oldest waiting job of each tenant below its
// guarantee that waited placement.reserve_after (admission.Reserve), the
// nodes held for the same job before staying held; every other node is
// released.
func (a *Admitter) reserve(ctx context.Context, p *policy.Policy, waiting map[string]admission.Waiting, used map[string]float64) {
	before := a.Cluster.HeldNodes()
	if len(before) == 0 && (p.Placement.ReserveAfter <= 0 || len(waiting) == 0) {
		return // nothing held, nothing to hold: the nodes need not be read
	}
	oldest := make([]admission.Waiting, 0, len(waiting))
	for _, t := range slices.Sorted(maps.Keys(waiting)) {
		oldest = append(oldest, waiting[t])
	}
	held := admission.Reserve(p, oldest, used, a.Cluster.Rooms(), before, a.Clock.Now())
	if !maps.Equal(held, before) {
		a.Log.Info("nodes held for waiting jobs (placement reserve_after)", "held", held)
	}
	a.Cluster.HoldNodes(held)
	if a.Holds != nil {
		if err := a.Holds.Put(ctx, held); err != nil {
			a.Log.Warn("the other brokers do not see the nodes held for waiting jobs", "error", err)
		}
	}
}

// errPassOver ends a pass early: a registration failed meanwhile.
var errPassOver = errors.New("the pass is over")

// consider decides on one queued entry and hands an admission to r. It holds
// the job's decision lock (shared with the gate) from reading the entry's job
// to Nomad's answer to its registration. A scale or a registration of the
// same job through the gate meanwhile would decide on the job as it was.
func (a *Admitter) consider(ctx context.Context, r *registrations, p *policy.Policy, seq *decide.Sequence, pass *queue.Pass, reads *preread, e queue.Entry) error {
	unlock := a.Cluster.LockJob(e.Namespace, e.JobID)
	handed := false // to the registration, which unlocks once Nomad answered
	defer func() {
		if !handed {
			unlock()
		}
	}()
	if a.decideKept(r, p, seq, pass, e) {
		return nil
	}
	nodes := a.Cluster.NodesGeneration() // before preparing: a change during it is not missed
	req, err := reads.read(e)
	if err != nil {
		a.park(ctx, e, err)
		return nil
	}
	req.QueuedAt = e.SubmittedAt
	prepared, err := seq.Prepare(ctx, p, req, a.Nomad) // the nodes fitting now, not when it was queued
	if decide.IsJobError(err) {
		a.park(ctx, e, err)
		return nil
	} else if err != nil {
		return fmt.Errorf("queue entry %s: %w", e.ID, err)
	}
	j := prepared.AdmissionJob()
	j.Submitted = e.SubmittedAt
	if e.ParkedByPolicy {
		a.reconsider(ctx, p, e, seq, j)
		return nil
	}
	d, res := seq.Decide(p, j, decide.Reserve)
	if !pass.Admits(d) {
		res.Withdraw()
		if d.Outcome == admission.Queue {
			r.waits(e, j)
			a.keepPrepared(e, p, nodes, prepared, j)
		}
		return nil
	}
	if d.Outcome == admission.Reject {
		// The policy changed since it was queued (an empty or truncated
		// file may be all it is): parked, never deleted.
		a.parkByPolicy(ctx, e, d)
		return nil
	}
	if a.waitsOut(e.ID, a.Clock.Now(), r) {
		r.hold(res) // its place kept to the pass's end
		return nil
	}
	if e.Accessor != "" {
		// Registered with the broker's token: only while the submitter may still.
		why, err := a.submitterMay(ctx, p, e)
		if err != nil {
			res.Withdraw()
			a.noteTokenRefused(err, e)
			return fmt.Errorf("queue entry %s: %w", e.ID, err)
		}
		if why != "" {
			res.Withdraw()
			a.park(ctx, e, errors.New(why))
			return nil
		}
	}
	if prepared.Dispatch != "" {
		d.Reason += "; dispatched to " + prepared.Dispatch // for the audit trail
	}
	prepared.Admit(d, a.Stamper)
	body := prepared.Body()
	handed = true
	if !r.start(func() error { defer unlock(); return a.register(ctx, e, j.Where.Region, d, res, body) }) {
		handed = false
		res.Withdraw()
		return errPassOver
	}
	return nil
}

// sequence is the admission sequence a pass decides through: the gate's,
// against the same view, approvals and preemptions (made once a pass).
func (a *Admitter) sequence() *decide.Sequence {
	s := &decide.Sequence{Cluster: a.Cluster, Enricher: enrich.Enricher{Preemptions: a.Preemptions, Clock: a.Clock}}
	if a.Approvals != nil {
		s.Approvals = a.Approvals.Current
	}
	return s
}

// register registers one admitted job with Nomad, then removes its entry; it
// returns an error only when Nomad could not be reached or the queue not
// updated, which ends the pass.
func (a *Admitter) register(ctx context.Context, e queue.Entry, region string, d admission.Decision, res *cluster.Reservation, body []byte) error {
	// Claim first: an entry cancelled, stopped or replaced since the pass
	// read it is not registered. Then register, then remove: a crash in
	// between registers the same job again, which Nomad treats as the same
	// job, never as a second one.
	again := !e.Admitting.IsZero() // a claim before this one did not end
	e, claimed, err := a.Queue.Claim(ctx, e, a.Clock.Now())
	if err != nil || !claimed {
		res.Withdraw()
		if err != nil {
			return fmt.Errorf("claim queued job %s (%s): %w", e.ID, e.JobID, err)
		}
		a.Log.Info("queue: changed since the pass read it; not registered", "id", e.ID, "job", e.JobID, "namespace", e.Namespace)
		return errChanged
	}
	settle, err := decide.Registering(ctx, a.Stops, a.Writes, nomadjob.Ref{Region: region, Namespace: e.Namespace, ID: e.JobID}, a.Clock.Now())
	if err != nil {
		res.Withdraw()
		return fmt.Errorf("admit queued job %s (%s): %w", e.ID, e.JobID, err)
	}
	sent := a.Clock.Now()
	index, err := a.send(ctx, e, body, again)
	took := index
	if err != nil {
		took = 0
	}
	if serr := settle(took); serr != nil {
		a.Log.Error("queue: the job's records of the broker's writes stay pending", "id", e.ID, "job", e.JobID, "error", serr)
	}
	if err != nil {
		var r refusal
		if errors.As(err, &r) && r.Refused() {
			res.Release() // for good: what it held back may go now
			a.park(ctx, e, err)
			return errRefused
		}
		res.Withdraw()
		if a.noteTokenRefused(err, e) {
			return fmt.Errorf("admit queued job %s (%s): %w", e.ID, e.JobID, err)
		}
		a.backOff(e.ID, err)
		return fmt.Errorf("admit queued job %s (%s): %w", e.ID, e.JobID, err)
	}
	a.succeeded(e.ID, sent)
	res.Confirm(index)
	if why := a.placedNothing(ctx, e, region, index); why != "" {
		// A requeue must never end work silently: the entry stays, parked
		// with what Nomad said, where its owner sees it.
		a.park(ctx, e, fmt.Errorf("registered again after its requeue, but Nomad placed nothing for it: %s; "+
			"the entry stays so that the job is not lost: stop the job, or remove the entry once it runs", why))
	} else if _, err := a.Queue.Remove(ctx, e); err != nil {
		return err
	}
	a.Metrics.Admission(metrics.Queued, d)
	a.Metrics.QueueWait(d.Queue, string(d.Outcome), a.Clock.Now().Sub(e.SubmittedAt))
	result := string(d.Outcome) + ": " + d.Reason
	if !e.EstimatedStart.IsZero() {
		off := a.Clock.Now().Sub(e.EstimatedStart)
		a.Metrics.EstimateError(d.Queue, off)
		result += fmt.Sprintf(" (estimated start %s, %s off)", e.EstimatedStart.UTC().Format(time.RFC3339), off.Round(time.Second))
	}
	a.Audit.Write(audit.Event{Who: e.SubmittedBy, What: audit.QueueAdmission, ID: e.ID, Namespace: e.Namespace, Job: e.JobID,
		Tenant: d.Tenant, Queue: d.Queue, Rule: d.Rule, Result: result})
	a.Log.Info("queue: admitted", "id", e.ID, "job", e.JobID, "namespace", e.Namespace, "outcome", d.Outcome,
		"priority", d.Priority, "waited", a.Clock.Now().Sub(e.SubmittedAt).Round(time.Second))
	return nil
}

// send registers body with Nomad, unless again (an earlier claim of the
// entry got no answer from Nomad) and Nomad already has the job exactly as
// body makes it: Nomad took it, and its answer was lost.
func (a *Admitter) send(ctx context.Context, e queue.Entry, body []byte, again bool) (uint64, error) {
	if again {
		index, has, err := a.Nomad.Registered(ctx, e.Namespace, e.JobID, body)
		if err != nil {
			return 0, err
		}
		if has {
			a.Log.Info("queue: Nomad already has the job as registered by an earlier claim whose answer was lost; not sent again",
				"id", e.ID, "job", e.JobID, "namespace", e.Namespace, "index", index)
			return index, nil
		}
	}
	return a.Nomad.Register(ctx, e.Namespace, body)
}

// placedNothing is, for an entry a reclaim requeue made (e.Stopping), why
// Nomad placed nothing for the version registered at index; "" when it
// placed (or waits for room to), or it is not such an entry.
func (a *Admitter) placedNothing(ctx context.Context, e queue.Entry, region string, index uint64) string {
	if e.Stopping == 0 || a.Placed == nil {
		return ""
	}
	why, err := a.Placed(ctx, region, e.Namespace, e.JobID, index)
	if err != nil {
		a.Log.Warn("queue: cannot tell whether Nomad placed a requeued job", "id", e.ID, "job", e.JobID, "error", err)
	}
	return why
}

// errRefused is a registration Nomad refused: the entry is parked, the pass
// goes on; so it does past errChanged, an entry that changed (cancelled,
// stopped, replaced) since the pass read it, which is left as it is now.
var (
	errRefused = errors.New("refused by Nomad")
	errChanged = errors.New("changed since read")
)

// registrations runs a pass's registrations, at most cap(sem) at once, and
// counts those that got through.
type registrations struct {
	sem       chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	admitted  int
	err       error
	throttled bool                   // a registration got a 429
	held      []*cluster.Reservation // of entries backing off, released at the pass's end
	probed    bool                   // the pass sent its probe of Nomad (Admitter.waitsOut)
	// waiting is, per tenant, its oldest entry the pass decided on and
	// left waiting (placement reserve_after holds a node for it).
	waiting map[string]admission.Waiting
}

// wait notes that entry e, decided on as j, waits on.
func (r *registrations) waits(e queue.Entry, j admission.Job) {
	if w, ok := r.waiting[e.Tenant]; ok && !e.SubmittedAt.Before(w.Since) {
		return
	}
	if r.waiting == nil {
		r.waiting = map[string]admission.Waiting{}
	}
	r.waiting[e.Tenant] = admission.Waiting{Namespace: j.Namespace, ID: j.ID, Tenant: e.Tenant, Region: j.Where.Region, Groups: j.Groups,
		Since: e.SubmittedAt}
}

// hold keeps res to the pass's end.
func (r *registrations) hold(res *cluster.Reservation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = append(r.held, res)
}

// start runs register once a slot is free; false: it did not, because an
// earlier registration failed meanwhile.
func (r *registrations) start(register func() error) bool {
	r.sem <- struct{}{}
	if r.failed() {
		<-r.sem
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := register()
		defer func() { <-r.sem }() // after the result: a failure stops the next start
		r.mu.Lock()
		defer r.mu.Unlock()
		var t throttling
		r.throttled = r.throttled || errors.As(err, &t) && t.Throttled()
		switch {
		case err == nil:
			r.admitted++
		case errors.Is(err, errRefused), errors.Is(err, errChanged):
		case r.err == nil:
			r.err = err
		}
	}()
	return true
}

// failed says a registration could not reach Nomad or Consul: the pass stops
// deciding, and the next one starts from the queue as it then is.
func (r *registrations) failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err != nil
}

func (r *registrations) wait() (int, error) {
	r.wg.Wait()
	for _, res := range r.held {
		res.Withdraw()
	}
	return r.admitted, r.err
}

// noteTokenRefused reports whether err is Nomad refusing the broker's own
// token, and if so logs it: the entry waits and is never parked for it. (The
// metric and health check read the Nomad client, which sees every refusal.)
func (a *Admitter) noteTokenRefused(err error, e queue.Entry) bool {
	var tr tokenRefusal
	if !errors.As(err, &tr) || !tr.TokenRefused() {
		return false
	}
	a.Log.Error("queue: Nomad refuses the broker's own token; queued jobs wait, none is parked, until it is valid again "+
		"(write a valid one to nomad.token_file and send the broker SIGHUP, or set nomad.token and restart it)", "job", e.JobID, "namespace", e.Namespace, "error", err)
	return true
}

// submitterMay says why the submitter of e may no longer submit it ("" if it
// may): its token is gone, it is no longer one of the tenant's submitters
// (exclusive), or its roles or policies changed since Nomad checked them.
func (a *Admitter) submitterMay(ctx context.Context, p *policy.Policy, e queue.Entry) (string, error) {
	g, exists, err := a.Nomad.Grants(ctx, e.Accessor)
	switch {
	case err != nil:
		return "", err
	case !exists:
		return fmt.Sprintf("the submitter's ACL token (accessor %s) no longer exists or expired", e.Accessor), nil
	case a.Exclusive:
		if t := p.TenantOf(e.Namespace); t != nil && !t.MaySubmit(g) {
			return fmt.Sprintf("the submitter's ACL token (accessor %s) holds none of tenant %s's submitters any more", e.Accessor, t.Name), nil
		}
	case e.Grants != "" && g.Version != e.Grants:
		return fmt.Sprintf("the submitter's ACL token (accessor %s), its roles or its policies changed since it was queued; "+
			"submit the job again so that Nomad checks them", e.Accessor), nil
	}
	return "", nil
}

// parkByPolicy parks an entry the policy in force rejects, with the reason.
func (a *Admitter) parkByPolicy(ctx context.Context, e queue.Entry, d admission.Decision) {
	e.ParkedByPolicy = true
	why := fmt.Sprintf("the policy in force rejects it (rule %s: %s); it waits again if the policy takes it back", d.Rule, d.Reason)
	ok, err := a.Queue.Park(ctx, e, why, a.Clock.Now().UTC())
	if err != nil || !ok {
		return // changed meanwhile, or Consul unreachable: the next pass decides again
	}
	a.Metrics.Admission(metrics.Queued, d)
	a.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.QueuePark, ID: e.ID, Namespace: e.Namespace, Job: e.JobID,
		Tenant: e.Tenant, Queue: e.Queue, Rule: d.Rule, Result: "parked: " + why})
	a.Log.Warn("queue: parked a job the policy now rejects", "id", e.ID, "job", e.JobID,
		"namespace", e.Namespace, "rule", d.Rule, "reason", d.Reason)
}

// reconsider decides again on an entry parked by the policy and, once the
// policy in force would take it, has it wait in the queue again (admitted
// by a later pass, in its place by its submit time).
func (a *Admitter) reconsider(ctx context.Context, p *policy.Policy, e queue.Entry, seq *decide.Sequence, j admission.Job) {
	d, _ := seq.Decide(p, j, decide.Preview)
	if d.Outcome == admission.Reject {
		return
	}
	e.ParkedByPolicy = false
	if ok, err := a.Queue.Park(ctx, e, "", time.Time{}); err != nil || !ok {
		return
	}
	a.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.QueueUnpark, ID: e.ID, Namespace: e.Namespace, Job: e.JobID,
		Tenant: d.Tenant, Queue: d.Queue, Result: "waits again: the policy in force takes it (" + string(d.Outcome) + ")"})
	a.Log.Info("queue: a job parked by the policy waits again", "id", e.ID, "job", e.JobID, "namespace", e.Namespace)
}

// park sets an entry aside with the reason it cannot be admitted.
func (a *Admitter) park(ctx context.Context, e queue.Entry, why error) {
	ok, err := a.Queue.Park(ctx, e, why.Error(), a.Clock.Now().UTC())
	a.Log.Warn("queue: parked a job that cannot be admitted as it stands", "id", e.ID, "job", e.JobID, "namespace", e.Namespace,
		"reason", why, "parked", ok, "error", err)
}
