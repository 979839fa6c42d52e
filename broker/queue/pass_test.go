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
