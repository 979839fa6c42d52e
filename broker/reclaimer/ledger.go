package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// DayStore is where the ledger keeps daily rollups and its mark.
type DayStore interface {
	Mark(ctx context.Context) (usage.Mark, uint64, error)
	Day(ctx context.Context, day string) (usage.Rollup, error)
	Commit(ctx context.Context, index uint64, m usage.Mark, days []usage.Rollup) (bool, error)
	DeleteBefore(ctx context.Context, day string) error
	Days(ctx context.Context, from, to string) ([]usage.Rollup, error)
}

// ErrMarkMoved: another leader counted since the mark was read; the next
// pass counts from where it left off.
var ErrMarkMoved = errors.New("the usage mark moved since it was read (another leader wrote)")

// ErrClockStepped: the clock went back behind the usage mark (a step that
// was corrected); the mark was brought back to it.
var ErrClockStepped = errors.New("the clock went back")

// clockAgreement is how far this machine's clock may be from Nomad's (read
// to the second from its answers' Date, a request's time apart) and still
// be taken for it.
const clockAgreement = 5 * time.Second

// clockStepBack is how far behind the mark the clock must be to count as
// stepped back: two leaders' clocks may differ by this much.
const clockStepBack = time.Minute

// Ledger charges each reclaim pass's GPU time to the daily rollups and to
// the tenants' decayed GPU-hours, from the stored mark up to the pass. It
// adds what it committed to nomadgpu_gpu_seconds_total, and tells admission
// (Budgets) which tenants spent their GPU-hour budget. One per leader term.
type Ledger struct {
	Store DayStore
	// Region is the broker's own region, for the region caps of
	// allocations that name none.
	Region   string
	Policies policy.Source
	Metrics  *metrics.Metrics
	Budgets  *usage.BudgetBook // nil: none kept
	// Clock is Nomad's time (nil: each pass's own), which the allocations'
	// start times are in. While this machine's clock is more than
	// clockAgreement from it, the ledger goes by Nomad's: a step of this
	// machine's clock then neither charges the step nor deletes rollups,
	// and a gap (a failover, Consul down) is charged whole. While Nomad's
	// time is not known, the pass's own is used, a pass charges at most
	// usage.MaxInterval, and no rollup is deleted.
	//
	// Within a term each pass is bounded by this process's monotonic clock:
	// a step of Nomad's clock is neither charged nor followed, and no
	// rollup is deleted for it. The ledger's time goes on by the monotonic
	// clock, and allocation times are read at the step's offset.
	Clock func() (time.Time, bool)
	// Monotonic measures the time between passes (nil: the passes' own
	// times, which carry Go's monotonic clock reading).
	Monotonic func() time.Time
	// EndedSince lists the allocations that ended since a time, from
	// Nomad's own allocation times (nil: none): the first pass of a term
	// charges those that ended while no broker led.
	EndedSince func(ctx context.Context, since time.Time) ([]reclaim.Alloc, error)
	// Ended lists the allocations that stopped holding GPUs lately, or are
	// being stopped (nil: none): each is charged up to its end, which the
	// passes that saw it running did not reach.
	Ended func() []reclaim.Alloc
	// Granted is, by tenant, the GPUs above its limit that the approvals in
	// force at now grant (nil: none): not over the limit.
	Granted func(now time.Time) map[string]float64
	// Elsewhere is what the reclaim pass observed in the other regions the
	// broker governs (nil: none): their GPU time is charged with the
	// broker's own region's, each row marked with its region.
	Elsewhere *Elsewhere

	// since is where this term's first charge started (zero before it),
	// and charged the allocations its last pass charged as started.
	since   time.Time
	charged map[string]bool
	expired string                  // the day whose expiry ran last
	recent  map[string]usage.Rollup // the days of the running budget periods, by day
	// last is the ledger's time at its last committed pass in this term
	// and the pass's own (monotonic) time then: zero before the first.
	last, lastLocal time.Time
	offset          time.Duration // how far Nomad's clock is from the ledger's after a step
}

// Observed implements reclaimer.Watcher.
// Long: one charge pass, whose steps share the pass's marks and totals.
func (l *Ledger) Observed(ctx context.Context, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) error {
	local, nomadTime := now, false
	if l.Monotonic != nil {
		local = l.Monotonic()
	}
	if l.Clock != nil {
		if t, ok := l.Clock(); ok {
			// Nomad's clock is read to the second: within clockAgreement
			// the pass's own time is as good, and finer.
			if t.Sub(now).Abs() > clockAgreement {
				now = t
			}
			nomadTime = true
		}
	}
	now, stepped := l.bounded(local, now)
	mark, index, err := l.Store.Mark(ctx)
	if err != nil {
		return err
	}
	through := mark.Through
	if !through.IsZero() && now.Before(through.Add(-clockStepBack)) {
		// The mark is ahead of the clock: it was set while the clock ran
		// ahead, and the clock was put back since. Waiting for the clock to
		// reach the mark would charge nothing for that long: the mark comes
		// back to now, and the time after is charged.
		mark.Through = now
		l.restart()
		ok, err := l.Store.Commit(ctx, index, mark, nil)
		if err != nil {
			return err
		}
		if !ok {
			return ErrMarkMoved
		}
		return fmt.Errorf("%w: the usage mark was %s ahead of the clock, and is back at %s; GPU time from now on is charged",
			ErrClockStepped, through.Sub(now).Round(time.Second), now.UTC().Format(time.RFC3339))
	}
	if !through.IsZero() && !now.After(through) {
		return nil // counted up to now already
	}
	p := l.Policies.Current()
	from, floor := through, l.since
	if !nomadTime && !from.IsZero() && now.Sub(from) > usage.MaxInterval {
		from = now.Add(-usage.MaxInterval) // this clock may have stepped: not the whole step
		floor = from
	}
	var elsewhereEnded []reclaim.Alloc
	if l.Elsewhere != nil {
		more, ended, g := l.Elsewhere.Last()
		allocs, elsewhereEnded = append(slices.Clip(allocs), more...), ended
		gpus = maps.Clone(gpus)
		maps.Copy(gpus, g)
	}
	all, err := l.withEnded(ctx, allocs, through, elsewhereEnded)
	if err != nil {
		return err
	}
	if l.offset != 0 {
		all, floor = l.shifted(all, from, now), from
	}
	charged := l.charge(from, floor, now, all, gpus, p)
	days := make([]usage.Rollup, 0, len(charged))
	for day, by := range charged {
		d, err := l.Store.Day(ctx, day)
		if err != nil {
			return err
		}
		d.Add(by)
		days = append(days, d)
	}
	over, err := l.overLimit(ctx, from, now, all, gpus, p, &days)
	if err != nil {
		return err
	}
	mark.Through = now
	mark.Decayed.Add(now, p.FairShare.HalfLife, p.FairShare.IdleWeight, charged)
	ok, err := l.Store.Commit(ctx, index, mark, days)
	if err != nil {
		return err
	}
	if !ok {
		l.restart() // another leader counts: start over from its mark
		return ErrMarkMoved
	}
	checked := !l.lastLocal.IsZero() // this pass was bounded by the monotonic clock
	l.last, l.lastLocal = now, local
	if l.since.IsZero() {
		l.since = from
		if from.IsZero() {
			l.since = now
		}
	}
	l.charged = make(map[string]bool, len(all))
	for _, a := range all {
		if !a.StartedAt.IsZero() {
			l.charged[a.ID] = true
		}
	}
	for _, by := range charged {
		l.Metrics.GPUSeconds(by)
	}
	l.Metrics.OverLimit(over)
	if err := l.budgets(ctx, p, now, days); err != nil {
		return err
	}
	if stepped != 0 {
		return fmt.Errorf("%w: Nomad's clock moved %s against this process's monotonic clock; GPU time is charged by the latter, "+
			"and no rollup is deleted for it", ErrClockStepped, stepped.Round(time.Second))
	}
	if l.Clock != nil && !nomadTime || !checked {
		// A clock that may have stepped deletes no rollup; nor does a
		// term's first pass, whose time no monotonic clock has checked.
		return nil
	}
	if today := now.UTC().Format(usage.DayFormat); today != l.expired {
		l.expired = today
		return l.Store.DeleteBefore(ctx, now.Add(-p.Usage.Retention).UTC().Format(usage.DayFormat))
	}
	return nil
}

// restart forgets this term's passes: the next counts from the mark as a
// term's first does.
func (l *Ledger) restart() {
	l.since, l.charged = time.Time{}, nil
	l.last, l.lastLocal, l.offset = time.Time{}, time.Time{}, 0
}

// bounded is the ledger's time for a pass at local (the monotonic clock)
// that the clocks put at now. Past the first pass it is the last pass's
// time plus the monotonic time since, when now is more than clockAgreement
// from that: a step of Nomad's clock is neither charged nor followed.
// Otherwise it is now. stepped is how far the offset between the two moved
// at this pass (0: it did not).
func (l *Ledger) bounded(local, now time.Time) (time.Time, time.Duration) {
	if l.lastLocal.IsZero() {
		return now, 0
	}
	expected := l.last.Add(local.Sub(l.lastLocal))
	offset := now.Sub(expected)
	if offset.Abs() <= clockAgreement {
		offset = 0
	}
	stepped := offset - l.offset
	if stepped.Abs() <= clockAgreement {
		stepped = 0
	}
	l.offset = offset
	return now.Add(-offset), stepped
}

// shifted is allocs with their times read back by the offset of Nomad's
// clock after a step, within from and now. Whether a time was read before
// or after the step is not known, so none is trusted beyond the pass.
func (l *Ledger) shifted(allocs []reclaim.Alloc, from, now time.Time) []reclaim.Alloc {
	within := func(t time.Time) time.Time {
		switch t = t.Add(-l.offset); {
		case t.Before(from):
			return from
		case t.After(now):
			return now
		}
		return t
	}
	out := make([]reclaim.Alloc, len(allocs))
	for i, a := range allocs {
		if !a.StartedAt.IsZero() {
			a.StartedAt = within(a.StartedAt)
		}
		if !a.EndedAt.IsZero() {
			a.EndedAt = within(a.EndedAt)
		}
		out[i] = a
	}
	return out
}

// overLimit is, by tenant, the GPU-seconds held above the limit from from to
// now (usage.OverLimitSeconds), added to the rollup of now's day in days.
func (l *Ledger) overLimit(ctx context.Context, from, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU,
	p *policy.Policy, days *[]usage.Rollup) (map[string]float64, error) {
	var granted map[string]float64
	if l.Granted != nil {
		granted = l.Granted(now)
	}
	over := usage.OverLimitSeconds(from, now, allocs, gpus, p, granted, l.Region)
	if len(over) == 0 {
		return nil, nil
	}
	today := now.UTC().Format(usage.DayFormat)
	for i := range *days {
		if (*days)[i].Day == today {
			(*days)[i].AddOverLimit(over)
			return over, nil
		}
	}
	d, err := l.Store.Day(ctx, today)
	if err != nil {
		return nil, err
	}
	d.AddOverLimit(over)
	*days = append(*days, d)
	return over, nil
}

// charge is the GPU time of allocs from from up to now, except for those
// the last pass did not charge as started. The view may see a start only
// after the pass that followed it, so those count from their start, as far
// back as floor. Floor is this term's first charge (what came before is an
// earlier leader's to count); zero: from. One charge from floor does both: an
// allocation charged before counts as started at from at the earliest.
func (l *Ledger) charge(from, floor, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, p *policy.Policy) map[string]map[usage.Key]usage.Seconds {
	if floor.IsZero() || !floor.Before(from) {
		return usage.Charge(from, now, allocs, gpus, p.Usage.IdleBelow, p.ClassOf)
	}
	bounded := make([]reclaim.Alloc, len(allocs))
	for i, a := range allocs {
		if l.charged[a.ID] && a.StartedAt.Before(from) {
			a.StartedAt = from
		}
		bounded[i] = a
	}
	return usage.Charge(floor, now, bounded, gpus, p.Usage.IdleBelow, p.ClassOf)
}

// withEnded is allocs and the ended ones (those of the other regions,
// elsewhere, with the broker's own) that are not among them: one may have
// ended between the pass's observation and now. A term's first pass adds
// those that ended since through, while no broker led.
func (l *Ledger) withEnded(ctx context.Context, allocs []reclaim.Alloc, through time.Time, elsewhere []reclaim.Alloc) ([]reclaim.Alloc, error) {
	ended := elsewhere
	if l.Ended != nil {
		ended = append(slices.Clip(ended), l.Ended()...)
	}
	if l.EndedSince != nil && l.lastLocal.IsZero() && !through.IsZero() {
		gap, err := l.EndedSince(ctx, through)
		if err != nil {
			return nil, err
		}
		ended = append(ended, gap...)
	}
	if len(ended) == 0 {
		return allocs, nil
	}
	running := make(map[string]bool, len(allocs))
	for _, a := range allocs {
		running[a.ID] = !a.Preempted
	}
	out := slices.Clip(allocs)
	for _, a := range ended {
		if !running[a.ID] {
			out = append(out, a)
			running[a.ID] = true // once, where both the view and Nomad's listing have it
		}
	}
	return out, nil
}

// budgets brings the days of the running budget periods up to date (read
// once a term, then kept from what is committed) and sets the states.
func (l *Ledger) budgets(ctx context.Context, p *policy.Policy, now time.Time, committed []usage.Rollup) error {
	if l.Budgets == nil {
		return nil
	}
	from := usage.EarliestPeriodStart(now).Format(usage.DayFormat)
	if l.recent == nil {
		days, err := l.Store.Days(ctx, from, now.UTC().Format(usage.DayFormat))
		if err != nil {
			return err
		}
		l.recent = map[string]usage.Rollup{}
		for _, d := range days {
			l.recent[d.Day] = d
		}
	}
	for _, d := range committed {
		l.recent[d.Day] = d
	}
	all := make([]usage.Rollup, 0, len(l.recent))
	for day, d := range l.recent {
		if day < from {
			delete(l.recent, day)
			continue
		}
		all = append(all, d)
	}
	l.Budgets.Set(usage.Budgets(p, all, now))
	return nil
}
