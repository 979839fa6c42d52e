// Package reclaimer is the leader's loop that applies the reclaim rules: it
// observes the GPU allocations, records each decision in Consul KV before
// acting, carries it out through Nomad after its grace, and records the result.
package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Records keeps decision records.
type Records interface {
	Create(ctx context.Context, r reclaim.Record) (bool, error)
	Get(ctx context.Context, id string) (reclaim.Record, error)
	// Update writes r if it has not changed since read (check-and-set).
	Update(ctx context.Context, r reclaim.Record) (bool, error)
	List(ctx context.Context) ([]reclaim.Record, error)
	Delete(ctx context.Context, r reclaim.Record) (bool, error)
}

// Observer reads the running GPU allocations and the state of every GPU.
type Observer interface {
	Observe(ctx context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error)
}

// Watcher is given what each pass observed (right-sizing samples it): the
// broker's own region's allocations, or every region's for one that says
// EveryRegion.
type Watcher interface {
	Observed(ctx context.Context, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) error
}

// everyRegion is a watcher given every region's allocations, each marked
// with its region.
type everyRegion interface{ EveryRegion() }

// Actor carries decisions out in Nomad; each answers what Nomad did, and
// does nothing to a job or allocation that has already stopped.
type Actor interface {
	StopJob(ctx context.Context, namespace, job string) (string, error)
	StopAlloc(ctx context.Context, id string) (string, error)
}

// Requeuer stops a job in Nomad and puts it back in the broker's queue.
type Requeuer interface {
	Requeue(ctx context.Context, rec reclaim.Record) (string, error)
}

// Reclaimer applies the reclaim rules while this broker leads.
type Reclaimer struct {
	Log      hclog.Logger
	Records  Records
	Observer Observer
	Actor    Actor
	Requeue  Requeuer
	Policies policy.Source
	Clock    clock.Clock
	NewID    func() string
	// Watchers see every observation, after the decisions on it.
	Watchers []Watcher
	Metrics  *metrics.Metrics // nil: none
	Audit    *audit.Log       // nil: none
	// Forecast is given, each pass, when running allocations end (queue
	// start estimates); nil: none kept.
	Forecast *queue.Forecast
	// Granted is, by tenant, the GPUs above its limit that approvals in
	// force at now grant (nil: none): not over the limit, for over_limit.
	Granted func(now time.Time) map[string]float64
	// Queued lists the broker's queue, for make_room (nil: no room made).
	Queued interface {
		List(ctx context.Context) ([]queue.Entry, error)
	}
	// Elsewhere observes the other regions the broker governs, whose
	// allocations the rules decide on too, and carries out those decisions
	// there (nil: the broker governs one region). The watchers see the
	// broker's own region only; the ledger reads the rest from Elsewhere.
	Elsewhere *Elsewhere
	// Home is the broker's own region's name: a tenant's cap of it counts
	// the allocations observed here.
	Home string

	engine *reclaim.Engine
}

// Run makes a pass every reclaim period of the policy in force, jittered by
// up to a tenth so that brokers of many clusters do not call in step, until
// ctx ends. wait is time.After outside tests.
func (r *Reclaimer) Run(ctx context.Context) {
	for {
		began := r.Clock.Now()
		err := r.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			r.Log.Warn("reclaim pass failed", "error", err)
		}
		r.Metrics.Pass(metrics.LoopReclaim, r.Clock.Now().Sub(began), err)
		period := r.Policies.Current().ReclaimSettings.Period
		select {
		case <-ctx.Done():
			return
		case <-r.Clock.After(period - time.Duration(rand.Int63n(int64(period/10)+1))):
		}
	}
}

// everyRegion is what the rules decide on: the broker's own region's
// allocations and GPUs (the watchers'), with the other regions'.
func (r *Reclaimer) everyRegion(ctx context.Context, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) ([]reclaim.Alloc, map[string]reclaim.GPU) {
	if r.Elsewhere == nil {
		return allocs, gpus
	}
	more, g := r.Elsewhere.Observe(ctx)
	all := maps.Clone(gpus)
	maps.Copy(all, g)
	return append(slices.Clip(allocs), more...), all
}

// watch hands the pass's observation to each watcher: the broker's own
// region's (own), or every region's to one that says EveryRegion.
func (r *Reclaimer) watch(ctx context.Context, now time.Time, own []reclaim.Alloc, ownGPUs map[string]reclaim.GPU,
	all []reclaim.Alloc, allGPUs map[string]reclaim.GPU) error {
	var errs []error
	for _, w := range r.Watchers {
		if _, ok := w.(everyRegion); ok {
			errs = append(errs, w.Observed(ctx, now, all, allGPUs))
		} else {
			errs = append(errs, w.Observed(ctx, now, own, ownGPUs))
		}
	}
	return errors.Join(errs...)
}

// Pass observes, records new decisions, carries out those due, and drops
// finished records past retention.
func (r *Reclaimer) Pass(ctx context.Context) error {
	records, err := r.Records.List(ctx)
	if err != nil {
		return err
	}
	if r.engine == nil {
		// A new leader: what earlier leaders decided is not decided again.
		r.engine = reclaim.New()
		for _, rec := range records {
			if rec.State != reclaim.Executed && rec.State != reclaim.Failed {
				r.engine.Raised(rec.Rule, rec.Allocs)
			}
		}
	}
	p := r.Policies.Current()
	rules := p.ReclaimRules()
	seen, gpus, err := r.Observer.Observe(ctx) // the built-in rule needs it with no rules too
	if err != nil {
		return err
	}
	allocs, all := r.everyRegion(ctx, seen, gpus)
	now := r.Clock.Now()
	if r.Forecast != nil {
		var releases []queue.Release
		for _, a := range allocs {
			if end, ok := reclaim.Ends(rules, a); ok {
				releases = append(releases, queue.Release{At: end, GPUs: float64(len(a.GPUs)), Tenant: a.Tenant})
			}
		}
		r.Forecast.Set(releases)
	}
	decisions := r.engine.Pass(now, rules, allocs, all)
	var granted map[string]float64
	if r.Granted != nil {
		granted = r.Granted(now)
	}
	decisions = append(decisions, r.engine.OverLimit(now, p, allocs, all, granted, r.Home)...)
	var errs []error
	if r.Queued != nil {
		waiting, err := r.waiting(ctx)
		errs = append(errs, err)
		decisions = append(decisions, r.engine.MakeRoom(now, p, allocs, all, waiting)...)
	}
	for _, d := range decisions {
		rec := reclaim.NewRecord(r.NewID(), d, now)
		if ok, err := r.Records.Create(ctx, rec); err != nil || !ok {
			r.engine.Retract(d)
			return fmt.Errorf("record decision of rule %s on %s/%s: %w", d.Rule, d.Namespace, d.JobID, err)
		}
		r.Metrics.Decision(rec.Rule, string(rec.Action), string(rec.State))
		what := audit.ReclaimDecided
		if rec.Rule == policy.PreemptedBorrowed.Name {
			what = audit.Preemption
			r.countPreempted(now, rec, allocs)
		}
		r.Audit.Write(audit.Event{Who: audit.BrokerAct, What: what, ID: rec.ID, Namespace: rec.Namespace, Job: rec.Job, Tenant: rec.Tenant,
			Queue: rec.Queue, Rule: rec.Rule, Result: fmt.Sprintf("%s %s (%s): %s", rec.State, rec.Action, rec.Mode, rec.Evidence)})
		r.Log.Info("reclaim decision", "id", rec.ID, "rule", rec.Rule, "action", rec.Action, "state", rec.State,
			"namespace", rec.Namespace, "job", rec.Job, "allocs", rec.Allocs, "gpus", rec.GPUs, "act_after", rec.ActAfter, "evidence", rec.Evidence)
		records = append(records, rec)
	}
	retention := p.ReclaimSettings.Retention
	errs = append(errs, r.watch(ctx, now, seen, gpus, allocs, all))
	for _, rec := range records {
		switch {
		case rec.Due(now):
			errs = append(errs, r.act(ctx, rec, now))
		case rec.State != reclaim.Proposed && now.Sub(rec.ProposedAt) > retention:
			if _, err := r.Records.Delete(ctx, rec); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// waiting is the queue's jobs that wait, oldest first: those parked or
// being registered wait for nothing make-room could give them.
func (r *Reclaimer) waiting(ctx context.Context) ([]reclaim.Waiting, error) {
	entries, err := r.Queued.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the queue for make_room: %w", err)
	}
	slices.SortStableFunc(entries, func(a, b queue.Entry) int { return a.SubmittedAt.Compare(b.SubmittedAt) })
	var out []reclaim.Waiting
	for _, e := range entries {
		if e.Parked == "" && e.Admitting.IsZero() {
			out = append(out, reclaim.Waiting{Namespace: e.Namespace, JobID: e.JobID, Tenant: e.Tenant, Queue: e.Queue, GPUs: e.Demand})
		}
	}
	return out, nil
}

// countPreempted counts the allocations a preemption decision is about and
// the work they lost: their GPUs × the time since they started.
func (r *Reclaimer) countPreempted(now time.Time, rec reclaim.Record, allocs []reclaim.Alloc) {
	for _, a := range allocs {
		if slices.Contains(rec.Allocs, a.ID) {
			lost := 0.0
			if !a.StartedAt.IsZero() {
				lost = now.Sub(a.StartedAt).Seconds() * float64(len(a.GPUs))
			}
			r.Metrics.Preempted(rec.Tenant, rec.Queue, lost)
		}
	}
}

// act carries out a due decision: claim it (it can no longer be cancelled),
// act, record the result; each write is a check-and-set on what was just
// read. A crash after the claim leaves it to the next leader, which acts
// again: stopping what has already stopped does nothing.
func (r *Reclaimer) act(ctx context.Context, rec reclaim.Record, now time.Time) error {
	cur, err := r.Records.Get(ctx, rec.ID)
	if err != nil || cur.State != reclaim.Proposed {
		return err // cancelled since listed
	}
	if cur.ActingSince.IsZero() {
		cur.ActingSince = now.UTC()
		if ok, err := r.Records.Update(ctx, cur); err != nil || !ok {
			return err // cancelled in between: the next pass sees it
		}
		if cur, err = r.Records.Get(ctx, rec.ID); err != nil {
			return err
		}
	}
	result, err := r.carryOut(ctx, cur)
	cur.State, cur.Result, cur.ExecutedAt = reclaim.Executed, result, r.Clock.Now().UTC()
	if err != nil {
		cur.State, cur.Result = reclaim.Failed, err.Error()
	}
	r.Log.Info("reclaim carried out", "id", cur.ID, "rule", cur.Rule, "action", cur.Action, "state", cur.State, "result", cur.Result)
	if ok, err := r.Records.Update(ctx, cur); err != nil || !ok {
		return fmt.Errorf("record the result of reclaim decision %s (%s): %w", cur.ID, cur.Result, err)
	}
	r.Metrics.Decision(cur.Rule, string(cur.Action), string(cur.State))
	if cur.State == reclaim.Executed && cur.Action != policy.ActionNotify {
		r.Metrics.Reclaimed(cur.Rule, string(cur.Action), cur.GPUs)
	}
	r.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.ReclaimActed, ID: cur.ID, Namespace: cur.Namespace, Job: cur.Job,
		Tenant: cur.Tenant, Queue: cur.Queue, Rule: cur.Rule, Result: fmt.Sprintf("%s %s: %s", cur.State, cur.Action, cur.Result)})
	return nil
}

func (r *Reclaimer) carryOut(ctx context.Context, rec reclaim.Record) (string, error) {
	actor, requeue := r.Actor, r.Requeue
	if rec.Region != "" {
		// A decision on another region's job is carried out there.
		if r.Elsewhere == nil || r.Elsewhere.In == nil {
			return "", fmt.Errorf("the job is in region %s, which this broker does not govern now", rec.Region)
		}
		in := r.Elsewhere.In(rec.Region)
		actor = in
		if q, ok := requeue.(*Requeue); ok {
			requeue = q.in(in)
		}
	}
	switch rec.Action {
	case policy.ActionNotify:
		return "recorded only (notify)", nil
	case policy.ActionStop:
		if rec.WholeJob {
			return actor.StopJob(ctx, rec.Namespace, rec.Job)
		}
		return stopAllocs(ctx, actor, rec)
	case policy.ActionReschedule:
		return stopAllocs(ctx, actor, rec) // Nomad places a stopped allocation again
	case policy.ActionRequeue:
		return requeue.Requeue(ctx, rec)
	}
	return "", fmt.Errorf("unknown action %q", rec.Action)
}

func stopAllocs(ctx context.Context, actor Actor, rec reclaim.Record) (string, error) {
	var results []string
	for _, id := range rec.Allocs {
		res, err := actor.StopAlloc(ctx, id)
		if err != nil {
			return strings.Join(results, "; "), err
		}
		results = append(results, id+": "+res)
	}
	return strings.Join(results, "; "), nil
}
