package reclaimer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// days is a DayStore in memory, its mark's index bumped on every commit.
type days struct {
	mark  usage.Mark
	index uint64
	byDay map[string]usage.Rollup
}

func (d *days) Mark(context.Context) (usage.Mark, uint64, error) { return d.mark, d.index, nil }
func (d *days) Day(_ context.Context, day string) (usage.Rollup, error) {
	r, ok := d.byDay[day]
	if !ok {
		r.Day = day
	}
	r.Rows = append([]usage.Row(nil), r.Rows...)
	return r, nil
}
func (d *days) Commit(_ context.Context, index uint64, m usage.Mark, rs []usage.Rollup) (bool, error) {
	if index != d.index {
		return false, nil
	}
	d.mark, d.index = m, d.index+1
	for _, r := range rs {
		d.byDay[r.Day] = r
	}
	return true, nil
}

// allocated is the GPU-seconds allocated in every day kept.
func (d *days) allocated() float64 {
	total := 0.0
	for _, day := range d.byDay {
		for _, r := range day.Rows {
			total += r.Seconds.Allocated
		}
	}
	return total
}

func (d *days) Days(_ context.Context, from, to string) ([]usage.Rollup, error) {
	var out []usage.Rollup
	for day, r := range d.byDay {
		if day >= from && day <= to {
			out = append(out, r)
		}
	}
	return out, nil
}
func (d *days) DeleteBefore(_ context.Context, day string) error {
	for k := range d.byDay {
		if k < day {
			delete(d.byDay, k)
		}
	}
	return nil
}

func TestTheLedgerCountsEachIntervalOnceAcrossLeaders(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{byDay: map[string]usage.Rollup{"2025-01-01": {Day: "2025-01-01"}}}
	p := testbuild.Fixed{P: testbuild.Policy(t, src)}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0,
		GPUs: []string{"g0", "g1"}}}
	gpus := map[string]reclaim.GPU{"g0": {Utilization: 0}, "g1": {Utilization: 80}}
	first, second := &reclaimer.Ledger{Store: store, Policies: p}, &reclaimer.Ledger{Store: store, Policies: p}
	observe := func(l *reclaimer.Ledger, at time.Duration) error {
		return l.Observed(context.Background(), t0.Add(at), allocs, gpus)
	}
	for _, step := range []struct {
		l  *reclaimer.Ledger
		at time.Duration
	}{{first, 0}, {first, 30 * time.Second}, {second, 45 * time.Second}, {first, 60 * time.Second}, {second, 60 * time.Second}} {
		if err := observe(step.l, step.at); err != nil {
			t.Fatal(err)
		}
	}
	// Two GPUs for 60 s whichever leader saw which part: 120 allocated, half idle.
	got := store.byDay["2026-11-30"].Rows
	want := usage.Seconds{Allocated: 120, Busy: 60, Idle: 60}
	if len(got) != 1 || got[0].Seconds != want || got[0].Key != (usage.Key{Tenant: "vision", Queue: "dev"}) {
		t.Errorf("rollup %+v, want %+v", got, want)
	}
	if _, ok := store.byDay["2025-01-01"]; ok {
		t.Error("a day past retention was kept")
	}
	// Busy and idle hours count alike by default, decayed over a minute of a
	// 24-hour half-life.
	if h := store.mark.Decayed.Hours["vision"]; h < 0.0333 || h > 120.0/3600 {
		t.Errorf("decayed GPU-hours %v, want just under %v", h, 120.0/3600)
	}
}

// The passes that saw an allocation running did not reach its end: the
// next one charges the rest, and one it still lists running is not
// charged twice.
func TestTheLedgerChargesAnAllocationUpToItsEnd(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{byDay: map[string]usage.Rollup{}}
	a := reclaim.Alloc{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0,
		GPUs: []string{"g0", "g1"}}
	var ended []reclaim.Alloc
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Ended: func() []reclaim.Alloc { return ended }}
	for _, step := range []struct {
		at      time.Duration
		running bool
		endedAt time.Duration // -1: not ended
	}{{0, true, -1}, {30 * time.Second, true, 0}, {60 * time.Second, false, 45 * time.Second}, {90 * time.Second, false, 45 * time.Second}} {
		var allocs []reclaim.Alloc
		if step.running {
			allocs = append(allocs, a)
		}
		ended = nil
		if e := a; step.endedAt >= 0 {
			if step.endedAt > 0 {
				e.EndedAt = t0.Add(step.endedAt)
			}
			ended = append(ended, e)
		}
		if err := l.Observed(context.Background(), t0.Add(step.at), allocs, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := store.byDay["2026-11-30"].Rows; len(got) != 1 || got[0].Seconds.Allocated != 2*45 {
		t.Errorf("rollup %+v, want 2 GPUs for the 45 s they ran", got)
	}
}

// A pass may see an allocation not yet started that started before it (the
// view hears of a start later). The next pass charges it from its start, but
// not from before its term's first mark, which an earlier leader counted to.
func TestTheLedgerChargesAStartItSawLate(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{byDay: map[string]usage.Rollup{}}
	p := testbuild.Fixed{P: testbuild.Policy(t, src)}
	a := reclaim.Alloc{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", GPUs: []string{"g0"}}
	pass := func(l *reclaimer.Ledger, at time.Duration, started bool) {
		t.Helper()
		b := a
		if started {
			b.StartedAt = t0.Add(20 * time.Second)
		}
		if err := l.Observed(context.Background(), t0.Add(at), []reclaim.Alloc{b}, nil); err != nil {
			t.Fatal(err)
		}
	}
	allocated := func() float64 { return store.byDay["2026-11-30"].Rows[0].Seconds.Allocated }
	first := &reclaimer.Ledger{Store: store, Policies: p}
	pass(first, 0, false)
	pass(first, 30*time.Second, false) // it started at 20 s
	pass(first, 60*time.Second, true)
	pass(first, 90*time.Second, true)
	if got := allocated(); got != 70 {
		t.Errorf("charged %v GPU-seconds from 20 s to 90 s, want 70", got)
	}
	// A new leader charges what it had not seen from its first mark only.
	pass(&reclaimer.Ledger{Store: store, Policies: p}, 100*time.Second, true)
	if got := allocated(); got != 80 {
		t.Errorf("the next leader: %v GPU-seconds in all, want 80", got)
	}
}

func TestALedgerThatLostTheMarkCountsNothing(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{mark: usage.Mark{Through: t0}, index: 7, byDay: map[string]usage.Rollup{}}
	stale := &racing{days: store}
	l := &reclaimer.Ledger{Store: stale, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, StartedAt: t0, GPUs: []string{"g0"}}}
	if err := l.Observed(context.Background(), t0.Add(time.Minute), allocs, nil); err == nil || !errors.Is(err, reclaimer.ErrMarkMoved) {
		t.Fatalf("err %v", err)
	}
	if len(store.byDay) != 0 {
		t.Errorf("counted after losing the mark: %+v", store.byDay)
	}
}

// racing moves the mark between the ledger's read and its commit.
type racing struct{ *days }

func (r *racing) Commit(ctx context.Context, index uint64, m usage.Mark, rs []usage.Rollup) (bool, error) {
	r.days.index++
	return r.days.Commit(ctx, index, m, rs)
}

func TestTheLedgerTellsAdmissionWhoSpentItsBudget(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	spent := usage.Rollup{Day: "2026-11-29"}
	spent.Add(map[usage.Key]usage.Seconds{{Tenant: "vision", Queue: "dev"}: {Allocated: 3600}})
	store := &days{mark: usage.Mark{Through: t0}, byDay: map[string]usage.Rollup{"2026-11-29": spent}}
	book := &usage.BudgetBook{}
	// A budget of one GPU-hour a week (the week began on Monday the 30th:
	// the 29th does not count).
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
  budget {
    gpu_hours = 0.01
    period    = "week"
  }
}
`)}, Budgets: book}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0,
		GPUs: []string{"g0"}}}
	if err := l.Observed(context.Background(), t0.Add(30*time.Second), allocs, nil); err != nil {
		t.Fatal(err)
	}
	if why := book.OverBudget("vision"); why != "" {
		t.Fatalf("over budget after 30 GPU-seconds of 36: %s", why)
	}
	if err := l.Observed(context.Background(), t0.Add(60*time.Second), allocs, nil); err != nil {
		t.Fatal(err)
	}
	if why := book.OverBudget("vision"); why == "" {
		t.Fatal("not over budget after a minute more")
	}
}

// The clock ran two hours ahead (the mark with it) and was put back: the
// mark comes back to the clock, and the time after is charged, instead of
// nothing until the clock catches up with the mark.
func TestAClockPutBackDoesNotStopTheLedger(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{mark: usage.Mark{Through: t0.Add(2 * time.Hour)}, index: 1, byDay: map[string]usage.Rollup{}}
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0.Add(-time.Hour),
		GPUs: []string{"g0"}}}
	if err := l.Observed(context.Background(), t0, allocs, nil); !errors.Is(err, reclaimer.ErrClockStepped) || !store.mark.Through.Equal(t0) {
		t.Fatalf("the clock put back: %v, mark %s", err, store.mark.Through)
	}
	if err := l.Observed(context.Background(), t0.Add(30*time.Second), allocs, nil); err != nil {
		t.Fatal(err)
	}
	if got := store.byDay["2026-11-30"].Rows; len(got) != 1 || got[0].Seconds.Allocated != 30 {
		t.Errorf("charged %+v after the mark came back, want 30 GPU-seconds", got)
	}
}

// On Nomad's clock, a step of this machine's clock charges nothing of the
// step and deletes no rollup; a gap nobody observed (Consul down, a
// failover) is charged whole, from each allocation's start as Nomad says.
func TestTheLedgerGoesByNomadsClock(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	old := "2026-01-15" // within the 400 days kept
	store := &days{mark: usage.Mark{Through: t0}, index: 1, byDay: map[string]usage.Rollup{old: {Day: old}}}
	nomad, known, mono := t0, true, t0
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)},
		Clock: func() (time.Time, bool) { return nomad, known }, Monotonic: func() time.Time { return mono }}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0.Add(-time.Hour),
		GPUs: []string{"g0"}}}
	charged := store.allocated
	// This machine's clock jumped two years ahead; Nomad's moved 30 s.
	nomad, mono = t0.Add(30*time.Second), mono.Add(30*time.Second)
	if err := l.Observed(context.Background(), t0.Add(2*365*24*time.Hour), allocs, nil); err != nil {
		t.Fatal(err)
	}
	if got := charged(); got != 30 {
		t.Errorf("charged %v GPU-seconds over a step of this clock, want 30", got)
	}
	if _, ok := store.byDay[old]; !ok || !store.mark.Through.Equal(nomad) {
		t.Errorf("rollup %s deleted (%v) or mark %s not at Nomad's time", old, ok, store.mark.Through)
	}
	// An hour nobody observed: charged whole.
	nomad, mono = nomad.Add(time.Hour), mono.Add(time.Hour)
	if err := l.Observed(context.Background(), nomad, allocs, nil); err != nil {
		t.Fatal(err)
	}
	if got := charged(); got != 30+3600 {
		t.Errorf("after an hour unobserved: %v GPU-seconds, want %v", got, 30+3600)
	}
	// Nomad's time not known: this clock, at most MaxInterval a pass, and
	// nothing deleted however far it ran.
	known = false
	l2 := &reclaimer.Ledger{Store: store, Policies: l.Policies, Clock: l.Clock}
	if err := l2.Observed(context.Background(), nomad.Add(2*365*24*time.Hour), allocs, nil); err != nil {
		t.Fatal(err)
	}
	if got := charged(); got != 30+3600+usage.MaxInterval.Seconds() {
		t.Errorf("on this clock alone: %v GPU-seconds, want %v", got, 30+3600+usage.MaxInterval.Seconds())
	}
	if _, ok := store.byDay[old]; !ok {
		t.Errorf("rollup %s deleted on a clock that may have stepped", old)
	}
}

// Nomad's clock stepped two hours, then a hundred, ahead within a term: each
// pass charges what the monotonic clock says passed, on the days the ledger
// was on, and no rollup is deleted for it (retention 72 h). An allocation
// that started after the step is read at the step's offset.
func TestAStepOfNomadsClockIsNeitherChargedNorFollowed(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	old := "2026-11-28" // within the 72 h kept
	store := &days{mark: usage.Mark{Through: t0}, index: 1, byDay: map[string]usage.Rollup{old: {Day: old}}}
	nomad, mono := t0, t0
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src+"\nusage {\n  retention = \"72h\"\n}\n")},
		Clock: func() (time.Time, bool) { return nomad, true }, Monotonic: func() time.Time { return mono }}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0.Add(-time.Hour),
		GPUs: []string{"g0"}}}
	pass := func(real, step time.Duration, allocs []reclaim.Alloc) error {
		mono, nomad = mono.Add(real), nomad.Add(real+step)
		return l.Observed(context.Background(), nomad, allocs, nil)
	}
	charged := store.allocated
	if err := pass(30*time.Second, 0, allocs); err != nil || charged() != 30 {
		t.Fatalf("30 s: charged %v (%v)", charged(), err)
	}
	if err := pass(30*time.Second, 2*time.Hour, allocs); !errors.Is(err, reclaimer.ErrClockStepped) || charged() != 60 {
		t.Fatalf("30 s and a step of 2 h: charged %v, want 60 (%v)", charged(), err)
	}
	// b started 10 s ago by Nomad's stepped clock.
	b := reclaim.Alloc{ID: "b", Namespace: "vision", JobID: "nb2", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: nomad.Add(20 * time.Second),
		GPUs: []string{"g1"}}
	if err := pass(30*time.Second, 0, append(allocs, b)); err != nil || charged() != 60+30+10 {
		t.Fatalf("30 s more, b for 10 s: charged %v, want 100 (%v)", charged(), err)
	}
	if err := pass(30*time.Second, 100*time.Hour, append(allocs, b)); !errors.Is(err, reclaimer.ErrClockStepped) || charged() != 100+60 {
		t.Fatalf("30 s and a step of 100 h: charged %v, want 160 (%v)", charged(), err)
	}
	if err := pass(30*time.Second, 0, append(allocs, b)); err != nil || charged() != 160+60 {
		t.Fatalf("30 s more: charged %v, want 220 (%v)", charged(), err)
	}
	if len(store.byDay) != 2 || len(store.byDay["2026-11-30"].Rows) == 0 {
		t.Errorf("days: %v: want %s kept and everything charged on 2026-11-30", store.byDay, old)
	}
}

// An allocation that ended while no broker led is charged from Nomad's own
// times when the next term's ledger resumes: from the mark to its end.
func TestWhatEndedWhileNoBrokerLedIsCharged(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{mark: usage.Mark{Through: t0}, index: 1, byDay: map[string]usage.Rollup{}}
	gone := reclaim.Alloc{ID: "gone", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0.Add(-time.Hour),
		EndedAt: t0.Add(302 * time.Second), GPUs: []string{"g0"}}
	var asked time.Time
	now := t0.Add(11 * time.Minute) // an 11-minute gap
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)},
		Clock: func() (time.Time, bool) { return now, true },
		EndedSince: func(_ context.Context, since time.Time) ([]reclaim.Alloc, error) {
			asked = since
			return []reclaim.Alloc{gone}, nil
		}}
	if err := l.Observed(context.Background(), now, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := store.byDay["2026-11-30"].Rows; !asked.Equal(t0) || len(got) != 1 || got[0].Seconds.Allocated != 302 {
		t.Errorf("asked since %s; charged %+v, want 302 s", asked, got)
	}
	// Asked once a term: the next pass charges it no more.
	now = now.Add(time.Minute)
	if err := l.Observed(context.Background(), now, nil, nil); err != nil || store.byDay["2026-11-30"].Rows[0].Seconds.Allocated != 302 {
		t.Errorf("charged again: %+v (%v)", store.byDay["2026-11-30"].Rows, err)
	}
}

// regionObserver is one other region as Elsewhere observes it.
type regionObserver struct {
	allocs []reclaim.Alloc
	ended  []reclaim.Alloc
	err    error
}

func (o *regionObserver) Observe(context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU, error) {
	if o.err != nil {
		return nil, nil, o.err
	}
	return append([]reclaim.Alloc(nil), o.allocs...), map[string]reclaim.GPU{}, nil
}
func (o *regionObserver) Ended() []reclaim.Alloc { return o.ended }

// Another region's GPU time is charged with the broker's own, in rows of its
// region. While the region cannot be observed it is charged as last
// observed, and an allocation that ended there (lost with the region) up to
// its end.
func TestTheLedgerChargesEveryRegionSplitByRegion(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &days{byDay: map[string]usage.Rollup{}}
	west := &regionObserver{allocs: []reclaim.Alloc{{ID: "w", Namespace: "vision", JobID: "train", Admitted: true, Tenant: "vision", Queue: "dev",
		StartedAt: t0, GPUs: []string{"w0", "w1"}}}}
	home := []reclaim.Alloc{{ID: "e", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", Queue: "dev", StartedAt: t0, GPUs: []string{"e0"}}}
	elsewhere := &reclaimer.Elsewhere{Log: hclog.NewNullLogger(), Observers: map[string]reclaimer.RegionObserver{"west": west}}
	l := &reclaimer.Ledger{Store: store, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Elsewhere: elsewhere}
	pass := func(at time.Duration) {
		t.Helper()
		elsewhere.Observe(context.Background()) // as the reclaim pass does, before its watchers
		if err := l.Observed(context.Background(), t0.Add(at), home, nil); err != nil {
			t.Fatal(err)
		}
	}
	pass(0)
	pass(30 * time.Second)
	west.err = errors.New("no path to region west")
	pass(60 * time.Second) // charged as last observed
	lost := west.allocs[0]
	lost.EndedAt = t0.Add(75 * time.Second)
	west.ended = []reclaim.Alloc{lost}
	pass(90 * time.Second) // up to its end
	got := map[string]float64{}
	for _, r := range store.byDay["2026-11-30"].Rows {
		got[r.Region] += r.Allocated
	}
	if len(got) != 2 || got[""] != 90 || got["west"] != 2*75 {
		t.Errorf("allocated GPU-seconds by region %v, want the broker's own 90 (1 GPU × 90 s), west's 150 (2 GPUs × 75 s)", got)
	}
	if rows := usage.Report([]usage.Rollup{store.byDay["2026-11-30"]}, usage.ByRegion, func(string) float64 { return 0 }); len(rows) != 2 || rows[1].Group != "west" {
		t.Errorf("report by region %+v, want the broker's own and west", rows)
	}
}
