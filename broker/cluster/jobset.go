package cluster

import "github.com/nomad-gpu/nomad-gpu/broker/admission"

// jobSet is the view's jobs tracker. It keeps the live GPU jobs, what their
// active deployments add (unpromoted canaries, and the stable version a
// deployment that may revert falls back to), and the live jobs that would
// use GPUs they do not ask for. The view holds its lock around it and counts a
// job's demand, as demand says, in the namespaces' totals.
type jobSet struct {
	live     map[jobKey]job
	canaries map[jobKey]map[string]int // unpromoted canaries of a job's active deployment, by group
	// stable is the GPU demand of a job's latest stable version (Nomad's
	// auto_revert target), and reverting the jobs whose active deployment
	// reverts to it on failure: those count the larger of both.
	stable     map[jobKey][]admission.Group
	reverting  map[jobKey]bool
	undeclared map[jobKey]string // see nomadjob.UndeclaredGPUAccess, with how
}

func newJobSet() jobSet {
	return jobSet{live: map[jobKey]job{}, canaries: map[jobKey]map[string]int{}, stable: map[jobKey][]admission.Group{},
		reverting: map[jobKey]bool{}, undeclared: map[jobKey]string{}}
}

// relisted is the set a full listing starts from: what is known of stable
// versions stays for the jobs still there (keep), since a listing reads
// stable versions only for active deployments.
func (s jobSet) relisted(keep func(jobKey) bool) jobSet {
	out := newJobSet()
	for key, g := range s.stable {
		if keep(key) {
			out.stable[key] = g
		}
	}
	return out
}

// demand is what a job of groups counts, by model: its groups, its
// deployment's canaries, and no less than its stable version while its
// deployment may revert to it.
func (s jobSet) demand(key jobKey, groups []admission.Group) map[string]int {
	d := demandByModel(groups)
	for _, g := range groups {
		d[g.Model] += s.canaries[key][g.Name] * g.GPUsPerAlloc
	}
	if s.reverting[key] {
		atLeast(d, demandByModel(s.stable[key]))
	}
	return d
}

// setStable records a job's stable version's groups (none: it has no GPUs
// to revert to).
func (s jobSet) setStable(key jobKey, groups []admission.Group) {
	if len(groups) == 0 {
		delete(s.stable, key)
		return
	}
	s.stable[key] = groups
}

// deployment records what a job's deployment adds: its unpromoted
// canaries by group, and whether it reverts to the stable version.
func (s jobSet) deployment(key jobKey, canaries map[string]int, reverting bool) {
	if len(canaries) == 0 {
		delete(s.canaries, key)
	} else {
		s.canaries[key] = canaries
	}
	if reverting {
		s.reverting[key] = true
	} else {
		delete(s.reverting, key)
	}
}

// forget drops what a job's deployments added, once Nomad no longer has
// the job; the view removes the live job itself (View.remove), taking its
// demand out of the totals.
func (s jobSet) forget(key jobKey) {
	delete(s.canaries, key)
	delete(s.stable, key)
	delete(s.reverting, key)
}
