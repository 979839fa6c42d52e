package queue_test

import (
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

func TestAPassHoldsBackBorrowersBehindAnEntryWaitingForCapacity(t *testing.T) {
	admit := admission.Decision{Outcome: admission.Admit}
	borrow := admission.Decision{Outcome: admission.AdmitBorrowed}
	reject := admission.Decision{Outcome: admission.Reject}
	forLimit := admission.Decision{Outcome: admission.Queue, WaitsFor: admission.WaitLimit}
	forCapacity := admission.Decision{Outcome: admission.Queue, WaitsFor: admission.WaitCapacity}

	var p queue.Pass
	for i, c := range []struct {
		d    admission.Decision
		want bool
	}{
		{borrow, true},
		{forLimit, false}, // its tenant's own jobs must end first: nothing else waits for it
		{borrow, true},
		{admit, true},
		{forCapacity, false},
		{borrow, false}, // would take the GPUs the entry ahead waits for
		{admit, true},   // owed its GPUs: takes them back from borrowed work
		{reject, true},  // carried out: it can never run
	} {
		if got := p.Admits(c.d); got != c.want {
			t.Errorf("step %d, %s: admitted %v, want %v", i, c.d.Outcome, got, c.want)
		}
		if held := i >= 4; p.HoldsBackBorrowers() != held {
			t.Errorf("step %d: holds back borrowers %v", i, !held)
		}
	}
}

// A tenant's own order holds (issue 57). Once one of its entries waits for
// room within its guarantee, the only way it may run, none of its later
// entries is admitted in the pass, borrowed or within the guarantee, since
// either would take that room. Other tenants' entries are not held back.
func TestAPassHoldsATenantsNewerWorkBehindItsEntryOwedItsGuarantee(t *testing.T) {
	of := func(tenant string, outcome admission.Outcome, waits string) admission.Decision {
		return admission.Decision{Tenant: tenant, Outcome: outcome, WaitsFor: waits}
	}
	var p queue.Pass
	for i, c := range []struct {
		d    admission.Decision
		want bool
	}{
		{of("vision", admission.AdmitBorrowed, ""), true},
		{of("vision", admission.Queue, admission.WaitGuarantee), false}, // capped: max_preemptions reached
		{of("vision", admission.AdmitBorrowed, ""), false},              // would keep the tenant above its guarantee
		{of("vision", admission.Admit, ""), false},                      // would take the room the capped entry waits for
		{of("audio", admission.AdmitBorrowed, ""), true},
		{of("audio", admission.Admit, ""), true},
		{of("vision", admission.Reject, ""), true}, // carried out: it can never run
	} {
		if got := p.Admits(c.d); got != c.want {
			t.Errorf("step %d, %s %s: admitted %v, want %v", i, c.d.Tenant, c.d.Outcome, got, c.want)
		}
	}
	if !p.HoldsBack("vision") || p.HoldsBack("audio") || p.HoldsBackBorrowers() {
		t.Errorf("holds back vision %t, audio %t, borrowers %t; want vision only", p.HoldsBack("vision"), p.HoldsBack("audio"), p.HoldsBackBorrowers())
	}
}
