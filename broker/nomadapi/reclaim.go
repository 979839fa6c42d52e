package nomadapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Observer reads what the reclaim rules look at: every running allocation
// that holds GPUs, its job's admission, and for each node with such
// allocations one stats call (utilisation of every GPU) and one node read
// (device health).
type Observer struct {
	Client *Client
	// Verify checks a job's admission.
	Verify func(context.Context, *api.Job) bool
}

// Observe implements reclaimer.Observer.
func (o *Observer) Observe(ctx context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error) {
	q := (&api.QueryOptions{Namespace: "*", Params: map[string]string{"resources": "true"}}).WithContext(ctx)
	stubs, _, err := o.Client.api.Allocations().List(q)
	if err != nil {
		return nil, nil, fmt.Errorf("list allocations: %w", err)
	}
	jobs := map[[2]string]*api.Job{}
	nodes := map[string]bool{}
	var allocs []reclaim.Alloc
	for _, s := range stubs {
		// Pending too: a task waiting to restart holds its GPUs all the same.
		// And preempted ones, for the built-in requeue of borrowed jobs.
		preempted := s.DesiredStatus == api.AllocDesiredStatusEvict && s.PreemptedByAllocation != ""
		if !preempted && (s.DesiredStatus != api.AllocDesiredStatusRun ||
			(s.ClientStatus != api.AllocClientStatusRunning && s.ClientStatus != api.AllocClientStatusPending)) {
			continue
		}
		gpus := gpuIDs(s.AllocatedResources)
		if len(gpus) == 0 {
			continue
		}
		key := [2]string{s.Namespace, s.JobID}
		job, ok := jobs[key]
		if !ok {
			if job, _, err = o.Client.api.Jobs().Info(s.JobID, (&api.QueryOptions{Namespace: s.Namespace}).WithContext(ctx)); err != nil {
				return nil, nil, fmt.Errorf("read job %s/%s: %w", s.Namespace, s.JobID, err)
			}
			jobs[key] = job
		}
		if preempted && ((job.Stop != nil && *job.Stop) || job.Version == nil || s.JobVersion != *job.Version) {
			// Stopped (requeued already, or by its owner), or registered
			// again since: that preemption has been dealt with.
			continue
		}
		a := reclaim.Alloc{ID: s.ID, Namespace: s.Namespace, JobID: s.JobID, Group: s.TaskGroup, GPUs: gpus, Preempted: preempted}
		if o.Verify(ctx, job) {
			a.Admitted, a.Borrowed = true, job.Meta[nomadjob.MetaBorrowed] == "true"
			a.Tenant, a.Queue, a.Workload = job.Meta[nomadjob.MetaTenant], job.Meta[nomadjob.MetaQueue], job.Meta[nomadjob.MetaWorkload]
		}
		if ttl, err := time.ParseDuration(job.Meta[nomadjob.MetaTTL]); err == nil && ttl > 0 {
			a.TTL = ttl
		}
		for _, ts := range s.TaskStates {
			if !ts.StartedAt.IsZero() && (a.StartedAt.IsZero() || ts.StartedAt.Before(a.StartedAt)) {
				a.StartedAt = ts.StartedAt
			}
			for _, ev := range ts.Events {
				if ev.Type == api.TaskRestarting {
					a.Restarts = append(a.Restarts, time.Unix(0, ev.Time))
				}
			}
		}
		allocs = append(allocs, a)
		if !preempted {
			nodes[s.NodeID] = true
		}
	}
	gpus := map[string]reclaim.GPU{}
	for node := range nodes {
		if err := o.node(ctx, node, gpus); err != nil {
			return nil, nil, err
		}
	}
	return allocs, gpus, nil
}

// node adds the GPUs of a node: health from the node, utilisation from its
// client's stats. A GPU without stats gets none (it is then never idle).
func (o *Observer) node(ctx context.Context, id string, gpus map[string]reclaim.GPU) error {
	q := (&api.QueryOptions{}).WithContext(ctx)
	n, _, err := o.Client.api.Nodes().Info(id, q)
	if err != nil {
		return fmt.Errorf("read node %s: %w", id, err)
	}
	util := map[string]float64{}
	if stats, err := o.Client.api.Nodes().Stats(id, q); err == nil {
		for _, g := range stats.DeviceStats {
			for dev, st := range g.InstanceStats {
				if st != nil && st.Summary != nil && st.Summary.IntNumeratorVal != nil {
					util[dev] = float64(*st.Summary.IntNumeratorVal)
				}
			}
		}
	}
	if n.NodeResources == nil {
		return nil
	}
	for _, d := range n.NodeResources.Devices {
		for _, inst := range d.Instances {
			u, ok := util[inst.ID]
			if !ok {
				u = 100 // no sample: not idle
			}
			gpus[inst.ID] = reclaim.GPU{Utilization: u, Healthy: inst.Healthy}
		}
	}
	return nil
}

// gpuIDs are the GPU device ids an allocation holds.
func gpuIDs(r *api.AllocatedResources) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, t := range r.Tasks {
		for _, d := range t.Devices {
			if d.Type == "gpu" {
				out = append(out, d.DeviceIDs...)
			}
		}
	}
	return out
}

// StopJob stops (does not purge) a job, unless it has stopped already.
func (c *Client) StopJob(ctx context.Context, namespace, id string) (string, error) {
	job, err := c.Job(ctx, namespace, id)
	if err != nil {
		return "", err
	}
	if job == nil || (job.Stop != nil && *job.Stop) {
		return "already stopped", nil
	}
	evalID, _, err := c.api.Jobs().Deregister(id, false, (&api.WriteOptions{Namespace: namespace}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("stop job %s/%s: %w", namespace, id, err)
	}
	return "job stopped, evaluation " + evalID, nil
}

// StopAlloc stops an allocation (Nomad places a replacement as its job
// says), unless it has stopped already.
func (c *Client) StopAlloc(ctx context.Context, id string) (string, error) {
	q := (&api.QueryOptions{Namespace: "*"}).WithContext(ctx)
	alloc, _, err := c.api.Allocations().Info(id, q)
	if err != nil {
		var ue api.UnexpectedResponseError
		if errors.As(err, &ue) && ue.StatusCode() == http.StatusNotFound {
			return "already gone", nil
		}
		return "", fmt.Errorf("read allocation %s: %w", id, err)
	}
	if alloc.DesiredStatus != api.AllocDesiredStatusRun || alloc.ServerTerminalStatus() || alloc.ClientTerminalStatus() {
		return "already stopped", nil
	}
	resp, err := c.api.Allocations().Stop(alloc, (&api.QueryOptions{Namespace: alloc.Namespace}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("stop allocation %s: %w", id, err)
	}
	return "allocation stopped, evaluation " + resp.EvalID, nil
}
