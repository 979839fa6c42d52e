package queue_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/internal/testbuild"
)

// A submission's place and estimate, found without sorting the queue, are
// those of the queue sorted with it in: its position there, EstimateOf's
// estimate.
func TestPlaceIsWhereTheSortedQueueHasIt(t *testing.T) {
	p := testbuild.Policy(t, twoTenants)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		entry := func(id string) queue.Entry {
			e := queue.Entry{ID: id, Tenant: rapid.SampledFrom([]string{"a", "b", "gone"}).Draw(t, "tenant"),
				Queue:       rapid.SampledFrom([]string{"training", "inference"}).Draw(t, "queue"),
				Demand:      float64(rapid.IntRange(1, 4).Draw(t, "demand")),
				SubmittedAt: now.Add(-time.Duration(rapid.IntRange(0, 200).Draw(t, "age")) * time.Minute)}
			if rapid.IntRange(0, 9).Draw(t, "parked") == 0 {
				e.Parked = "refused"
			}
			return e
		}
		entries := make([]queue.Entry, rapid.IntRange(0, 30).Draw(t, "n"))
		for i := range entries {
			entries[i] = entry(fmt.Sprintf("q%02d", i))
		}
		e := entry("new")
		e.Parked = ""
		replaced := -1
		if len(entries) > 0 && rapid.Bool().Draw(t, "replaces") {
			replaced = rapid.IntRange(0, len(entries)-1).Draw(t, "replaced")
		}
		used := map[string]float64{"a": float64(rapid.IntRange(0, 8).Draw(t, "used-a")), "b": float64(rapid.IntRange(0, 4).Draw(t, "used-b"))}
		var supply *queue.Supply
		if rapid.Bool().Draw(t, "estimated") {
			supply = &queue.Supply{Idle: float64(rapid.IntRange(0, 4).Draw(t, "idle"))}
			for i := range rapid.IntRange(0, 5).Draw(t, "releases") {
				supply.Releases = append(supply.Releases, queue.Release{At: now.Add(time.Duration(i+1) * time.Hour),
					GPUs: float64(rapid.IntRange(1, 4).Draw(t, "gpus")), Tenant: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "of")})
			}
		}

		pos, est, ok := queue.Place(entries, e, replaced, p, used, nil, now, supply)

		all := slices.Clone(entries)
		if replaced >= 0 {
			all[replaced] = e
		} else {
			all = append(all, e)
		}
		queue.Order(all, p, used, nil, now)
		wantPos := slices.IndexFunc(all, func(e queue.Entry) bool { return e.ID == "new" }) + 1
		if pos != wantPos {
			t.Fatalf("position %d, the sorted queue has it at %d", pos, wantPos)
		}
		var want queue.Estimate
		wantOK := false
		if supply != nil {
			want, wantOK = queue.EstimateOf(all, "new", p, supply.Idle, used, supply.Releases, now)
		}
		if ok != wantOK || est != want {
			t.Fatalf("estimate %+v (%v), the sorted queue's %+v (%v)", est, ok, want, wantOK)
		}
	})
}
