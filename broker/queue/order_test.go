package queue_test

import (
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

func TestOrder(t *testing.T) {
	p, diags := policy.Parse(map[string][]byte{"p.hcl": []byte(`
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
tenant "a" {
  namespaces = ["a"]
  queues = ["training", "inference"]
  guaranteed = 4
  limit = 8
}
tenant "b" {
  namespaces = ["b"]
  queues = ["training"]
  guaranteed = 4
  limit = 8
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	entries := []queue.Entry{
		{ID: "a-training-old", Tenant: "a", Queue: "training", SubmittedAt: now.Add(-10 * time.Minute)},
		{ID: "b-training-new", Tenant: "b", Queue: "training", SubmittedAt: now.Add(-time.Minute)},
		{ID: "a-inference", Tenant: "a", Queue: "inference", SubmittedAt: now},
		{ID: "b-training-older", Tenant: "b", Queue: "training", SubmittedAt: now.Add(-20 * time.Minute)},
		{ID: "a-training-starving", Tenant: "a", Queue: "training", SubmittedAt: now.Add(-3 * time.Hour)},
	}
	// a holds 6 of 4 guaranteed, b 2 of 4: b goes first within a band.
	queue.Order(entries, p, map[string]float64{"a": 6, "b": 2}, nil, now)
	want := []string{"a-training-starving", "a-inference", "b-training-older", "b-training-new", "a-training-old"}
	for i, e := range entries {
		if e.ID != want[i] {
			t.Fatalf("position %d: got %s, want order %v", i, e.ID, want)
		}
	}
}

func TestNewIDsAreValidAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := queue.NewID()
		if !queue.ValidID(id) || seen[id] {
			t.Fatalf("id %q: valid %t, seen before %t", id, queue.ValidID(id), seen[id])
		}
		seen[id] = true
	}
}

// With fair_share, decayed GPU-hours decide within a band, however old the
// entries; age still lifts an entry into a higher queue's band.
func TestFairShareOrder(t *testing.T) {
	p, diags := policy.Parse(map[string][]byte{"p.hcl": []byte(`
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "a" {
  namespaces = ["a"]
  queues = ["training", "inference", "dev"]
  guaranteed = 4
}
tenant "b" {
  namespaces = ["b"]
  queues = ["training", "dev"]
  guaranteed = 4
}
fair_share {
  half_life = "24h"
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	entries := []queue.Entry{
		{ID: "a-training-old", Tenant: "a", Queue: "training", SubmittedAt: now.Add(-50 * time.Minute)},
		{ID: "b-training-new", Tenant: "b", Queue: "training", SubmittedAt: now},
		{ID: "b-dev-aged", Tenant: "b", Queue: "dev", SubmittedAt: now.Add(-61 * time.Minute)}, // 40 + 2 steps: training's band
		{ID: "a-inference", Tenant: "a", Queue: "inference", SubmittedAt: now},
	}
	// a used 100 decayed GPU-hours, b 10 (and holds 2 GPUs: +2 h).
	queue.Order(entries, p, map[string]float64{"b": 2}, map[string]float64{"a": 100, "b": 10}, now)
	want := []string{"a-inference", "b-dev-aged", "b-training-new", "a-training-old"}
	for i, e := range entries {
		if e.ID != want[i] {
			t.Fatalf("position %d: got %s, want order %v", i, e.ID, want)
		}
	}
}
