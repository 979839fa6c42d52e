package cluster

import (
	"cmp"
	"iter"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// regionStatus is what the view knows of its region as a whole: whether it
// is followed, the jobs the broker dispatched there (live, and ended
// lately), and the GPUs of the jobs dropped with it while it is lost. The
// view calls it with its lock held.
type regionStatus struct {
	// unreachable is since when following the region fails (zero while it
	// is followed), and why.
	unreachable    time.Time
	unreachableWhy string
	// dispatched are the live jobs the broker placed in this region (meta
	// nomad-gpu.dispatched-region, verified stamp) as Nomad returned them:
	// what is requeued elsewhere if the region is lost.
	dispatched map[jobKey]*api.Job
	// endedDispatch are the jobs the broker dispatched to this region that
	// stopped or finished, with when it saw that (kept endedDispatchKept):
	// a read of one that names no region is sent here.
	endedDispatch map[jobKey]time.Time
	endedSwept    time.Time
	// lost are the GPUs, by model, of the jobs lose dropped while the
	// region is unreachable, until it is listed again: they may run there
	// still, beside a copy requeued elsewhere (see TenantUsage.Unsettled).
	lost map[jobKey]map[string]int
}

func newRegionStatus() regionStatus {
	return regionStatus{dispatched: map[jobKey]*api.Job{}, endedDispatch: map[jobKey]time.Time{}}
}

// endedDispatchKept is how long the view remembers a job the broker
// dispatched that ended: Nomad's own job_gc_threshold by default.
const endedDispatchKept = 4 * time.Hour

// failed notes that following the region failed at now (why), from the
// first failure since it was last listed.
func (s *regionStatus) failed(now time.Time, why string) {
	if s.unreachable.IsZero() {
		s.unreachable = now
	}
	s.unreachableWhy = why
}

// listed notes that the region was listed in full: it is followed, and
// what it still runs is in the listing.
func (s *regionStatus) listed() {
	s.unreachable, s.unreachableWhy, s.lost = time.Time{}, "", nil
}

// relisting starts the live dispatched jobs again, for a listing to fill.
func (s *regionStatus) relisting() { s.dispatched = map[jobKey]*api.Job{} }

// noteDispatched keeps j (of key) as the broker's dispatch to the region
// while it is live and its stamp verified, and as one that ended (at now)
// once it is not live.
func (s *regionStatus) noteDispatched(key jobKey, j *api.Job, live, verified bool, now time.Time) {
	delete(s.dispatched, key)
	delete(s.endedDispatch, key)
	switch {
	case j.Meta[nomadjob.MetaDispatched] == "":
	case live && verified:
		s.dispatched[key] = j
	case !live:
		s.endedDispatch[key] = now
		if now.Sub(s.endedSwept) > time.Minute {
			s.endedSwept = now
			maps.DeleteFunc(s.endedDispatch, func(_ jobKey, at time.Time) bool { return now.Sub(at) > endedDispatchKept })
		}
	}
}

// forget drops a job gone from the region.
func (s *regionStatus) forget(key jobKey) { delete(s.dispatched, key) }

// endedLately reports whether the broker dispatched key here and it ended
// within endedDispatchKept; endedKeys are all such jobs.
func (s *regionStatus) endedLately(key jobKey) bool {
	_, ok := s.endedDispatch[key]
	return ok
}

func (s *regionStatus) endedKeys() iter.Seq[jobKey] { return maps.Keys(s.endedDispatch) }

// dispatchedJobs are the live jobs the broker placed here, by namespace and id.
func (s *regionStatus) dispatchedJobs() []*api.Job {
	keys := slices.SortedFunc(maps.Keys(s.dispatched), func(a, b jobKey) int {
		if a.namespace != b.namespace {
			return cmp.Compare(a.namespace, b.namespace)
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]*api.Job, 0, len(keys))
	for _, k := range keys {
		out = append(out, s.dispatched[k])
	}
	return out
}

// lose keeps the GPUs (by model) of a job dropped with the region, until it
// is listed again.
func (s *regionStatus) lose(key jobKey, demand map[string]int) {
	if s.lost == nil {
		s.lost = map[jobKey]map[string]int{}
	}
	s.lost[key] = maps.Clone(demand)
}
