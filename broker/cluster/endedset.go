package cluster

import (
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// endedRetention is how long an ended allocation is kept for the usage
// ledger: a pass charges the time it ran since the one before, however
// late (Consul down, a leader failover), within this.
const endedRetention = time.Hour

// endedSet is the allocations tracker's record, for the usage ledger, of
// allocations that held GPUs and stopped holding them (ended, stopped or
// preempted) since they were last charged as running: when their tasks
// ended, until endedRetention after. Until its client says its tasks
// ended, one is charged as running. The view holds its lock around it.
type endedSet struct {
	byID  map[string]Alloc
	swept time.Time // when byID was last swept
}

func newEndedSet() endedSet { return endedSet{byID: map[string]Alloc{}} }

// track records a, which was old (had: the view knew it) and is live no
// longer, once it stops holding GPUs after it ran; and when the tasks of
// one already recorded end. The clock is read only then.
func (s *endedSet) track(a *api.Allocation, old Alloc, had, live bool, c clock.Clock) {
	e, ending := s.byID[a.ID]
	switch {
	case ending:
		if a.ModifyIndex < e.ModifyIndex {
			return
		}
	case had && !old.Preempted && !live && !old.StartedAt.IsZero():
		e = old
	default:
		return
	}
	e.ModifyIndex, e.EndedAt = a.ModifyIndex, tasksEnded(a)
	s.byID[a.ID] = e
	if now := c.Now(); now.Sub(s.swept) > time.Minute {
		s.swept = now
		for id, e := range s.byID {
			if !e.EndedAt.IsZero() && now.Sub(e.EndedAt) > endedRetention {
				delete(s.byID, id)
			}
		}
	}
}

// unseen records what a full listing says ended while events were not
// followed. Those are allocations that were running (was) and are no
// longer (not in now, or preempted since: ended by now), and those being
// stopped that the listing (listed) no longer has.
func (s endedSet) unseen(was, current map[string]Alloc, listed map[string]*api.Allocation, now time.Time) {
	for id, o := range was {
		if n, ok := current[id]; (ok && !n.Preempted) || o.Preempted || o.StartedAt.IsZero() {
			continue
		}
		if _, ok := s.byID[id]; !ok {
			s.byID[id] = o
		}
	}
	for id, e := range s.byID {
		if !e.EndedAt.IsZero() {
			continue
		}
		if a, ok := listed[id]; ok {
			e.EndedAt = tasksEnded(a)
		} else {
			e.EndedAt = now
		}
		s.byID[id] = e
	}
}

// list is what it holds, by id.
func (s endedSet) list() []Alloc {
	out := make([]Alloc, 0, len(s.byID))
	for _, a := range s.byID {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
