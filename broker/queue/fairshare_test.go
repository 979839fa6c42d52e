package queue_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// simulate runs a saturated 16-GPU cluster for days in one-minute steps.
// Tenant "big" keeps 16 jobs of 4 GPUs × 2 h queued, tenant "small" 16 jobs
// of 1 GPU × 20 min. Whenever GPUs free, queued jobs are admitted in
// Order as the admitter does (stopping at the first that does not fit),
// and running GPU time is charged to the decayed GPU-hours. It returns each
// tenant's GPU-hours after the first two days.
func simulate(t *testing.T, fairShare string, guaranteed map[string]int, days int) map[string]float64 {
	t.Helper()
	p := testbuild.Policy(t, fmt.Sprintf(`
queue "training" { priority = 60 }
tenant "big" {
  namespaces = ["big"]
  queues     = ["training"]
  guaranteed = %d
}
tenant "small" {
  namespaces = ["small"]
  queues     = ["training"]
  guaranteed = %d
}
%s`, guaranteed["big"], guaranteed["small"], fairShare))
	type job struct {
		tenant string
		gpus   int
		dur    time.Duration
	}
	shape := map[string]job{"big": {"big", 4, 2 * time.Hour}, "small": {"small", 1, 20 * time.Minute}}
	const capacity = 16
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	type running struct {
		job
		until time.Time
	}
	var run []running
	byID := map[string]job{}
	var entries []queue.Entry
	n := 0
	submit := func(tenant string, at time.Time) {
		n++
		id := fmt.Sprintf("%s-%06d", tenant, n)
		byID[id] = shape[tenant]
		entries = append(entries, queue.Entry{ID: id, Tenant: tenant, Queue: "training", Demand: float64(shape[tenant].gpus), SubmittedAt: at})
	}
	hours := map[string]float64{}
	var decayed usage.Decayed
	for now := start; now.Before(start.Add(time.Duration(days) * 24 * time.Hour)); now = now.Add(time.Minute) {
		// Charge the minute that ended, as the leader's passes do.
		used, held, busy := map[string]float64{}, 0.0, map[usage.Key]usage.Seconds{}
		kept := run[:0]
		for _, r := range run {
			if !now.Before(r.until) {
				continue
			}
			kept = append(kept, r)
			used[r.tenant] += float64(r.gpus)
			held += float64(r.gpus)
			s := busy[usage.Key{Tenant: r.tenant}]
			s.Add(usage.Seconds{Allocated: 60 * float64(r.gpus), Busy: 60 * float64(r.gpus)})
			busy[usage.Key{Tenant: r.tenant}] = s
			if now.Sub(start) >= 48*time.Hour {
				hours[r.tenant] += float64(r.gpus) / 60
			}
		}
		run = kept
		decayed.Add(now, p.FairShare.HalfLife, p.FairShare.IdleWeight, map[string]map[usage.Key]usage.Seconds{"d": busy})
		for tenant := range shape {
			queued := 0
			for _, e := range entries {
				if e.Tenant == tenant {
					queued++
				}
			}
			for ; queued < capacity; queued++ {
				submit(tenant, now)
			}
		}
		queue.Order(entries, p, used, decayed.As(now, p.FairShare.HalfLife), now)
		for len(entries) > 0 && held+entries[0].Demand <= float64(capacity) {
			j := byID[entries[0].ID]
			run = append(run, running{job: j, until: now.Add(j.dur)})
			held += float64(j.gpus)
			used[j.tenant] += float64(j.gpus)
			entries = entries[1:]
			queue.Order(entries, p, used, decayed.As(now, p.FairShare.HalfLife), now)
		}
	}
	return hours
}

// With fair_share, long-run GPU-hours follow the guarantees (within 5 %),
// equal or not, however differently the tenants' jobs are shaped; without
// it, age and the share of this moment do not.
func TestFairShareConvergesToTheGuarantees(t *testing.T) {
	for _, g := range []map[string]int{{"big": 8, "small": 8}, {"big": 4, "small": 12}} {
		want := float64(g["big"]) / float64(g["small"])
		h := simulate(t, "fair_share {\n  half_life = \"6h\"\n}\n", g, 14)
		got := h["big"] / h["small"]
		t.Logf("guarantees %v: GPU-hours big %.0f, small %.0f, ratio %.3f (want %.3f)", g, h["big"], h["small"], got, want)
		if math.Abs(got/want-1) > 0.05 {
			t.Errorf("guarantees %v: GPU-hours ratio %.3f, want %.3f within 5%%", g, got, want)
		}
	}
	h := simulate(t, "", map[string]int{"big": 8, "small": 8}, 14)
	t.Logf("without fair_share: GPU-hours big %.0f, small %.0f, ratio %.3f", h["big"], h["small"], h["big"]/h["small"])
}
