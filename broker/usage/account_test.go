package usage_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func noClass(string) string { return "" }

func TestChargeSplitsAtMidnightAndCountsFromAnAllocationsStart(t *testing.T) {
	midnight := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	early := running("a", "train", "g0", "g1") // started at t0, the day before
	late := running("b", "late", "g2")
	late.StartedAt = midnight.Add(10 * time.Second)
	gpus := util(map[string]float64{"g0": 90, "g1": 0, "g2": 50})
	got := usage.Charge(midnight.Add(-20*time.Second), midnight.Add(30*time.Second), []reclaim.Alloc{early, late}, gpus, 5, noClass)
	vision := usage.Key{Tenant: "vision", Queue: "training"}
	want := map[string]map[usage.Key]usage.Seconds{
		"2026-11-30": {vision: {Allocated: 40, Busy: 20, Idle: 20}},
		"2026-12-01": {vision: {Allocated: 80, Busy: 50, Idle: 30}}, // 2×30 for train, 20 for late (since its start)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("charge:\n got %+v\nwant %+v", got, want)
	}
}

// A time-sliced replica is charged its share of the GPU's hours.
func TestChargeCountsAReplicaAsItsShare(t *testing.T) {
	gpus := util(map[string]float64{"g0": 90, "r0": 90, "r1": 0})
	for _, id := range []string{"r0", "r1"} {
		g := gpus[id]
		g.Replicas = 4
		gpus[id] = g
	}
	allocs := []reclaim.Alloc{running("a", "whole", "g0"), running("b", "notebook", "r0", "r1")}
	got := usage.Charge(t0.Add(time.Minute), t0.Add(2*time.Minute), allocs, gpus, 5, noClass)
	want := usage.Seconds{Allocated: 60 + 2*15, Busy: 60 + 15, Idle: 15}
	if s := got["2026-11-30"][usage.Key{Tenant: "vision", Queue: "training"}]; s != want {
		t.Errorf("a whole GPU and 2 replicas of 4 for a minute: %+v, want %+v", s, want)
	}
}

func TestChargeCountsNothingFirstAndAllOfAGapFromEachStart(t *testing.T) {
	before := running("a", "train", "g0") // started at t0
	during := running("b", "train", "g1")
	during.StartedAt = t0.Add(3 * time.Hour)
	allocs := []reclaim.Alloc{before, during}
	if got := usage.Charge(time.Time{}, t0.Add(time.Hour), allocs, nil, 5, noClass); got != nil {
		t.Errorf("first observation charged %v", got)
	}
	// 4 hours unobserved: a ran all of them, b the last 2, as Nomad says.
	got := usage.Charge(t0.Add(time.Hour), t0.Add(5*time.Hour), allocs, nil, 5, noClass)
	if s := got["2026-11-30"][usage.Key{Tenant: "vision", Queue: "training"}]; s.Allocated != 6*3600 {
		t.Errorf("after a gap: %+v, want 6 GPU-hours", got)
	}
}

// An allocation that ended since the last observation is charged up to its
// end, one that ended before it not at all.
func TestChargeCountsAnEndedAllocationUpToItsEnd(t *testing.T) {
	ended, before := running("a", "train", "g0", "g1"), running("b", "train", "g2")
	ended.EndedAt, before.EndedAt = t0.Add(70*time.Second), t0.Add(50*time.Second)
	got := usage.Charge(t0.Add(time.Minute), t0.Add(2*time.Minute), []reclaim.Alloc{ended, before}, nil, 5, noClass)
	if s := got["2026-11-30"][usage.Key{Tenant: "vision", Queue: "training"}]; s != (usage.Seconds{Allocated: 20, Busy: 20}) {
		t.Errorf("2 GPUs for the 10 s before their end: %+v", got)
	}
}

func TestReportSumsDaysByGroupWithCost(t *testing.T) {
	days := []usage.Rollup{{Day: "2026-11-30"}, {Day: "2026-12-01"}}
	days[0].Add(map[usage.Key]usage.Seconds{{Tenant: "vision", Queue: "training", Class: "h100"}: {Allocated: 7200, Busy: 5400, Idle: 1800}})
	days[1].Add(map[usage.Key]usage.Seconds{{Tenant: "vision", Queue: "dev", Class: "h100"}: {Allocated: 3600, Idle: 3600},
		{Tenant: "search", Queue: "inference", Class: "a100"}: {Allocated: 3600, Busy: 3600}})
	price := map[string]float64{"h100": 2.5, "a100": 1}
	got := usage.Report(days, usage.ByTenant, func(c string) float64 { return price[c] })
	want := []usage.ReportRow{
		{Group: "search", AllocatedHours: 1, BusyHours: 1, Cost: 1},
		{Group: "vision", AllocatedHours: 3, BusyHours: 1.5, IdleHours: 1.5, IdleShare: 0.5, Cost: 7.5},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("by tenant:\n got %+v\nwant %+v", got, want)
	}
	if got := usage.Report(days, usage.ByQueue, func(string) float64 { return 0 }); len(got) != 3 || got[0].Group != "dev" {
		t.Errorf("by queue: %+v", got)
	}
}

// GPU-seconds above a tenant's limit are what all its namespaces'
// allocations held, the broker's or not, beyond limit × the interval
// (raised by what approvals grant); within the limit, none.
func TestOverLimitSecondsCountAllocationsByNamespace(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  limit      = 2
}
`)
	admitted := running("a", "train", "g0", "g1")
	bypass := running("b", "straight-in-nomad", "g2")
	bypass.Admitted, bypass.Tenant, bypass.Queue = false, "", ""
	late := running("c", "late", "g3")
	late.StartedAt = t0.Add(90 * time.Second)
	other := running("d", "elsewhere", "g4")
	other.Namespace = "default"
	allocs := []reclaim.Alloc{admitted, bypass, late, other}
	from, to := t0.Add(time.Minute), t0.Add(2*time.Minute)
	// 2 GPUs × 60 s + 1 × 60 s + 1 × 30 s = 210 GPU-seconds; the limit is
	// 2 × 60 s.
	if got := usage.OverLimitSeconds(from, to, allocs, nil, p, nil, ""); got["vision"] != 90 || len(got) != 1 {
		t.Errorf("over the limit: %v, want vision 90", got)
	}
	if got := usage.OverLimitSeconds(from, to, allocs, nil, p, map[string]float64{"vision": 2}, ""); len(got) != 0 {
		t.Errorf("within a limit raised by 2 approved GPUs: %v", got)
	}
	if got := usage.OverLimitSeconds(time.Time{}, to, allocs, nil, p, nil, ""); len(got) != 0 {
		t.Errorf("the first pass (no interval): %v", got)
	}
	// Over a region cap, within the limit (R1d: 2 GPUs in west against a
	// cap of 1, past the gate): the GPU-seconds above the cap. Over both,
	// the larger: the fewest that had to go.
	capped := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  limit      = 4
  region "west" {
    limit = 1
  }
  region "east" {
    limit = 4
  }
}
`)
	west := running("w", "in-west", "g5", "g6")
	west.Region = "west"
	if got := usage.OverLimitSeconds(from, to, []reclaim.Alloc{admitted, west}, nil, capped, nil, "east"); got["vision"] != 60 {
		t.Errorf("2 GPUs in west, capped at 1, 4 in all, limit 4: %v, want vision 60", got)
	}
	if got := usage.OverLimitSeconds(from, to, []reclaim.Alloc{admitted, late, west}, nil, capped, map[string]float64{"vision": 2}, "east"); got["vision"] != 60 {
		t.Errorf("an approval raises the limit, not the cap: %v, want vision 60", got)
	}
	days := []usage.Rollup{{Day: "2026-11-30"}}
	days[0].AddOverLimit(map[string]float64{"vision": 90})
	if rows := usage.Report(days, usage.ByTenant, func(string) float64 { return 0 }); len(rows) != 1 || rows[0].OverLimitSeconds != 90 {
		t.Errorf("report by tenant: %+v", rows)
	}
}
