package usage_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestPeriodBounds(t *testing.T) {
	now := time.Date(2026, 12, 2, 15, 4, 0, 0, time.UTC) // a Wednesday
	for period, want := range map[string][2]string{
		"day":   {"2026-12-02", "2026-12-03"},
		"week":  {"2026-11-30", "2026-12-07"},
		"month": {"2026-12-01", "2027-01-01"},
	} {
		start, next := usage.PeriodBounds(now, period)
		if got := [2]string{start.Format(usage.DayFormat), next.Format(usage.DayFormat)}; got != want {
			t.Errorf("%s: %v, want %v", period, got, want)
		}
	}
}

func TestBudgetsSumTheCurrentPeriod(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "research" {
  namespaces = ["research"]
  queues     = ["training"]
  budget {
    gpu_hours = 10
    period    = "month"
  }
}
tenant "free" {
  namespaces = ["free"]
  queues     = ["training"]
}
`)
	day := func(d string, tenant string, hours float64) usage.Rollup {
		r := usage.Rollup{Day: d}
		r.Add(map[usage.Key]usage.Seconds{{Tenant: tenant, Queue: "training"}: {Allocated: hours * 3600, Busy: hours * 3600}})
		return r
	}
	days := []usage.Rollup{day("2026-11-30", "research", 50), day("2026-12-01", "research", 6), day("2026-12-02", "research", 4.5)}
	got := usage.Budgets(p, days, time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	b, ok := got["research"]
	if len(got) != 1 || !ok || b.Spent != 10.5 || !b.Over() || !strings.Contains(b.Reason(), "spent 10.5 of its 10 GPU-hour budget this month (resets 2027-01-01T00:00:00Z)") {
		t.Errorf("budgets %+v; reason %q", got, b.Reason())
	}
	// What a burn-down is drawn from: the period's days so far, each day's spend.
	if !b.Began.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) || !slices.Equal(b.Daily, []float64{6, 4.5}) {
		t.Errorf("began %s, daily %v; want 2026-12-01, [6 4.5]", b.Began, b.Daily)
	}
}
