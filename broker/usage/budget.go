package usage

import (
	"fmt"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// BudgetState is a tenant's GPU-hour budget in its current period.
type BudgetState struct {
	Tenant string    `json:"tenant"`
	Period string    `json:"period"`
	Limit  float64   `json:"gpu_hours"`
	Spent  float64   `json:"spent_gpu_hours"` // allocated GPU-hours since the period began
	Began  time.Time `json:"began"`
	Resets time.Time `json:"resets"`
	// Daily are the GPU-hours spent each day of the period so far, from
	// its first day: what a burn-down is drawn from.
	Daily []float64 `json:"daily_gpu_hours"`
}

// Over reports whether the budget is spent.
func (b BudgetState) Over() bool { return b.Spent >= b.Limit }

// Reason says why admission treats the tenant as over budget.
func (b BudgetState) Reason() string {
	return fmt.Sprintf("tenant %q spent %.1f of its %g GPU-hour budget this %s (resets %s)", b.Tenant, b.Spent, b.Limit, b.Period,
		b.Resets.UTC().Format(time.RFC3339))
}

// PeriodBounds is the start of the budget period (UTC) that now falls in,
// and the start of the next one.
func PeriodBounds(now time.Time, period string) (start, next time.Time) {
	now = now.UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	switch period {
	case policy.BudgetWeek:
		start = day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7)) // back to Monday
		return start, start.AddDate(0, 0, 7)
	case policy.BudgetMonth:
		start = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	return day, day.AddDate(0, 0, 1)
}

// EarliestPeriodStart is the first day any budget period running at now
// began: the days a budget computation needs.
func EarliestPeriodStart(now time.Time) time.Time {
	month, _ := PeriodBounds(now, policy.BudgetMonth)
	week, _ := PeriodBounds(now, policy.BudgetWeek)
	if week.Before(month) {
		return week
	}
	return month
}

// Budgets is the state of every tenant budget in the policy at now, from
// the daily rollups (those of the current periods at least).
func Budgets(p *policy.Policy, days []Rollup, now time.Time) map[string]BudgetState {
	out := map[string]BudgetState{}
	for name, t := range p.Tenants {
		if t.Budget == nil {
			continue
		}
		start, next := PeriodBounds(now, t.Budget.Period)
		b := BudgetState{Tenant: name, Period: t.Budget.Period, Limit: t.Budget.GPUHours, Began: start, Resets: next,
			Daily: make([]float64, int(now.UTC().Sub(start).Hours()/24)+1)}
		from := start.Format(DayFormat)
		for _, d := range days {
			day, err := time.Parse(DayFormat, d.Day)
			if err != nil || d.Day < from || d.Day >= next.Format(DayFormat) {
				continue
			}
			for _, r := range d.Rows {
				if r.Tenant == name {
					b.Spent += r.Allocated / 3600
					if i := int(day.Sub(start).Hours() / 24); i < len(b.Daily) {
						b.Daily[i] += r.Allocated / 3600
					}
				}
			}
		}
		out[name] = b
	}
	return out
}

// BudgetBook holds the budget states the leader last computed, for
// admission; safe for concurrent use.
type BudgetBook struct {
	mu     sync.RWMutex
	states map[string]BudgetState
}

// Set replaces the states.
func (b *BudgetBook) Set(states map[string]BudgetState) {
	b.mu.Lock()
	b.states = states
	b.mu.Unlock()
}

// OverBudget is why tenant is over its budget, or "".
func (b *BudgetBook) OverBudget(tenant string) string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if s, ok := b.states[tenant]; ok && s.Over() {
		return s.Reason()
	}
	return ""
}
