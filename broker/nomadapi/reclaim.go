package nomadapi

import (
	"context"
	"errors"
	"fmt"
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
	EndedAllocs() []cluster.Alloc
	NodeGPUs(nodeID string) map[string]cluster.GPU
	GPUNodes() []string
	UndeclaredJobs() map[[2]string]string
}

// Observer gives the reclaim rules what they look at: every GPU allocation
// (from the view), its job's admission (read from Nomad once per job
// version), and for each node with GPUs one stats call. That call carries
// every GPU's utilisation, memory, temperature and power.
type Observer struct {
	Client *Client
	View   Allocations
	// Verify checks a job's admission, and whether it runs borrowed.
	Verify func(context.Context, *api.Job) (admitted, borrowed bool)
	// Samples, if set, is given each pass's telemetry of every GPU sampled.
	Samples func(map[string]cluster.Sample)

	jobs map[[2]string]observedJob
}

// observedJob is what a job version says about its allocations.
type observedJob struct {
	index             uint64 // JobModifyIndex it was read at
	priority          int
	stopped, admitted bool
	borrowed          bool
	tenant, queue     string
	workload          string
	ttl               time.Duration
	// unadmitted is the job as read when it did not verify: verified again
	// on each pass, since the broker's records of it may change while the
	// version stays (Nomad's revert of it, recorded as the broker's).
	unadmitted *api.Job
}

// Observe implements reclaimer.Observer.
func (o *Observer) Observe(ctx context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error) {
	if !o.View.Synced() {
		return nil, nil, errors.New("the cluster view has not listed Nomad yet")
	}
	seen := map[[2]string]observedJob{}
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
		if s.Preempted && (job.stopped || job.index > s.PreemptedAt) {
			// Stopped (requeued already, or by its owner), or registered
			// again since it was preempted: that preemption has been dealt
			// with.
			continue
		}
		a := reclaim.Alloc{ID: s.ID, Namespace: s.Namespace, JobID: s.JobID, Group: s.Group, GPUs: s.GPUs, Preempted: s.Preempted,
			StartedAt: s.StartedAt, Restarts: s.Restarts, TTL: job.ttl, Priority: job.priority}
		if job.admitted {
			a.Admitted, a.Borrowed = true, job.borrowed
			a.Tenant, a.Queue, a.Workload = job.tenant, job.queue, job.workload
		}
		allocs = append(allocs, a)
	}
	// Jobs that would use GPUs they do not ask for hold none in Nomad's
	// accounting: their running allocations are read from Nomad, and count
	// as unadmitted unless the broker admitted the job (warned).
	for key, how := range o.View.UndeclaredJobs() {
		if _, ok := seen[key]; ok {
			continue // its GPU allocations are above already
		}
		job, err := o.job(ctx, key, 0)
		if err != nil {
			return nil, nil, err
		}
		seen[key] = job
		if job.admitted || job.stopped {
			continue
		}
		stubs, _, err := o.Client.nomad().Jobs().Allocations(key[1], false, (&api.QueryOptions{Namespace: key[0]}).WithContext(ctx))
		if err != nil {
			return nil, nil, fmt.Errorf("read the allocations of %s/%s: %w", key[0], key[1], err)
		}
		for _, st := range stubs {
			if st.ClientStatus == api.AllocClientStatusRunning || st.ClientStatus == api.AllocClientStatusPending {
				allocs = append(allocs, reclaim.Alloc{ID: st.ID, Namespace: key[0], JobID: key[1], Group: st.TaskGroup, Undeclared: how})
			}
		}
	}
	o.jobs = seen
	gpus, samples := map[string]reclaim.GPU{}, map[string]cluster.Sample{}
	for _, node := range o.View.GPUNodes() {
		o.node(ctx, node, gpus, samples)
	}
	if o.Samples != nil {
		o.Samples(samples)
	}
	return allocs, gpus, nil
}

// Ended returns the allocations that stopped holding GPUs lately or are
// being stopped (reclaim.Alloc.EndedAt), charged to their job's tenant and
// queue as they were while running: for the usage ledger, not the rules.
func (o *Observer) Ended() []reclaim.Alloc {
	ended := o.View.EndedAllocs()
	out := make([]reclaim.Alloc, 0, len(ended))
	for _, e := range ended {
		a := reclaim.Alloc{ID: e.ID, Namespace: e.Namespace, JobID: e.JobID, Group: e.Group, GPUs: e.GPUs,
			StartedAt: e.StartedAt, EndedAt: e.EndedAt, Tenant: e.Tenant, Queue: e.Queue, Admitted: e.Tenant != ""}
		if job, ok := o.jobs[[2]string{e.Namespace, e.JobID}]; ok {
			a.Admitted, a.Tenant, a.Queue = job.admitted, job.tenant, job.queue
		}
		out = append(out, a)
	}
	return out
}

// EndedSince lists the GPU allocations that ended since a time, by
// Nomad's own allocation times (those it has not collected yet), charged
// to their job's tenant and queue as the job says now. A ledger that
// resumes after no broker led reads them.
func (o *Observer) EndedSince(ctx context.Context, since time.Time) ([]reclaim.Alloc, error) {
	stubs, _, err := o.Client.nomad().Allocations().List((&api.QueryOptions{Namespace: "*", Params: map[string]string{"resources": "true"},
		Filter: `ClientStatus == "complete" or ClientStatus == "failed" or ClientStatus == "lost"`}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list ended allocations: %w", err)
	}
	jobs := map[[2]string]observedJob{}
	var out []reclaim.Alloc
	for _, s := range stubs {
		e, ok := cluster.EndedAlloc(&api.Allocation{ID: s.ID, Namespace: s.Namespace, JobID: s.JobID, TaskGroup: s.TaskGroup,
			ClientStatus: s.ClientStatus, AllocatedResources: s.AllocatedResources, TaskStates: s.TaskStates, ModifyTime: s.ModifyTime})
		if !ok || e.EndedAt.Before(since) {
			continue
		}
		key := [2]string{e.Namespace, e.JobID}
		job, seen := jobs[key]
		if !seen {
			if job, err = o.job(ctx, key, 0); err != nil {
				return nil, err
			}
			jobs[key] = job
		}
		a := reclaim.Alloc{ID: e.ID, Namespace: e.Namespace, JobID: e.JobID, Group: e.Group, GPUs: e.GPUs, StartedAt: e.StartedAt, EndedAt: e.EndedAt}
		if job.admitted {
			a.Admitted, a.Tenant, a.Queue = true, job.tenant, job.queue
		}
		out = append(out, a)
	}
	return out, nil
}

// job is what the job's version at index says; read from Nomad when that
// version was not read before, or the view holds no live version (index 0).
func (o *Observer) job(ctx context.Context, key [2]string, index uint64) (observedJob, error) {
	if j, ok := o.jobs[key]; ok && index != 0 && j.index == index {
		if j.unadmitted != nil {
			return o.verified(ctx, j.unadmitted), nil
		}
		return j, nil
	}
	job, err := o.Client.Job(ctx, key[0], key[1])
	if err != nil {
		return observedJob{}, err
	}
	if job == nil {
		return observedJob{stopped: true}, nil // purged
	}
	return o.verified(ctx, job), nil
}

// verified is what job, as read from Nomad, says about its allocations.
func (o *Observer) verified(ctx context.Context, job *api.Job) observedJob {
	out := observedJob{stopped: job.Stop != nil && *job.Stop}
	if job.JobModifyIndex != nil {
		out.index = *job.JobModifyIndex
	}
	if job.Priority != nil {
		out.priority = *job.Priority
	}
	if out.admitted, out.borrowed = o.Verify(ctx, job); out.admitted {
		out.tenant, out.queue, out.workload = job.Meta[nomadjob.MetaTenant], job.Meta[nomadjob.MetaQueue], job.Meta[nomadjob.MetaWorkload]
	} else {
		out.unadmitted = job
	}
	if ttl, err := time.ParseDuration(job.Meta[nomadjob.MetaTTL]); err == nil && ttl > 0 {
		out.ttl = ttl
	}
	return out
}

// node adds the GPUs of a node: health from the view, utilisation from its
// client's stats. A GPU without stats gets none (it is then never idle).
func (o *Observer) node(ctx context.Context, id string, gpus map[string]reclaim.GPU, samples map[string]cluster.Sample) {
	stats, err := o.Client.nomad().Nodes().Stats(id, (&api.QueryOptions{}).WithContext(ctx))
	devices := o.View.NodeGPUs(id)
	if err == nil {
		for _, g := range stats.DeviceStats {
			for dev, st := range g.InstanceStats {
				if gpu, ok := devices[dev]; ok && st != nil {
					samples[dev] = sampleOf(id, gpu.Model, st)
				}
			}
		}
	}
	for dev, g := range devices {
		u := 100.0 // no sample: not idle
		if s, ok := samples[dev]; ok && s.Utilization != nil {
			u = *s.Utilization
		}
		gpus[dev] = reclaim.GPU{Utilization: u, Healthy: g.Healthy, Model: g.Model, Replicas: g.Replicas}
	}
}

// Stat names the device plugin reports (as `nomad node status -stats` shows them).
const (
	statMemory         = "Memory state"
	statMemUtil        = "Memory utilization"
	statEncUtil        = "Encoder utilization"
	statDecUtil        = "Decoder utilization"
	statTensorActive   = "Tensor core activity"
	statDriver         = "Driver version"
	statTemperature    = "Temperature"
	statPower          = "Power usage"
	statSMClock        = "SM clock"
	statMemClock       = "Memory clock"
	statLastXID        = "Last XID"
	statECCCorrected   = "ECC corrected errors"
	statECCUncorrected = "ECC uncorrected errors"
	statGPUIndex       = "GPU index"
	statGPUUUID        = "GPU UUID"
	statMIGInstance    = "MIG instance"
	statMIGProfile     = "MIG profile"
)

// sampleOf reads a GPU's stats: the summary is its utilisation; memory and
// power are used / total.
func sampleOf(node, model string, st *api.DeviceStats) cluster.Sample {
	s := cluster.Sample{Node: node, Model: model, At: st.Timestamp}
	s.Utilization, _ = statValue(st.Summary)
	if st.Stats != nil {
		s.MemoryUsedMiB, s.MemoryTotalMiB = statValue(st.Stats.Attributes[statMemory])
		s.TemperatureC, _ = statValue(st.Stats.Attributes[statTemperature])
		s.PowerW, _ = statValue(st.Stats.Attributes[statPower])
		a := st.Stats.Attributes
		s.SMClockMHz, _ = statValue(a[statSMClock])
		s.MemClockMHz, _ = statValue(a[statMemClock])
		s.LastXID, _ = statValue(a[statLastXID])
		s.ECCCorrected, _ = statValue(a[statECCCorrected])
		s.ECCUncorrected, _ = statValue(a[statECCUncorrected])
		s.MemCopyUtil, _ = statValue(a[statMemUtil])
		s.EncoderUtil, _ = statValue(a[statEncUtil])
		s.DecoderUtil, _ = statValue(a[statDecUtil])
		s.TensorActive, _ = statValue(a[statTensorActive])
		s.DriverVersion = statString(a[statDriver])
		s.GPUIndex, _ = statValue(a[statGPUIndex])
		s.MIGInstance, _ = statValue(a[statMIGInstance])
		s.GPUUUID, s.MIGProfile = statString(a[statGPUUUID]), statString(a[statMIGProfile])
	}
	return s
}

// statString is a stat's text ("" where the device reports none).
func statString(v *api.StatValue) string {
	if v == nil || v.StringVal == nil || *v.StringVal == "N/A" {
		return ""
	}
	return *v.StringVal
}

// statValue is a stat's value and, for a fraction, its denominator; nil
// where the device reports none ("N/A").
func statValue(v *api.StatValue) (value, of *float64) {
	if v == nil {
		return nil, nil
	}
	switch {
	case v.IntNumeratorVal != nil:
		value = ptr(float64(*v.IntNumeratorVal))
	case v.FloatNumeratorVal != nil:
		value = ptr(*v.FloatNumeratorVal)
	default:
		return nil, nil
	}
	switch {
	case v.IntDenominatorVal != nil:
		of = ptr(float64(*v.IntDenominatorVal))
	case v.FloatDenominatorVal != nil:
		of = ptr(*v.FloatDenominatorVal)
	}
	return value, of
}

func ptr[T any](v T) *T { return &v }

// StopJob stops (does not purge) a job, unless it has stopped already.
func (c *Client) StopJob(ctx context.Context, namespace, id string) (string, error) {
	job, err := c.Job(ctx, namespace, id)
	if err != nil {
		return "", err
	}
	if job == nil || (job.Stop != nil && *job.Stop) {
		return "already stopped", nil
	}
	evalID, _, err := c.nomad().Jobs().Deregister(id, false, (&api.WriteOptions{Namespace: namespace}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("stop job %s/%s: %w", namespace, id, err)
	}
	return "job stopped, evaluation " + evalID, nil
}

// StopAlloc stops an allocation (Nomad places a replacement as its job
// says), unless it has stopped already.
func (c *Client) StopAlloc(ctx context.Context, id string) (string, error) {
	q := (&api.QueryOptions{Namespace: "*"}).WithContext(ctx)
	alloc, _, err := c.nomad().Allocations().Info(id, q)
	if err != nil {
		if isNotFound(err) {
			return "already gone", nil
		}
		return "", fmt.Errorf("read allocation %s: %w", id, err)
	}
	if alloc.DesiredStatus != api.AllocDesiredStatusRun || alloc.ServerTerminalStatus() || alloc.ClientTerminalStatus() {
		return "already stopped", nil
	}
	resp, err := c.nomad().Allocations().Stop(alloc, (&api.QueryOptions{Namespace: alloc.Namespace}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("stop allocation %s: %w", id, err)
	}
	return "allocation stopped, evaluation " + resp.EvalID, nil
}
