package reclaimer

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Profiles is where profiles are kept between leaders.
type Profiles interface {
	List(ctx context.Context) ([]usage.Profile, error)
	Put(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error)
	Delete(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error)
}

// FlushEvery is how many reclaim periods the samples stay in the leader's
// memory between writes: at 30 s a write every 5 minutes, whatever the
// number of jobs. A leader lost in between loses at most that much of the
// samples, which right-sizing can spare.
const FlushEvery = 10

// Recorder samples each observation into the leader's table of profiles,
// which it loads at the start of its term, writes back every FlushEvery
// periods, and expires after the reclaim retention. One per leader term.
type Recorder struct {
	Store    Profiles
	Table    *usage.Profiles
	Policies policy.Source

	loaded    bool
	lastFlush time.Time
}

// EveryRegion: right-sizing samples the jobs of every region.
func (*Recorder) EveryRegion() {}

// Observed implements reclaimer.Watcher.
func (r *Recorder) Observed(ctx context.Context, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU) error {
	if !r.loaded {
		ps, err := r.Store.List(ctx)
		if err != nil {
			return err
		}
		r.Table.Load(ps)
		r.loaded, r.lastFlush = true, now
	}
	p := r.Policies.Current()
	r.Table.Sample(now, allocs, gpus, p.Usage.IdleBelow)
	if now.Sub(r.lastFlush) < FlushEvery*p.ReclaimSettings.Period {
		return nil
	}
	return r.Flush(ctx, now)
}

// Flush writes the profiles changed since the last flush and removes
// those expired.
func (r *Recorder) Flush(ctx context.Context, now time.Time) error {
	r.lastFlush = now
	left, err := r.Store.Put(ctx, r.Table.TakeDirty())
	r.Table.MarkDirty(left)
	_, err2 := r.Store.Delete(ctx, r.Table.Expire(now.Add(-r.Policies.Current().ReclaimSettings.Retention), usage.MaxProfiles))
	return errors.Join(err, err2)
}
