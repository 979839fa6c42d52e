package queue

import "github.com/nomad-gpu/nomad-gpu/broker/admission"

// Pass is the rule a pass through the queue keeps from one entry to the
// next, in admission order: an entry waiting for its tenant's own quota is
// passed over; once one waits for idle GPUs, nothing behind it is admitted
// borrowed, so that smaller jobs cannot take the GPUs it waits for (aging
// then lifts it above newer work), while jobs within their tenant's guarantee
// still are: they are owed their GPUs and take them back from borrowed work.
// The leader's admitter and the simulator both walk their queues with it.
type Pass struct{ waiting bool }

// Admits says whether a decision made in the pass is carried out (an
// admission not held back, or a rejection), and learns from one that is not.
func (p *Pass) Admits(d admission.Decision) bool {
	switch d.Outcome {
	case admission.Queue:
		p.waiting = p.waiting || d.WaitsFor == admission.WaitCapacity
		return false
	case admission.AdmitBorrowed:
		return !p.waiting
	}
	return true
}

// HoldsBackBorrowers says an entry ahead waits for idle GPUs: only
// admissions within a guarantee can follow.
func (p *Pass) HoldsBackBorrowers() bool { return p.waiting }
