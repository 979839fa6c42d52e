package policy

import (
	"time"
)

// Usage is the usage block: how GPU use is measured.
type Usage struct {
	// IdleBelow (percent): a GPU sampled below it is idle, at or above it
	// busy (right-sizing, and the idle share of GPU-hours).
	IdleBelow float64
	// Retention is how long daily GPU-hour rollups are kept.
	Retention time.Duration
}

// Defaults of the usage block and of currency.
const (
	DefaultIdleBelow      = 5
	DefaultUsageRetention = 400 * 24 * time.Hour
	DefaultCurrency       = "USD"
)

// FairShare is the fair_share block: queue order by each tenant's recent
// GPU-hours rather than by what it holds this moment.
type FairShare struct {
	// Enabled: a fair_share block is present. Without one the decayed
	// GPU-hours are kept all the same (with the defaults), only not used.
	Enabled bool
	// HalfLife: GPU-hours this long ago count half.
	HalfLife time.Duration
	// IdleWeight is what an allocated but idle GPU-hour counts for, a busy
	// one counting 1.
	IdleWeight float64
	// OldestFirstAfter: an entry that would borrow and has waited this long
	// goes ahead of younger borrowing entries in its band, whatever its
	// tenant's share; entries within their tenant's guarantee still go
	// first. 0: the share alone orders borrowing entries.
	OldestFirstAfter time.Duration
}

// Defaults of the fair_share block.
const (
	DefaultHalfLife   = 24 * time.Hour
	DefaultIdleWeight = 1.0
	// 6h: at 100,000 Philly jobs the longest wait falls from 45.0 h (no
	// bound) to 16.7 h, below Nomad alone's 33.9 h (docs/simulator.md).
	DefaultOldestFirstAfter = 6 * time.Hour
)

// Budget is a tenant's budget block: GPU-hours (allocated) per period.
type Budget struct {
	GPUHours float64
	Period   string // BudgetDay, BudgetWeek or BudgetMonth (UTC; weeks start on Monday)
}

// Budget periods.
const (
	BudgetDay   = "day"
	BudgetWeek  = "week"
	BudgetMonth = "month"
)
