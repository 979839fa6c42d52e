// Package admitter is the leader's loop that admits queued jobs when quota or
// capacity frees: in queue order, each job whole or not at all, each only once.
package admitter

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Queue is the durable queue.
type Queue interface {
	List(ctx context.Context) ([]queue.Entry, error)
	Remove(ctx context.Context, e queue.Entry) (bool, error)
}

// Registrar registers an admitted job with Nomad.
type Registrar interface {
	Register(ctx context.Context, namespace string, body []byte) error
}

// Cluster is the usage to decide against.
type Cluster interface {
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	ObserveJob(j *api.Job)
}

// Policies gives the policy in force.
type Policies interface{ Current() *policy.Policy }

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
	Policies Policies
	Stamper  nomadjob.Stamper
	Now      func() time.Time
	// Capacity is the number of healthy, schedulable GPUs; when it grows (a GPU
	// recovered, a node came back) Blocked jobs are evaluated again. Optional.
	Capacity func() int
	Blocked  Unblocker
}

// Run makes a pass whenever the cluster changes, and every interval anyway.
func (a *Admitter) Run(ctx context.Context, changed <-chan struct{}, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	lastCapacity := -1
	for {
		if _, err := a.Pass(ctx); err != nil && ctx.Err() == nil {
			a.Log.Warn("queue pass failed", "error", err)
		}
		if a.Capacity != nil && a.Blocked != nil {
			c := a.Capacity()
			if lastCapacity >= 0 && c > lastCapacity {
				n, err := a.Blocked.ReevaluateBlocked(ctx)
				a.Log.Info("healthy GPUs came back, re-evaluated blocked jobs", "gpus", c, "was", lastCapacity, "jobs", n, "error", err)
			}
			lastCapacity = c
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// Pass goes through the queue once in admission order and returns how many jobs
// it admitted. An entry waiting for its tenant's own quota is passed over; one
// waiting for idle GPUs stops the pass, so that smaller jobs behind it cannot
// take the GPUs it waits for (aging then lifts it above newer work).
func (a *Admitter) Pass(ctx context.Context) (int, error) {
	entries, err := a.Queue.List(ctx)
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	p := a.Policies.Current()
	used := map[string]int{}
	for t, tu := range a.Cluster.UsageWithout(p, "", "").Tenants {
		used[t] = tu.Used.Total()
	}
	queue.Order(entries, p, used, a.Now())
	admitted := 0
	for _, e := range entries {
		var req map[string]any
		if err := json.Unmarshal(e.Request, &req); err != nil {
			return admitted, fmt.Errorf("queue entry %s: %w", e.ID, err)
		}
		jobRaw, _ := req["Job"].(map[string]any)
		jobJSON, _ := json.Marshal(jobRaw)
		var job api.Job
		if err := json.Unmarshal(jobJSON, &job); err != nil {
			return admitted, fmt.Errorf("queue entry %s: %w", e.ID, err)
		}
		d := admission.Decide(p, nomadjob.Admission(&job, e.Namespace), a.Cluster.UsageWithout(p, e.Namespace, e.JobID))
		switch d.Outcome {
		case admission.Queue:
			if d.WaitsFor == admission.WaitCapacity {
				return admitted, nil
			}
			continue
		case admission.Reject:
			// The policy changed since it was queued: it can never run as it is.
			if ok, err := a.Queue.Remove(ctx, e); err == nil && ok {
				a.Log.Warn("queue: dropped a job the policy now rejects", "id", e.ID, "job", e.JobID,
					"namespace", e.Namespace, "rule", d.Rule, "reason", d.Reason)
			}
			continue
		}
		nomadjob.Apply(jobRaw, d, a.Stamper.Stamp(e.Namespace, e.JobID, d, a.Now()))
		body, _ := json.Marshal(req)
		// Register first, then remove: a crash in between registers the same job
		// again, which Nomad treats as the same job, never as a second one.
		if err := a.Nomad.Register(ctx, e.Namespace, body); err != nil {
			return admitted, fmt.Errorf("admit queued job %s (%s): %w", e.ID, e.JobID, err)
		}
		if _, err := a.Queue.Remove(ctx, e); err != nil {
			return admitted, err
		}
		job.Priority = &d.Priority
		job.Meta = map[string]string{nomadjob.MetaBorrowed: fmt.Sprint(d.Outcome == admission.AdmitBorrowed)}
		job.Namespace = &e.Namespace
		a.Cluster.ObserveJob(&job)
		admitted++
		a.Log.Info("queue: admitted", "id", e.ID, "job", e.JobID, "namespace", e.Namespace, "outcome", d.Outcome,
			"priority", d.Priority, "waited", a.Now().Sub(e.SubmittedAt).Round(time.Second))
	}
	return admitted, nil
}
