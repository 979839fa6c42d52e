package queue_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
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

// A Keyer's keys order entries as Order does, with fair share on and off:
// what a merge of runs already in order relies on.
func TestKeyerKeysOrderAsOrder(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	plain, fair := testbuild.Policy(t, twoTenants), testbuild.Policy(t, twoTenants+"\nfair_share {\n  half_life = \"24h\"\n}\n")
	rapid.Check(t, func(t *rapid.T) {
		p := plain
		var decayed map[string]float64
		if rapid.Bool().Draw(t, "fair") {
			p = fair
			decayed = map[string]float64{"a": float64(rapid.IntRange(0, 50).Draw(t, "decayed-a")), "b": float64(rapid.IntRange(0, 50).Draw(t, "decayed-b"))}
		}
		entries := make([]queue.Entry, rapid.IntRange(0, 30).Draw(t, "n"))
		for i := range entries {
			// IDs are unique in a queue (its store's keys): the last tie-break.
			entries[i] = queue.Entry{ID: fmt.Sprintf("q%02d-%02d", rapid.IntRange(0, 40).Draw(t, "id"), i),
				Tenant:      rapid.SampledFrom([]string{"a", "b", "gone"}).Draw(t, "tenant"),
				Queue:       rapid.SampledFrom([]string{"training", "inference"}).Draw(t, "queue"),
				SubmittedAt: now.Add(-time.Duration(rapid.IntRange(0, 200).Draw(t, "age")) * time.Minute)}
			if rapid.IntRange(0, 9).Draw(t, "parked") == 0 {
				entries[i].Parked = "refused"
			}
		}
		used := map[string]float64{"a": float64(rapid.IntRange(0, 8).Draw(t, "used-a")), "b": float64(rapid.IntRange(0, 4).Draw(t, "used-b"))}
		want := slices.Clone(entries)
		queue.Order(want, p, used, decayed, now)
		k := queue.NewKeyer(p, used, decayed, now)
		got := slices.Clone(entries)
		slices.SortStableFunc(got, func(a, b queue.Entry) int { return k.Key(&a).Compare(k.Key(&b)) })
		for i := range want {
			if want[i].ID != got[i].ID || !want[i].SubmittedAt.Equal(got[i].SubmittedAt) || want[i].Tenant != got[i].Tenant {
				t.Fatalf("at %d: Order has %+v, the keys %+v", i, want[i], got[i])
			}
		}
	})
}

// BenchmarkPlace is what a submission into a queue of 10,000 waiting entries
// costs to find its place and estimate (every GPU taken, none known to free:
// the estimate is found once the first entry ahead waits).
func BenchmarkPlace(b *testing.B) {
	p := testbuild.Policy(b, twoTenants)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	entries := make([]queue.Entry, 10_000)
	for i := range entries {
		entries[i] = queue.Entry{ID: fmt.Sprintf("e%05d", i), Tenant: []string{"a", "b"}[i%2], Queue: "training", Demand: 1,
			SubmittedAt: now.Add(-time.Duration(i) * time.Second)}
	}
	e := queue.Entry{ID: "new", Tenant: "a", Queue: "training", Demand: 1, SubmittedAt: now}
	used := map[string]float64{"a": 4, "b": 4}
	supply := &queue.Supply{}
	b.ReportAllocs()
	for b.Loop() {
		if at, _, _ := queue.Place(entries, e, -1, p, used, nil, now, supply); at != len(entries)+1 {
			b.Fatal(at)
		}
	}
}
