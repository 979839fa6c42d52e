package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestEstimatesFollowTheLifetimesOfRunningJobs(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 6
}
tenant "search" {
  namespaces = ["search"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
}
`)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	// 8 GPUs, all held: vision 6 (4 end in 1 h, 2 never), search 2 (end in 2 h).
	releases := []queue.Release{
		{At: now.Add(2 * time.Hour), GPUs: 2, Tenant: "search"},
		{At: now.Add(time.Hour), GPUs: 4, Tenant: "vision"},
	}
	used := map[string]float64{"vision": 6, "search": 2}
	entries := []queue.Entry{
		{ID: "s1", Tenant: "search", Demand: 2}, // search has room; GPUs free in 1 h
		{ID: "v1", Tenant: "vision", Demand: 2}, // vision at its limit until its 4 end (1 h); 2 left then
		{ID: "s2", Tenant: "search", Demand: 2}, // search at its limit of 4: its own 2 end in 2 h
		{ID: "v2", Tenant: "vision", Demand: 4}, // nothing more ends: unknown
		{ID: "p", Tenant: "vision", Demand: 1, Parked: "refused"},
		{ID: "v3", Tenant: "vision", Demand: 1}, // behind v2
	}
	got := queue.Estimates(entries, p, 0, used, releases, now)
	for id, want := range map[string]time.Time{"s1": now.Add(time.Hour), "v1": now.Add(time.Hour), "s2": now.Add(2 * time.Hour)} {
		if !got[id].At.Equal(want) {
			t.Errorf("%s: %+v, want %s", id, got[id], want)
		}
	}
	if e := got["v2"]; !e.At.IsZero() || !strings.Contains(e.Why, "no known end") {
		t.Errorf("v2: %+v", e)
	}
	if e := got["v3"]; !e.At.IsZero() || !strings.Contains(e.Why, "behind v2") {
		t.Errorf("v3: %+v", e)
	}
	if _, ok := got["p"]; ok {
		t.Error("a parked entry was estimated")
	}
	// One entry's estimate, as a submission needs it, is the same.
	for _, e := range entries {
		one, ok := queue.EstimateOf(entries, e.ID, p, 0, used, releases, now)
		if all, want := got[e.ID]; ok != want || one != all {
			t.Errorf("EstimateOf(%s) = %+v, %v; Estimates has %+v, %v", e.ID, one, ok, all, want)
		}
	}
	if e := queue.Estimates(entries[:1], p, 2, used, nil, now)["s1"]; !e.At.Equal(now) || !strings.HasPrefix(e.Why, "now") {
		t.Errorf("with 2 idle GPUs: %+v", e)
	}
}
