package reclaimer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Requeue carries out action requeue: the job goes back to the broker's
// queue as Nomad has it, and is then stopped in Nomad (not purged). It keeps
// its submit time for its place, except work requeued to make room, which
// goes to the back: its age would otherwise put it before the job it made
// room for. The queue entry takes the decision's id, so that a leader acting
// again after a crash writes the same entry once.
type Requeue struct {
	Jobs interface {
		Job(ctx context.Context, namespace, id string) (*api.Job, error)
	}
	Actor Actor
	Queue interface {
		Put(ctx context.Context, e queue.Entry) error
	}
	Policies policy.Source
	// Preempted counts a preemption of a borrowed job (rule
	// preempted-borrowed) for its re-borrow backoff, once per decision,
	// and returns the job's count (nil: not counted).
	Preempted func(ctx context.Context, namespace, id, decision string, at time.Time) (int, error)
}

// Requeue implements Requeuer.
func (q *Requeue) Requeue(ctx context.Context, rec reclaim.Record) (string, error) {
	job, err := q.Jobs.Job(ctx, rec.Namespace, rec.Job)
	if err != nil {
		return "", err
	}
	if job == nil {
		return "the job is gone: nothing to requeue", nil
	}
	if job.Stop != nil && *job.Stop {
		return "the job had stopped: requeued as " + rec.ID + " if it was this decision that stopped it", nil
	}
	submitted := rec.ProposedAt
	if job.SubmitTime != nil && rec.Rule != policy.MakeRoom.Name {
		submitted = time.Unix(0, *job.SubmitTime).UTC()
	}
	e, err := requeued(q.Policies.Current(), job, rec.ID, "gpu-broker (rule "+rec.Rule+")", submitted)
	if err != nil {
		return "", err
	}
	if rec.Tenant != "" {
		e.Tenant, e.Queue = rec.Tenant, rec.Queue
	}
	reason := "requeued by rule " + rec.Rule + ": " + rec.Evidence
	if rec.Rule == policy.PreemptedBorrowed.Name && q.Preempted != nil {
		n, err := q.Preempted(ctx, rec.Namespace, rec.Job, rec.ID, rec.ProposedAt)
		if err != nil {
			return "", err
		}
		if b := admission.BackoffFor(q.Policies.Current().Borrowing, n, rec.ProposedAt, rec.ProposedAt); b != nil {
			reason += "; " + b.Text()
		}
	}
	e.Reason = reason
	if job.JobModifyIndex != nil {
		e.Stopping, e.StoppingSince = *job.JobModifyIndex, rec.ActingSince
		if e.StoppingSince.IsZero() {
			e.StoppingSince = rec.ProposedAt
		}
	}
	if err := q.Queue.Put(ctx, e); err != nil {
		return "", err
	}
	stopped, err := q.Actor.StopJob(ctx, rec.Namespace, rec.Job)
	if err != nil {
		return "", err
	}
	return "requeued as " + rec.ID + "; " + stopped, nil
}

// in is q for a job of another region, read and stopped there.
func (q *Requeue) in(a RegionalActor) *Requeue {
	c := *q
	c.Jobs, c.Actor = a, a
	return &c
}

// requeued is the queue entry id that puts job, as Nomad has it, back in the
// queue: its tenant and queue by the policy, its GPUs counted whole (the
// queue decides again on admission), submitted by by at submitted.
func requeued(p *policy.Policy, job *api.Job, id, by string, submitted time.Time) (queue.Entry, error) {
	a, err := nomadjob.Admission(job, nil)
	if err != nil {
		return queue.Entry{}, fmt.Errorf("read the job's demand: %w", err)
	}
	demand := 0.0
	for _, g := range a.Groups {
		demand += float64(g.Count * g.GPUsPerAlloc)
	}
	if job.Meta[nomadjob.MetaDispatched] != "" {
		// The broker chose its region: it chooses again, with the job's
		// node pins, which are that region's, taken off.
		spec := *job
		spec.Region, spec.TaskGroups = nil, cloneGroups(job.TaskGroups)
		nomadjob.Unpin(&spec)
		job = &spec
	}
	body, err := json.Marshal(map[string]any{"Job": job})
	if err != nil {
		return queue.Entry{}, err
	}
	e := queue.Entry{ID: id, JobID: *job.ID, Namespace: nomadjob.Namespace(job), Demand: demand, SubmittedBy: by, SubmittedAt: submitted, Request: body}
	if t := p.TenantOf(e.Namespace); t != nil {
		e.Tenant, e.Queue = t.Name, job.Meta[nomadjob.MetaQueue]
		if e.Queue == "" {
			e.Queue = t.DefaultQueue()
		}
	}
	return e, nil
}
