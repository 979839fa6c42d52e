package queue

import "github.com/nomad-gpu/nomad-gpu/broker/admission"

// Pass is the rule a pass through the queue keeps from one entry to the
// next, in admission order. An entry waiting for its tenant's own quota is
// passed over. Once one waits for idle GPUs, nothing behind it is admitted
// borrowed, so that smaller jobs cannot take the GPUs it waits for (aging
// then lifts it above newer work). Jobs within their tenant's guarantee still
// are admitted: they are owed their GPUs and take them back from borrowed
// work. Once one waits for room within its tenant's guarantee, the only way
// it may run (admission.WaitGuarantee: evicted max_preemptions times),
// nothing of that tenant's behind it is admitted. Its newer work, borrowing
// or not, would take that room, and the tenant's own order must hold. The
// leader's admitter and the simulator both walk their queues with it.
type Pass struct {
	waiting bool
	owed    map[string]bool // tenants with an entry that waits for room within their guarantee
}

// Admits says whether a decision made in the pass is carried out (an
// admission not held back, or a rejection), and learns from one that is not.
func (p *Pass) Admits(d admission.Decision) bool {
	switch {
	case d.Outcome == admission.Queue:
		p.waiting = p.waiting || d.WaitsFor == admission.WaitCapacity
		if d.WaitsFor == admission.WaitGuarantee {
			if p.owed == nil {
				p.owed = map[string]bool{}
			}
			p.owed[d.Tenant] = true
		}
		return false
	case d.Outcome == admission.Reject:
		return true
	case p.owed[d.Tenant]:
		return false
	case d.Outcome == admission.AdmitBorrowed:
		return !p.waiting
	}
	return true
}

// HoldsBackBorrowers says an entry ahead waits for idle GPUs: only
// admissions within a guarantee can follow.
func (p *Pass) HoldsBackBorrowers() bool { return p.waiting }

// HoldsBack says an entry of tenant's ahead waits for room within its
// guarantee: nothing more of tenant's is admitted in the pass.
func (p *Pass) HoldsBack(tenant string) bool { return p.owed[tenant] }
