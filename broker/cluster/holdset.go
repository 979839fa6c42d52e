package cluster

// hold is what a live allocation holds, by model, for its job.
type hold struct {
	key     jobKey
	byModel map[string]int
	created uint64 // the allocation's CreateIndex
}

// holdSet is the allocations tracker's count of what live allocations
// hold: by allocation, and summed by job. The view holds its lock around
// it, and counts what a job's allocations hold beyond its demand as excess.
type holdSet struct {
	byAlloc map[string]hold
	byJob   map[jobKey]map[string]int
}

func newHoldSet() holdSet {
	return holdSet{byAlloc: map[string]hold{}, byJob: map[jobKey]map[string]int{}}
}

// set makes h what allocation id holds, replacing what it held before; a
// hold of nothing drops it.
func (s holdSet) set(id string, h hold) {
	if old, ok := s.byAlloc[id]; ok {
		job := s.byJob[old.key]
		for m, n := range old.byModel {
			if job[m] -= n; job[m] <= 0 {
				delete(job, m)
			}
		}
		if len(job) == 0 {
			delete(s.byJob, old.key)
		}
		delete(s.byAlloc, id)
	}
	if len(h.byModel) == 0 {
		return
	}
	s.byAlloc[id] = h
	if s.byJob[h.key] == nil {
		s.byJob[h.key] = map[string]int{}
	}
	for m, n := range h.byModel {
		s.byJob[h.key][m] += n
	}
}

// of is what key's live allocations hold, by model (nil: nothing); read it,
// do not change it.
func (s holdSet) of(key jobKey) map[string]int { return s.byJob[key] }

// createdAfter is the GPUs key's live allocations created after index
// hold. It walks every allocation held.
func (s holdSet) createdAfter(key jobKey, index uint64) int {
	n := 0
	for _, h := range s.byAlloc {
		if h.key == key && h.created > index {
			for _, g := range h.byModel {
				n += g
			}
		}
	}
	return n
}
