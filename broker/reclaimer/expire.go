package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// ExpiredRule names the reclaim decision that requeues a job whose
// approval for GPUs above its tenant's limit expired.
const ExpiredRule = "approval-expired"

// Jobs is what expiry looks at: whether a job is live, and its tenant's usage.
type Jobs interface {
	// JobRegion is the region governed that holds the live GPU job ("":
	// the broker's own); ok is false where none does.
	JobRegion(namespace, id string) (region string, ok bool)
	// UsageWithout counts every region governed.
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
}

// Approvals are where the expirer reads approvals, marks them expired and
// deletes them.
type Approvals interface {
	Current() []approval.Approval
	Get(ctx context.Context, id string) (approval.Approval, error)
	Update(ctx context.Context, a approval.Approval) (bool, error)
	Delete(ctx context.Context, a approval.Approval) (bool, error)
}

// Expirer, on the leader, marks granted approvals expired once their time
// is up, with nobody acting. A job that GPUs above its tenant's limit let in
// is then requeued when its tenant still holds more than its limit. A
// reclaim decision (rule approval-expired) stops it and puts it back in the
// queue, where it waits for its tenant's own GPUs like any job.
type Expirer struct {
	Store    Approvals
	Jobs     Jobs
	Policies policy.Source
	Records  interface {
		Create(ctx context.Context, r reclaim.Record) (bool, error)
	}
	NewID func() string
	Audit *audit.Log
}

// A request nobody decided expires after approval.PendingFor; denied and
// expired ones are deleted after the reclaim retention (the audit trail
// keeps what became of each).
// Observed implements Watcher.
func (e *Expirer) Observed(ctx context.Context, now time.Time, _ []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	var errs []error
	retention := e.Policies.Current().ReclaimSettings.Retention
	for _, a := range e.Store.Current() {
		switch expire, remove := a.Settled(now, retention); {
		case expire:
			errs = append(errs, e.expire(ctx, a.ID, now))
		case remove:
			if _, err := e.Store.Delete(ctx, a); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (e *Expirer) expire(ctx context.Context, id string, now time.Time) error {
	a, err := e.Store.Get(ctx, id)
	if err != nil {
		return err
	}
	if expire, _ := a.Settled(now, 0); !expire {
		return nil // decided meanwhile
	}
	if a.State == approval.Pending {
		a.State, a.ExpiresAt = approval.Expired, now.UTC()
		if ok, err := e.Store.Update(ctx, a); err != nil || !ok {
			return err
		}
		e.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.ApprovalExpire, ID: a.ID, Namespace: a.Namespace, Job: a.Job,
			Result: "expired undecided after " + approval.PendingFor.String()})
		return nil
	}
	a.State = approval.Expired
	if ok, err := e.Store.Update(ctx, a); err != nil || !ok {
		return err // changed meanwhile: the next pass looks again
	}
	p := e.Policies.Current()
	t := p.TenantOf(a.Namespace)
	result := "expired"
	region, live := e.Jobs.JobRegion(a.Namespace, a.Job)
	if a.ExtraGPUs > 0 && t != nil && live {
		used := e.Jobs.UsageWithout(p, a.Namespace, "").Tenants[t.Name].Used.Total()
		if limit := t.Limit.Total(); used > limit {
			d := reclaim.Decision{Rule: ExpiredRule, Action: policy.ActionRequeue, Mode: policy.ModeEnforce, Namespace: a.Namespace,
				JobID: a.Job, Region: region, WholeJob: true, Tenant: t.Name, ActAfter: now,
				Evidence: fmt.Sprintf("approval %s (%d GPUs above the limit) expired at %s; tenant %q holds %g GPUs, its limit is %g",
					a.ID, a.ExtraGPUs, a.ExpiresAt.Format(time.RFC3339), t.Name, used, limit)}
			rec := reclaim.NewRecord(e.NewID(), d, now)
			if _, err := e.Records.Create(ctx, rec); err != nil {
				return fmt.Errorf("requeue %s/%s after its approval expired: %w", a.Namespace, a.Job, err)
			}
			result = "expired; the job is requeued (reclaim decision " + rec.ID + ")"
		}
	}
	e.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.ApprovalExpire, ID: a.ID, Namespace: a.Namespace, Job: a.Job,
		Result: result})
	return nil
}
