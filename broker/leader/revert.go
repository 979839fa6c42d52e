package leader

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Reverts records, on the leader, each revert Nomad makes on its own (a
// deployment with auto_revert failed) as a decision of the broker's. The
// job's stable version was counted against its tenant from the start of the
// deployment, so it is admitted. A tenant above its limit even so (a lowered
// limit, or an update registered straight in Nomad before the broker knew
// the stable version) is recorded as over-limit, and logged as an error.
type Reverts struct {
	Leader   interface{ IsLeader() bool }
	Policies policy.Source
	Usage    func(*policy.Policy) admission.Usage
	Audit    *audit.Log
	Metrics  *metrics.Metrics
	Log      hclog.Logger
	// Writes are the records of the broker's own writes of jobs (nil: none
	// kept): Nomad's revert of a job the broker wrote is recorded in them
	// as the broker's, its version's stamp being the broker's admission.
	Writes decide.RegistrationRecords
	Clock  clock.Clock
}

// Observed implements the view's revert callback (cluster.View.SetReverts).
func (r *Reverts) Observed(rv cluster.Revert) {
	if !r.Leader.IsLeader() {
		return
	}
	r.recordWrite(rv)
	p := r.Policies.Current()
	t := p.TenantOf(rv.Namespace)
	if t == nil {
		return // no tenant's: its GPUs are nobody's to decide on
	}
	used, limit := r.Usage(p).Tenants[t.Name].Used.Total(), t.Limit.Total()
	held := fmt.Sprintf("tenant %q holds %g of its limit of %g GPUs", t.Name, used, limit)
	e := audit.Event{Who: audit.BrokerAct, What: audit.AutoRevert, Namespace: rv.Namespace, Job: rv.JobID, Tenant: t.Name}
	if used > limit+1e-9 {
		e.Rule, e.Result = admission.RuleAboveLimit, fmt.Sprintf("over-limit: deployment %s: %s; %s", rv.Deployment, rv.Description, held)
		r.Audit.Write(e)
		r.Log.Error("Nomad reverted a job above its tenant's limit", "namespace", rv.Namespace, "job", rv.JobID,
			"deployment", rv.Deployment, "tenant", t.Name, "used", used, "limit", limit)
		return
	}
	e.Result = fmt.Sprintf("admit: deployment %s: %s; %s, the stable version counted since the deployment began", rv.Deployment, rv.Description, held)
	r.Audit.Write(e)
	r.Metrics.Admission(metrics.AutoRevert, admission.Decision{Outcome: admission.Admit, Tenant: t.Name})
	r.Log.Info("Nomad reverted a job within its tenant's limit", "namespace", rv.Namespace, "job", rv.JobID,
		"deployment", rv.Deployment, "tenant", t.Name, "used", used, "limit", limit)
}

// RecordWrite implements the view's rollback callback (cluster.View
// .SetRollbacks): the record of the broker's last write of a job Nomad
// rolled back moves to the rollback (recordWrite). On any broker, not the
// leader alone: a view lists before its broker may lead, and a record only
// ever moves forward, to the same index whoever writes it.
func (r *Reverts) RecordWrite(rv cluster.Revert) { r.recordWrite(rv) }

// recordWrite moves the record of the broker's last write of the job to
// the version Nomad reverted to, before the job's new allocations are
// looked at. It is told once the batch with the revert is applied, and
// those come in later ones. A job the broker has no record of, or one it is
// writing now, is left as it is.
func (r *Reverts) recordWrite(rv cluster.Revert) {
	if r.Writes == nil {
		return
	}
	job := nomadjob.Ref{Region: rv.Region, Namespace: rv.Namespace, ID: rv.JobID}
	w, ok := r.Writes.Get(job)
	if !ok || w.Pending || w.Index >= rv.Index {
		return
	}
	if err := r.Writes.Put(context.Background(), job, nomadjob.Registered{Index: rv.Index, At: r.Clock.Now().UTC()}); err != nil {
		r.Log.Error("Nomad reverted a job the broker wrote: the record of it could not be moved; the job may read as unadmitted",
			"namespace", rv.Namespace, "job", rv.JobID, "error", err)
	}
}
