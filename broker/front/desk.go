package front

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Queue is where jobs wait.
type Queue interface {
	Put(ctx context.Context, e queue.Entry) error
	List(ctx context.Context) ([]queue.Entry, error)
	// View is List's entries shared, not copied: read them, never change them.
	View(ctx context.Context) ([]queue.Entry, error)
	Get(ctx context.Context, id string) (queue.Entry, error)
	Remove(ctx context.Context, e queue.Entry) (bool, error)
	// Index moves whenever an entry is added, changed or removed (0: not
	// known); `queue list` blocks on it.
	Index() uint64
}

// FairShare gives the tenants' decayed GPU-hours as of now.
type FairShare interface {
	Decayed(ctx context.Context, now time.Time, halfLife time.Duration) (map[string]float64, error)
}

// Usage is the cluster's usage without one job (namespace/jobID; "": all).
type Usage interface {
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
}

// Desk is the queue as the gate and the broker's API show it: in admission
// order, where an entry stands and when it is expected to start, and its
// cancellation, audited.
type Desk struct {
	Queue     Queue
	Policies  policy.Source
	Usage     Usage
	Forecast  *queue.Forecast // running jobs' ends, for estimates (nil: none)
	FairShare FairShare       // nil: the queue is ordered by current share
	Clock     clock.Clock
	Log       hclog.Logger
	Audit     *audit.Log
	Metrics   *metrics.Metrics
	// Synced reports whether the cluster view has listed Nomad once (nil:
	// taken as listed).
	Synced func() bool
}

// PositionOf is an entry's 1-based place in ordered entries, 0 if absent.
func PositionOf(entries []queue.Entry, id string) int {
	for i, e := range entries {
		if e.ID == id {
			return i + 1
		}
	}
	return 0
}

// Estimates are the leader's start estimates for entries in admission
// order; nil on a broker that has not led a reclaim pass.
func (d *Desk) Estimates(ordered []queue.Entry) map[string]queue.Estimate {
	p := d.Policies.Current()
	used, supply := d.usageNow(p)
	if supply == nil {
		return nil
	}
	return queue.Estimates(ordered, p, supply.Idle, used, supply.Releases, d.Clock.Now())
}

// EstimateOf is the estimate of entry id, of entries in admission order;
// false where there is none (the leader has not observed the cluster yet,
// or the entry is parked).
func (d *Desk) EstimateOf(ordered []queue.Entry, id string) (queue.Estimate, bool) {
	p := d.Policies.Current()
	used, supply := d.usageNow(p)
	if supply == nil {
		return queue.Estimate{}, false
	}
	return queue.EstimateOf(ordered, id, p, supply.Idle, used, supply.Releases, d.Clock.Now())
}

// Place is where e, submitted now in place of entries[replaced] (-1: none),
// stands in the queue, and its estimate (false: none).
func (d *Desk) Place(ctx context.Context, entries []queue.Entry, e queue.Entry, replaced int) (int, queue.Estimate, bool) {
	p := d.Policies.Current()
	used, supply := d.usageNow(p)
	return queue.Place(entries, e, replaced, p, used, d.decayed(ctx, p), d.Clock.Now(), supply)
}

// usageNow is each tenant's GPUs now and what estimates start from (nil
// before the leader observed the cluster), from one reading of the usage.
func (d *Desk) usageNow(p *policy.Policy) (map[string]float64, *queue.Supply) {
	u := d.Usage.UsageWithout(p, "", "")
	if d.Forecast == nil {
		return u.UsedBy(), nil
	}
	releases, ok := d.Forecast.Get()
	if !ok {
		return u.UsedBy(), nil
	}
	return u.UsedBy(), &queue.Supply{Idle: u.Idle[policy.AllGPUs], Releases: releases}
}

func EstimatePtr(e queue.Estimate, ok bool) *queue.Estimate {
	if ok {
		return &e
	}
	return nil
}

func EstimateIn(estimates map[string]queue.Estimate, id string) *queue.Estimate {
	e, ok := estimates[id]
	return EstimatePtr(e, ok)
}

// Order sorts entries in admission order under the policy and usage now.
func (d *Desk) Order(ctx context.Context, entries []queue.Entry) []queue.Entry {
	p := d.Policies.Current()
	used, _ := d.usageNow(p)
	queue.Order(entries, p, used, d.decayed(ctx, p), d.Clock.Now())
	return entries
}

// decayed is each tenant's decayed GPU-hours when fair share orders the
// queue (nil otherwise).
func (d *Desk) decayed(ctx context.Context, p *policy.Policy) map[string]float64 {
	if d.FairShare == nil || !p.FairShare.Enabled {
		return nil
	}
	hours, err := d.FairShare.Decayed(ctx, d.Clock.Now(), p.FairShare.HalfLife)
	if err != nil {
		// Shown in the current share's order; the leader's admitter
		// orders by fair share or not at all.
		d.Log.Warn("queue order: decayed GPU-hours unreadable", "error", err)
	}
	return hours
}

// Ordered lists the queue in admission order.
func (d *Desk) Ordered(r *http.Request) ([]queue.Entry, error) {
	if err := d.Listed(); err != nil {
		return nil, err
	}
	entries, err := d.Queue.List(r.Context())
	if err != nil {
		return nil, err
	}
	return d.Order(r.Context(), entries), nil
}

// Dequeue takes entry e out of the queue for who, audited with result; the
// error says why it was not.
func (d *Desk) Dequeue(r *http.Request, e queue.Entry, who, result string) error {
	event := audit.Event{Who: who, What: audit.QueueCancel, ID: e.ID, Namespace: e.Namespace, Job: e.JobID, Tenant: e.Tenant,
		Queue: e.Queue, Result: result}
	if err := Audited(d.Audit, event); err != nil {
		return err
	}
	ok, err := d.Queue.Remove(r.Context(), e)
	if err != nil || !ok {
		event.Result = fmt.Sprintf("not %s: changed or admitted meanwhile (%v)", result, err)
		d.Audit.Write(event)
		return Fail(ErrConflict, "queued job %q changed or was admitted meanwhile: %v", e.ID, err)
	}
	d.Metrics.QueueWait(e.Queue, "cancelled", d.Clock.Now().Sub(e.SubmittedAt))
	d.Log.Info("queue: "+result, "id", e.ID, "job", e.JobID, "namespace", e.Namespace, "by", who)
	return nil
}

// Listed is nil once the cluster view has listed Nomad, and a 503 until
// then: every GPU looks free to a view that has not.
func (d *Desk) Listed() error {
	if d.Synced == nil || d.Synced() {
		return nil
	}
	return Fail(ErrUnavailable, "the broker has not read the cluster from Nomad yet (it lists it when it starts): "+
		"nothing is decided or ordered against it; send the request again in a moment")
}
