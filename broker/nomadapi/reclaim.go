package nomadapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Allocations is where the observer finds the GPU allocations and the
// health of each GPU: the cluster view, kept from Nomad's event stream.
type Allocations interface {
	Synced() bool
	GPUAllocs() []cluster.Alloc
	NodeGPUs(nodeID string) map[string]cluster.GPU
}

// Observer gives the reclaim rules what they look at: every GPU allocation
// (from the view), its job's admission (read from Nomad once per job
// version), and for each node holding running GPU allocations one stats
// call, which carries every GPU's utilisation.
type Observer struct {
	Client *Client
	View   Allocations
	// Verify checks a job's admission.
	Verify func(context.Context, *api.Job) bool

	jobs map[[2]string]observedJob
}

// observedJob is what a job version says about its allocations.
type observedJob struct {
	index             uint64 // JobModifyIndex it was read at
	stopped, admitted bool
	borrowed          bool
	tenant, queue     string
	workload          string
	ttl               time.Duration
}

// Observe implements reclaimer.Observer.
func (o *Observer) Observe(ctx context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error) {
	if !o.View.Synced() {
		return nil, nil, errors.New("the cluster view has not listed Nomad yet")
	}
	seen := map[[2]string]observedJob{}
	nodes := map[string]bool{}
	var allocs []reclaim.Alloc
	for _, s := range o.View.GPUAllocs() {
		key := [2]string{s.Namespace, s.JobID}
		job, ok := seen[key]
		if !ok {
			var err error
			if job, err = o.job(ctx, key, s.JobIndex); err != nil {
				return nil, nil, err
			}
			seen[key] = job
		}
		if s.Preempted && (job.stopped || job.index > s.CreateIndex) {
			// Stopped (requeued already, or by its owner), or registered
			// again since: that preemption has been dealt with.
			continue
		}
		a := reclaim.Alloc{ID: s.ID, Namespace: s.Namespace, JobID: s.JobID, Group: s.Group, GPUs: s.GPUs, Preempted: s.Preempted,
			StartedAt: s.StartedAt, Restarts: s.Restarts, TTL: job.ttl}
		if job.admitted {
			a.Admitted, a.Borrowed = true, job.borrowed
			a.Tenant, a.Queue, a.Workload = job.tenant, job.queue, job.workload
		}
		allocs = append(allocs, a)
		if !s.Preempted {
			nodes[s.NodeID] = true
		}
	}
	o.jobs = seen
	gpus := map[string]reclaim.GPU{}
	for node := range nodes {
		o.node(ctx, node, gpus)
	}
	return allocs, gpus, nil
}

// job is what the job's version at index says; read from Nomad when that
// version was not read before, or the view holds no live version (index 0).
func (o *Observer) job(ctx context.Context, key [2]string, index uint64) (observedJob, error) {
	if j, ok := o.jobs[key]; ok && index != 0 && j.index == index {
		return j, nil
	}
	job, err := o.Client.Job(ctx, key[0], key[1])
	if err != nil {
		return observedJob{}, err
	}
	if job == nil {
		return observedJob{stopped: true}, nil // purged
	}
	out := observedJob{stopped: job.Stop != nil && *job.Stop}
	if job.JobModifyIndex != nil {
		out.index = *job.JobModifyIndex
	}
	if o.Verify(ctx, job) {
		out.admitted, out.borrowed = true, job.Meta[nomadjob.MetaBorrowed] == "true"
		out.tenant, out.queue, out.workload = job.Meta[nomadjob.MetaTenant], job.Meta[nomadjob.MetaQueue], job.Meta[nomadjob.MetaWorkload]
	}
	if ttl, err := time.ParseDuration(job.Meta[nomadjob.MetaTTL]); err == nil && ttl > 0 {
		out.ttl = ttl
	}
	return out, nil
}

// node adds the GPUs of a node: health from the view, utilisation from its
// client's stats. A GPU without stats gets none (it is then never idle).
func (o *Observer) node(ctx context.Context, id string, gpus map[string]reclaim.GPU) {
	util := map[string]float64{}
	if stats, err := o.Client.api.Nodes().Stats(id, (&api.QueryOptions{}).WithContext(ctx)); err == nil {
		for _, g := range stats.DeviceStats {
			for dev, st := range g.InstanceStats {
				if st != nil && st.Summary != nil && st.Summary.IntNumeratorVal != nil {
					util[dev] = float64(*st.Summary.IntNumeratorVal)
				}
			}
		}
	}
	for dev, g := range o.View.NodeGPUs(id) {
		u, ok := util[dev]
		if !ok {
			u = 100 // no sample: not idle
		}
		gpus[dev] = reclaim.GPU{Utilization: u, Healthy: g.Healthy, Model: g.Model, Replicas: g.Replicas}
	}
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
