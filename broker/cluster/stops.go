package cluster

import (
	"maps"
	"time"
)

// stops are the jobs with the broker's stamp that Nomad stopped (or, for
// batch work, that finished), at the stop's JobModifyIndex, until the
// leader records them or the broker registers them again. The view calls
// them with its lock held.
type stops map[jobKey]stop

// stop is a stop the leader has not recorded yet, with when the view saw it.
type stop struct {
	index uint64
	seen  time.Time
}

// unrecordedStopKept is how long a listing keeps a stop seen before it
// whose job it lists no more (purged, collected): the leader records one
// at its next reclaim pass, and a follower, which records none, forgets it.
const unrecordedStopKept = time.Hour

// saw notes the stop of key at index, seen at now (a stop seen again keeps
// when it was first seen).
func (s stops) saw(key jobKey, index uint64, now time.Time) {
	if st, ok := s[key]; !ok || st.index != index {
		s[key] = stop{index: index, seen: now}
	}
}

// revived ends the stop of key: the broker registered the job again.
func (s stops) revived(key jobKey) { delete(s, key) }

// recorded ends the stop of key at index, which the leader recorded.
func (s stops) recorded(key jobKey, index uint64) {
	if s[key].index == index {
		delete(s, key)
	}
}

// prune forgets the stops seen more than unrecordedStopKept before now.
func (s stops) prune(now time.Time) {
	maps.DeleteFunc(s, func(_ jobKey, st stop) bool { return now.Sub(st.seen) > unrecordedStopKept })
}

// pending are the stops by namespace and id, with their indexes.
func (s stops) pending() map[[2]string]uint64 {
	out := make(map[[2]string]uint64, len(s))
	for k, st := range s {
		out[[2]string{k.namespace, k.id}] = st.index
	}
	return out
}
