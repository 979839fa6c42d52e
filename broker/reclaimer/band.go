package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// PromoteJobs is where the bander reads a job and registers it again.
type PromoteJobs interface {
	// JobDoc returns the job as Nomad sent it, and as read; nil if none.
	// The bander registers the document with its priority changed, so
	// that fields of a newer Nomad than the broker knows stay as they are.
	JobDoc(ctx context.Context, namespace, id string) (*jsondoc.Doc, *api.Job, error)
	// RegisterAt registers job (its JSON) if Nomad's version is still the
	// one at index, and returns the new one's.
	RegisterAt(ctx context.Context, namespace string, job []byte, index uint64) (uint64, error)
}

// Bander moves running borrowed jobs to another priority, in place: Nomad
// applies a change of priority alone to a job's allocations without
// replacing them. It promotes to their queue's band those that
// borrowing.promote_below (or their workload's own) runs on within their
// tenant's guarantee (admission.Promotions): no other tenant's work
// preempts them any more.
// With borrowing.sub_bands it moves the others to the sub-band of the work a
// preemption would lose (policy.SubBand), so that Nomad takes the cheapest
// victims first. The stamp stays (a meta change would replace the
// allocations); a grant under <prefix>scaled/ records the priority it was
// made for and the one the job runs at. It does so in every region
// governed (a tenant's guarantee counts them all), each job through its own
// region's client.
type Bander struct {
	Log      hclog.Logger
	Policies policy.Source
	// Usage is every region's: a tenant's work within its guarantee counts
	// all of them.
	Usage interface {
		UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	}
	Jobs PromoteJobs // the broker's own region's
	// Elsewhere are the other regions' clients, by name (none: one region).
	Elsewhere map[string]PromoteJobs
	Grants    decide.GrantRecords
	Stops     decide.Stops // nil: none kept
	// Writes record the versions the bander makes (nil: none kept).
	Writes  decide.RegistrationRecords
	Stamper nomadjob.Stamper
	// Lock holds off other decisions on the job meanwhile (the gate's too).
	Lock  func(namespace, id string) (unlock func())
	Audit *audit.Log
}

// EveryRegion: borrowed work is moved in whichever region it runs.
func (*Bander) EveryRegion() {}

// Observed implements Watcher.
func (b *Bander) Observed(ctx context.Context, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) error {
	p := b.Policies.Current()
	promotes := p.MaxPromoteBelow() > 0
	if !promotes && !p.Borrowing.SubBands {
		return nil
	}
	running := runningBorrowed(allocs, gpus)
	if len(running) == 0 {
		return nil
	}
	var errs []error
	promoted := map[[3]string]bool{}
	if promotes {
		guaranteed := map[string]float64{}
		for name, tu := range b.Usage.UsageWithout(p, "", "").Tenants {
			guaranteed[name] = tu.Used.Total() - tu.Borrowed.Total()
		}
		for _, pm := range admission.Promotions(p, guaranteed, running) {
			promoted[[3]string{pm.Region, pm.Namespace, pm.ID}] = true
			if err := b.move(ctx, pm.Running, pm.Priority, false, now); err != nil {
				errs = append(errs, fmt.Errorf("promote %s/%s%s: %w", pm.Namespace, pm.ID, inRegion(pm.Region), err))
			}
		}
	}
	for _, r := range running {
		if !p.Borrowing.SubBands || promoted[[3]string{r.Region, r.Namespace, r.ID}] {
			continue
		}
		if to := p.SubBand(r.GPUs, now.Sub(r.Since)); to != r.Priority {
			if err := b.move(ctx, r, to, true, now); err != nil {
				errs = append(errs, fmt.Errorf("move %s/%s%s to sub-band %d: %w", r.Namespace, r.ID, inRegion(r.Region), to, err))
			}
		}
	}
	return errors.Join(errs...)
}

// runningBorrowed are the jobs admitted borrowed whose allocations all
// run, by job and region, since the last of them started.
func runningBorrowed(allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) []admission.Running {
	byJob := map[[3]string]*admission.Running{}
	var order [][3]string
	for _, a := range allocs {
		if a.Undeclared != "" || !a.Admitted || a.Tenant == "" {
			continue
		}
		key := [3]string{a.Region, a.Namespace, a.JobID}
		r, ok := byJob[key]
		if !ok {
			r = &admission.Running{Namespace: a.Namespace, ID: a.JobID, Region: a.Region, Tenant: a.Tenant, Queue: a.Queue, Priority: a.Priority}
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

// move registers the job again at priority to, in a sub-band or promoted,
// if Nomad still runs it as the broker admitted it borrowed, after
// recording the grant that keeps its stamp verifiable.
func (b *Bander) move(ctx context.Context, r admission.Running, to int, subBand bool, now time.Time) error {
	defer b.Lock(r.Namespace, r.ID)()
	jobs := b.Jobs
	if r.Region != "" {
		if jobs = b.Elsewhere[r.Region]; jobs == nil {
			return fmt.Errorf("region %q is not governed", r.Region)
		}
	}
	doc, job, err := jobs.JobDoc(ctx, r.Namespace, r.ID)
	if err != nil || job == nil || job.Priority == nil || job.JobModifyIndex == nil || (job.Stop != nil && *job.Stop) ||
		job.Meta[nomadjob.MetaBorrowed] != "true" || job.Meta[nomadjob.MetaTenant] != r.Tenant || *job.Priority == to {
		return err // gone, stopped, changed or moved since observed: nothing to do
	}
	from := *job.Priority
	counts := nomadjob.GPUGroupCounts(job)
	grant := nomadjob.ScaleGrant{Stamp: job.Meta[nomadjob.MetaAdmission], Stamped: counts, Admitted: counts,
		StampedPriority: from, Priority: to, From: from, SubBand: subBand}
	ref := nomadjob.Ref{Region: r.Region, Namespace: r.Namespace, ID: r.ID}
	a, err := decide.Check(ctx, b.Stamper, decide.Records{Grants: b.Grants, Stops: b.Stops, Registrations: b.Writes}, job)
	switch {
	case err != nil:
		return err
	case !a.OK || !a.Borrowed:
		return nil // not the broker's borrowed admission as it stands, or promoted already
	case a.ByGrant:
		grant.Stamped, grant.Parent = a.Grant.Stamped, a.Grant.Parent
		if a.Grant.StampedPriority != 0 {
			grant.StampedPriority = a.Grant.StampedPriority
		}
	}
	if err := b.Grants.Put(ctx, ref, grant); err != nil {
		return err
	}
	doc.Root().Set("Priority", to)
	if err := register(ctx, jobs, b.Writes, ref, doc.Bytes(), *job.JobModifyIndex, now); err != nil {
		return err // the grant verifies the job at from as well, where it still runs
	}
	if subBand {
		b.Log.Debug("borrowed job moved to the sub-band of the work at stake", "region", r.Region, "namespace", r.Namespace, "job", r.ID, "tenant", r.Tenant,
			"gpus", r.GPUs, "running_since", r.Since, "from", from, "to", to)
		return nil
	}
	result := fmt.Sprintf("promoted in place%s from priority %d to %d: with its %s GPUs, its tenant's work within the guarantee stays within promote_below = %s of it",
		inRegion(r.Region), from, to, strconv.FormatFloat(r.GPUs, 'g', -1, 64), strconv.FormatFloat(b.Policies.Current().PromoteBelow(r.Queue), 'g', -1, 64))
	b.Log.Info("borrowed job promoted within its tenant's guarantee", "region", r.Region, "namespace", r.Namespace, "job", r.ID, "tenant", r.Tenant,
		"queue", r.Queue, "from", from, "to", to)
	b.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.Promotion, Namespace: r.Namespace, Job: r.ID, Tenant: r.Tenant,
		Queue: r.Queue, Result: result})
	return nil
}

// register registers job (the JSON of a new version of job ref) with jobs
// if Nomad's version is still the one at index, recorded as the broker's
// own write (decide.Rewrite).
func register(ctx context.Context, jobs PromoteJobs, writes decide.RegistrationRecords, ref nomadjob.Ref, job []byte, index uint64, now time.Time) error {
	settle, err := decide.Rewrite(ctx, writes, ref, now)
	if err != nil {
		return err
	}
	made, err := jobs.RegisterAt(ctx, ref.Namespace, job, index)
	if err != nil {
		made = 0
	}
	return errors.Join(err, settle(made))
}
