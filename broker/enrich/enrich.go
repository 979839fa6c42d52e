// Package enrich sets on a job what surrounds its admission besides usage:
// the approvals that grant it more, and its re-borrow backoff. The gate, the
// leader's queue pass, `job check` and the simulator all enrich through it,
// so that the simulator decides as the broker does without importing the
// cluster view.
package enrich

import (
	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Enricher sets on a job what surrounds its decision besides usage: what
// the approvals in force grant it, and its re-borrow backoff.
type Enricher struct {
	Approvals   func() []approval.Approval // nil: none
	Preemptions admission.Preemptions      // nil: none kept
	Clock       clock.Clock
}

// Enrich is j with its grants and backoff as they stand now.
func (e Enricher) Enrich(p *policy.Policy, j admission.Job) admission.Job {
	now := e.Clock.Now()
	if e.Approvals != nil {
		j.Granted = approval.For(e.Approvals(), p, j.Namespace, j.ID, now)
	}
	j.Backoff = e.Preemptions.Backoff(p.Borrowing, j.Namespace, j.ID, now)
	return j
}

// Decide is the decision on j, enriched, against usage u: what the
// simulator calls with the usage it keeps, and a preview with the view's.
func (e Enricher) Decide(p *policy.Policy, j admission.Job, u admission.Usage) admission.Decision {
	return admission.Decide(p, e.Enrich(p, j), u)
}
