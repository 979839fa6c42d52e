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
}

// Defaults of the fair_share block.
const (
	DefaultHalfLife   = 24 * time.Hour
	DefaultIdleWeight = 1.0
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
