package queue

import (
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Owes reports whether entry e runs only within its tenant's guarantee
// because its job was evicted borrowing.max_preemptions times while
// borrowed (preemptions). While it waits, its tenant's newer work waits
// behind it (admission.TenantUsage.OwedSince): borrowing, or taking room
// within the guarantee, that work would keep it from ever starting. A
// protect_min_count workload, never borrowed, does not hold its tenant's
// work so: a whole workload of jobs, not a few, would serialize the tenant
// behind it (measured in docs/simulator.md).
func Owes(p *policy.Policy, e Entry, preemptions int) bool {
	if e.Parked != "" {
		return false // not waiting to be admitted
	}
	if !p.Borrowing.Enabled {
		return false // nothing borrows: nothing newer takes its room so
	}
	most := p.Borrowing.MaxPreemptions
	return most > 0 && preemptions >= most
}

// Owed is, by tenant, when the oldest of its entries that owes picks entered
// the queue.
func Owed(entries []Entry, owes func(Entry) bool) map[string]time.Time {
	out := map[string]time.Time{}
	for _, e := range entries {
		if t, ok := out[e.Tenant]; (!ok || e.SubmittedAt.Before(t)) && owes(e) {
			out[e.Tenant] = e.SubmittedAt
		}
	}
	return out
}

// OwedBook is the last pass's Owed, for the gate's admissions between
// passes.
type OwedBook struct {
	mu   sync.RWMutex
	owed map[string]time.Time
}

// Set replaces what is owed.
func (b *OwedBook) Set(owed map[string]time.Time) {
	b.mu.Lock()
	b.owed = owed
	b.mu.Unlock()
}

// Since is when tenant's oldest entry owed its guarantee entered the queue
// (zero: none).
func (b *OwedBook) Since(tenant string) time.Time {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.owed[tenant]
}
