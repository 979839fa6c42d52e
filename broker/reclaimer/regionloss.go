package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// RegionLoss carries out on_region_loss on the leader, at each reclaim pass.
// A region the broker cannot reach keeps its jobs charged for the policy's
// region_lost_timeout. Then each job the broker dispatched there (meta
// nomad-gpu.dispatched-region) that is to be requeued goes back to the
// queue, to be dispatched again, and stops being charged there. The others
// stay charged until the region comes back. Once it has, a job that now runs
// in two regions is found by its dispatch id, and the copy with the earlier
// one is stopped. A requeued copy still waiting in the queue is withdrawn,
// the job running on where it was. Each act is written to the audit trail.
type RegionLoss struct {
	Log      hclog.Logger
	Policies policy.Source
	Regions  interface {
		Names() []string
		Unreachable(region string) (time.Time, string)
		Reached(region string) bool
		DispatchedIn(region string) []*api.Job
		DispatchedElsewhere(region, namespace, id string) *api.Job
		LoseIn(region, namespace, id string)
	}
	Queue interface {
		Put(ctx context.Context, e queue.Entry) error
		List(ctx context.Context) ([]queue.Entry, error)
		Remove(ctx context.Context, e queue.Entry) (bool, error)
	}
	// Stop stops a job in region, saying what Nomad did.
	Stop  func(ctx context.Context, region, namespace, id string) (string, error)
	Audit *audit.Log
	// requeued are the ids of the entries this leader put back in the
	// queue, until their region came back.
	requeued map[string]bool
}

// Observed implements Watcher.
func (l *RegionLoss) Observed(ctx context.Context, now time.Time, _ []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	p := l.Policies.Current()
	var errs []error
	for _, region := range l.Regions.Names() {
		since, why := l.Regions.Unreachable(region)
		switch {
		case !since.IsZero() && now.Sub(since) >= p.RegionLostTimeout:
			for _, job := range l.Regions.DispatchedIn(region) {
				errs = append(errs, l.lost(ctx, p, region, job, since, why))
			}
		case since.IsZero() && l.Regions.Reached(region):
			for _, job := range l.Regions.DispatchedIn(region) {
				errs = append(errs, l.back(ctx, region, job))
			}
		}
	}
	return errors.Join(errs...)
}

// lostEntryID is the queue entry a job dispatched as id to region is
// requeued as: the same whichever leader requeues it.
func lostEntryID(region, dispatchID string) string {
	return "region-lost-" + region + "-" + dispatchID
}

// lost requeues job, of region lost since since, if the policy says so and
// it runs nowhere else yet.
func (l *RegionLoss) lost(ctx context.Context, p *policy.Policy, region string, job *api.Job, since time.Time, why string) error {
	ns, id := nomadjob.Namespace(job), *job.ID
	if p.OnRegionLossFor(ns, job.Meta[nomadjob.MetaQueue], deref(job.Type)) != policy.RegionLossRequeue || deref(job.ParentID) != "" {
		return nil // held, charged, until the region comes back (a dispatched or periodic child is not registered by itself)
	}
	if l.Regions.DispatchedElsewhere(region, ns, id) != nil {
		l.Regions.LoseIn(region, ns, id) // requeued by an earlier leader, and dispatched again
		return nil
	}
	submitted := since
	if job.SubmitTime != nil {
		submitted = time.Unix(0, *job.SubmitTime).UTC() // its place in the queue kept
	}
	e, err := requeued(p, job, lostEntryID(region, job.Meta[nomadjob.MetaDispatchID]), "gpu-broker (on_region_loss)", submitted)
	if err != nil {
		return fmt.Errorf("requeue %s/%s from region %s: %w", ns, id, region, err)
	}
	e.Reason = fmt.Sprintf("requeued: region %s unreachable since %s (%s), past region_lost_timeout %s", region,
		since.UTC().Format(time.RFC3339), why, p.RegionLostTimeout)
	if err := l.Queue.Put(ctx, e); err != nil {
		return fmt.Errorf("requeue %s/%s from region %s: %w", ns, id, region, err)
	}
	l.audit(audit.RegionLost, e.ID, ns, id, e.Reason)
	if l.requeued == nil {
		l.requeued = map[string]bool{}
	}
	l.requeued[e.ID] = true
	l.Regions.LoseIn(region, ns, id)
	return nil
}

// back settles job, of region, which is reachable again: a later dispatch of
// it elsewhere stops this copy; else a requeued copy still queued is
// withdrawn.
func (l *RegionLoss) back(ctx context.Context, region string, job *api.Job) error {
	ns, id, dispatch := nomadjob.Namespace(job), *job.ID, job.Meta[nomadjob.MetaDispatchID]
	if other := l.Regions.DispatchedElsewhere(region, ns, id); other != nil && other.Meta[nomadjob.MetaDispatchID] > dispatch {
		stopped, err := l.Stop(ctx, region, ns, id)
		if err != nil {
			return fmt.Errorf("stop %s/%s in region %s, a stale copy: %w", ns, id, region, err)
		}
		result := fmt.Sprintf("region %s came back running a stale copy (dispatch %s; the job was dispatched again, as %s, to region %s): %s",
			region, dispatch, other.Meta[nomadjob.MetaDispatchID], deref(other.Region), stopped)
		l.audit(audit.RegionStale, "", ns, id, result)
		return nil
	}
	entryID := lostEntryID(region, dispatch)
	if !l.requeued[entryID] {
		return nil
	}
	entries, err := l.Queue.List(ctx)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.ID == entryID {
			if ok, err := l.Queue.Remove(ctx, e); err != nil || !ok {
				return err // taken meanwhile: a copy dispatched now is the later, and this one is stopped next pass
			}
			l.audit(audit.RegionStale, e.ID, ns, id, fmt.Sprintf("region %s came back running the job: its requeued copy, still queued, withdrawn", region))
		}
	}
	delete(l.requeued, entryID)
	return nil
}

func (l *RegionLoss) audit(what, entry, ns, id, result string) {
	if err := l.Audit.Write(audit.Event{Who: audit.BrokerAct, What: what, ID: entry, Namespace: ns, Job: id, Result: result}); err != nil {
		l.Log.Warn("audit trail", "error", err)
	}
	l.Log.Info(result, "namespace", ns, "job", id)
}

// cloneGroups copies groups deep enough for Unpin, which replaces each
// group's constraints.
func cloneGroups(groups []*api.TaskGroup) []*api.TaskGroup {
	out := make([]*api.TaskGroup, len(groups))
	for i, tg := range groups {
		if tg != nil {
			c := *tg
			out[i] = &c
		}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
