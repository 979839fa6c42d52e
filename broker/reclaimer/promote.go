package reclaimer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// PromoteJobs is where the promoter reads a job and registers it again.
type PromoteJobs interface {
	// Job returns the job Nomad has, or nil if none.
	Job(ctx context.Context, namespace, id string) (*api.Job, error)
	Register(ctx context.Context, namespace string, body []byte) (uint64, error)
}

// Grants keeps what the broker admitted beside a job's stamp.
type Grants interface {
	Get(ctx context.Context, namespace, job string) (nomadjob.ScaleGrant, bool, error)
	Put(ctx context.Context, namespace, job string, g nomadjob.ScaleGrant) error
}

// Promoter runs on within their tenant's guarantee the running borrowed jobs
// that borrowing.promote_below promotes (admission.Promotions): each is
// registered again at its queue's band with nothing else changed, which
// Nomad applies to its allocations in place, and no other tenant's work
// preempts it any more. The stamp stays (a meta change would replace the
// allocations); a grant under <prefix>scaled/ records the priority it was
// made for.
type Promoter struct {
	Log      hclog.Logger
	Policies policy.Source
	Usage    interface {
		UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	}
	Jobs    PromoteJobs
	Grants  Grants
	Stamper nomadjob.Stamper
	// Lock holds off other decisions on the job meanwhile (the gate's too).
	Lock  func(namespace, id string) (unlock func())
	Audit *audit.Log
}

// Observed implements Watcher.
func (pr *Promoter) Observed(ctx context.Context, _ time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) error {
	p := pr.Policies.Current()
	if p.Borrowing.PromoteBelow <= 0 {
		return nil
	}
	running := runningBorrowed(allocs, gpus)
	if len(running) == 0 {
		return nil
	}
	guaranteed := map[string]float64{}
	for name, tu := range pr.Usage.UsageWithout(p, "", "").Tenants {
		guaranteed[name] = tu.Used.Total() - tu.Borrowed.Total()
	}
	var errs []error
	for _, pm := range admission.Promotions(p, guaranteed, running) {
		if err := pr.promote(ctx, pm); err != nil {
			errs = append(errs, fmt.Errorf("promote %s/%s: %w", pm.Namespace, pm.ID, err))
		}
	}
	return errors.Join(errs...)
}

// runningBorrowed are the jobs admitted borrowed whose allocations all
// run, by job, since the last of them started.
func runningBorrowed(allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) []admission.Running {
	byJob := map[[2]string]*admission.Running{}
	var order [][2]string
	for _, a := range allocs {
		if a.Undeclared != "" || !a.Admitted || a.Tenant == "" {
			continue
		}
		key := [2]string{a.Namespace, a.JobID}
		r, ok := byJob[key]
		if !ok {
			r = &admission.Running{Namespace: a.Namespace, ID: a.JobID, Tenant: a.Tenant, Queue: a.Queue}
			byJob[key], order = r, append(order, key)
		}
		if !a.Borrowed || a.Preempted || a.StartedAt.IsZero() {
			r.Tenant = "" // not all of it runs borrowed
			continue
		}
		for _, id := range a.GPUs {
			r.GPUs += gpus[id].Share()
		}
		if a.StartedAt.After(r.Since) {
			r.Since = a.StartedAt
		}
	}
	var out []admission.Running
	for _, key := range order {
		if r := byJob[key]; r.Tenant != "" {
			out = append(out, *r)
		}
	}
	return out
}

// promote registers the job again at pm.Priority if Nomad still runs the
// version admitted borrowed, after recording the grant that keeps its stamp
// verifiable.
func (pr *Promoter) promote(ctx context.Context, pm admission.Promotion) error {
	defer pr.Lock(pm.Namespace, pm.ID)()
	job, err := pr.Jobs.Job(ctx, pm.Namespace, pm.ID)
	if err != nil || job == nil || job.Priority == nil || job.JobModifyIndex == nil || (job.Stop != nil && *job.Stop) ||
		job.Meta[nomadjob.MetaBorrowed] != "true" || job.Meta[nomadjob.MetaTenant] != pm.Tenant {
		return err // gone, stopped or changed since observed: nothing to do
	}
	counts := nomadjob.GPUGroupCounts(job)
	grant := nomadjob.ScaleGrant{Stamp: job.Meta[nomadjob.MetaAdmission], Stamped: counts, Admitted: counts, StampedPriority: *job.Priority}
	if !pr.Stamper.Verify(job) {
		g, ok, err := pr.Grants.Get(ctx, pm.Namespace, pm.ID)
		if err != nil {
			return err
		}
		if !ok || g.StampedPriority != 0 || !pr.Stamper.VerifyScaled(job, g) {
			return nil // not the broker's borrowed admission as it stands, or promoted already
		}
		grant.Stamped, grant.Parent = g.Stamped, g.Parent
	}
	if err := pr.Grants.Put(ctx, pm.Namespace, pm.ID, grant); err != nil {
		return err
	}
	from := *job.Priority
	job.Priority = &pm.Priority
	body, err := json.Marshal(api.JobRegisterRequest{Job: job, EnforceIndex: true, JobModifyIndex: *job.JobModifyIndex})
	if err != nil {
		return err
	}
	if _, err := pr.Jobs.Register(ctx, pm.Namespace, body); err != nil {
		return err // the grant names the priority the job still runs at: it verifies as before
	}
	result := fmt.Sprintf("promoted in place from priority %d to %d: with its %s GPUs, its tenant's work within the guarantee stays within promote_below = %s of it",
		from, pm.Priority, strconv.FormatFloat(pm.GPUs, 'g', -1, 64), strconv.FormatFloat(pr.Policies.Current().Borrowing.PromoteBelow, 'g', -1, 64))
	pr.Log.Info("borrowed job promoted within its tenant's guarantee", "namespace", pm.Namespace, "job", pm.ID, "tenant", pm.Tenant,
		"queue", pm.Queue, "from", from, "to", pm.Priority)
	pr.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.Promotion, Namespace: pm.Namespace, Job: pm.ID, Tenant: pm.Tenant,
		Queue: pm.Queue, Result: result})
	return nil
}
