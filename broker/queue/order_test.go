package queue_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// twoTenants: a may queue training and inference, b training; both are
// guaranteed 4 of a limit of 8.
const twoTenants = `
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
}`

func TestOrder(t *testing.T) {
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(twoTenants)}, 0)
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
	used := map[string]float64{"a": 6, "b": 2}
	want := []string{"a-training-starving", "a-inference", "b-training-older", "b-training-new", "a-training-old"}
	queue.Order(entries, p, used, nil, now)
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
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(`
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

// With fair_share's oldest_first_after, a band is: the entries their
// tenant's guarantee holds, by share; then the borrowing entries that have
// waited oldest_first_after, oldest first; then the other borrowing entries,
// by share. With it 0, the share alone decides.
func TestOldBorrowingEntriesGoAheadOfTheShareNotOfAGuarantee(t *testing.T) {
	src := `
queue "training" { priority = 60 }
tenant "a" {
  namespaces = ["a"]
  queues     = ["training"]
  guaranteed = 4
}
tenant "b" {
  namespaces = ["b"]
  queues     = ["training"]
  guaranteed = 4
}
tenant "c" {
  namespaces = ["c"]
  queues     = ["training"]
  guaranteed = 4
}
fair_share {
  half_life = "24h"
  %s
}`
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	entries := []queue.Entry{
		{ID: "a-borrow-7h", Tenant: "a", Queue: "training", Demand: 1, SubmittedAt: now.Add(-7 * time.Hour)},
		{ID: "b-borrow-new", Tenant: "b", Queue: "training", Demand: 1, SubmittedAt: now},
		{ID: "b-borrow-5h", Tenant: "b", Queue: "training", Demand: 1, SubmittedAt: now.Add(-5 * time.Hour)},
		{ID: "b-borrow-8h", Tenant: "b", Queue: "training", Demand: 1, SubmittedAt: now.Add(-8 * time.Hour)},
		{ID: "c-within-new", Tenant: "c", Queue: "training", Demand: 2, SubmittedAt: now},
	}
	// a and b hold their guarantees; c holds nothing now but used the most.
	used := map[string]float64{"a": 4, "b": 4}
	decayed := map[string]float64{"a": 100, "b": 10, "c": 500}
	for _, c := range []struct {
		attr string
		want []string
	}{
		{"", []string{"c-within-new", "b-borrow-8h", "a-borrow-7h", "b-borrow-5h", "b-borrow-new"}},
		{`oldest_first_after = "4h"`, []string{"c-within-new", "b-borrow-8h", "a-borrow-7h", "b-borrow-5h", "b-borrow-new"}},
		{`oldest_first_after = "0"`, []string{"b-borrow-8h", "b-borrow-5h", "b-borrow-new", "a-borrow-7h", "c-within-new"}},
	} {
		p := testbuild.Policy(t, fmt.Sprintf(src, c.attr))
		got := slices.Clone(entries)
		queue.Order(got, p, used, decayed, now)
		ids := make([]string, len(got))
		for i, e := range got {
			ids[i] = e.ID
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("fair_share { %s }: order %v, want %v", c.attr, ids, c.want)
		}
	}
}

// BenchmarkOrder is the queue put in admission order, as each pass and each
// `queue list` does: 10,000 entries of 1,000 tenants, with fair share.
func BenchmarkOrder(b *testing.B) {
	src := "queue \"training\" { priority = 60 }\nqueue \"dev\" { priority = 40 }\nfair_share {\n half_life = \"24h\"\n}\n"
	for i := 0; i < 1000; i++ {
		src += fmt.Sprintf("tenant \"t%d\" {\n namespaces = [\"ns%d\"]\n queues = [\"training\", \"dev\"]\n guaranteed = 8\n limit = 16\n}\n", i, i)
	}
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	now := time.Now()
	entries := make([]queue.Entry, 10_000)
	used, decayed := map[string]float64{}, map[string]float64{}
	for i := range entries {
		t := fmt.Sprintf("t%d", i%1000)
		entries[i] = queue.Entry{ID: fmt.Sprint(i), Tenant: t, Queue: []string{"training", "dev"}[i%2], Demand: 1,
			SubmittedAt: now.Add(-time.Duration(i) * time.Second)}
		used[t], decayed[t] = float64(i%16), float64(i%100)
	}
	work := make([]queue.Entry, len(entries))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		copy(work, entries)
		b.StartTimer()
		queue.Order(work, p, used, decayed, now)
	}
}

// An entry another broker submitted with its clock a little ahead is not
// aged for it: the order stays by submit time, the oldest first; an entry
// with no submit time at all is the oldest.
func TestAnEntryFromAClockAheadIsNotAged(t *testing.T) {
	p := testbuild.Policy(t, twoTenants)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var entries []queue.Entry
	for i := range 5 {
		entries = append(entries, queue.Entry{ID: fmt.Sprint(i), Tenant: "a", Queue: "training", Demand: 1, SubmittedAt: now.Add(time.Duration(4-i) * time.Second)})
	}
	entries = append(entries, queue.Entry{ID: "zero", Tenant: "a", Queue: "training", Demand: 1})
	queue.Order(entries, p, nil, nil, now)
	var got []string
	for _, e := range entries {
		got = append(got, e.ID)
	}
	if strings.Join(got, " ") != "zero 4 3 2 1 0" {
		t.Errorf("order: %v", got)
	}
}
