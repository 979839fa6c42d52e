package cluster

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// unreached notes that following the region failed (err), from the first
// failure since it was last listed.
func (v *View) unreached(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.unreachable.IsZero() {
		v.unreachable = v.clock.Now()
	}
	v.unreachableWhy = err.Error()
}

// reached notes that the region was listed in full.
func (v *View) reached() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.unreachable, v.unreachableWhy, v.lost = time.Time{}, "", nil
}

// endedDispatchKept is how long the view remembers a job the broker
// dispatched that ended: Nomad's own job_gc_threshold by default.
const endedDispatchKept = 4 * time.Hour

// noteDispatched keeps j (of key) as the broker's dispatch to the view's
// region while it is live and its stamp verified, and as one that ended once
// it is not live. The caller holds v.mu.
func (v *View) noteDispatched(key jobKey, j *api.Job, live, verified bool) {
	delete(v.dispatched, key)
	delete(v.endedDispatch, key)
	switch {
	case j.Meta[nomadjob.MetaDispatched] == "":
	case live && verified:
		v.dispatched[key] = j
	case !live:
		now := v.clock.Now()
		v.endedDispatch[key] = now
		if now.Sub(v.endedSwept) > time.Minute {
			v.endedSwept = now
			maps.DeleteFunc(v.endedDispatch, func(_ jobKey, at time.Time) bool { return now.Sub(at) > endedDispatchKept })
		}
	}
}

// Unreachable is since when following the view's region has failed, and the
// last failure (zero while it is followed).
func (v *View) Unreachable() (since time.Time, why string) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.unreachable, v.unreachableWhy
}

// Dispatched are the live jobs the broker placed in the view's region, as
// Nomad last returned them, by namespace and id.
func (v *View) Dispatched() []*api.Job {
	v.mu.RLock()
	defer v.mu.RUnlock()
	keys := slices.SortedFunc(maps.Keys(v.dispatched), func(a, b jobKey) int {
		if a.namespace != b.namespace {
			return cmp.Compare(a.namespace, b.namespace)
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]*api.Job, 0, len(keys))
	for _, k := range keys {
		out = append(out, v.dispatched[k])
	}
	return out
}

// Lose drops a job of a region the broker lost, as Nomad will once it marks
// its allocations lost: they end now (the ledger charges them until now)
// and the job holds nothing of its tenant's guarantee. Its GPUs count
// against its tenant's limit alone (Unsettled) until the region is listed
// again, and its listing shows the job again if it still runs there.
func (v *View) Lose(namespace, id string) {
	v.mu.Lock()
	now := v.clock.Now()
	if j, ok := v.jobs[jobKey{namespace, id}]; ok && len(j.demand) > 0 {
		if v.lost == nil {
			v.lost = map[jobKey]map[string]int{}
		}
		v.lost[jobKey{namespace, id}] = maps.Clone(j.demand)
	}
	for _, a := range v.allocs {
		if a.Namespace == namespace && a.JobID == id {
			v.observeAlloc(&api.Allocation{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, TaskGroup: a.Group, NodeID: a.NodeID,
				DesiredStatus: api.AllocDesiredStatusStop, ClientStatus: api.AllocClientStatusLost, CreateIndex: a.CreateIndex,
				ModifyIndex: a.ModifyIndex, ModifyTime: now.UnixNano()}, false)
		}
	}
	v.forgetJob(namespace, id)
	v.mu.Unlock()
	v.notify()
}

// Unreachable is since when following region has failed, and why (zero
// while it is followed, or when the broker does not govern it).
func (r *Regions) Unreachable(region string) (time.Time, string) {
	v, _, ok := r.In(region)
	if !ok {
		return time.Time{}, ""
	}
	return v.Unreachable()
}

// DispatchedElsewhere is the job namespace/id as the broker placed it in
// another region than region (nil: it placed it in none).
func (r *Regions) DispatchedElsewhere(region, namespace, id string) *api.Job {
	in, _, _ := r.In(region)
	for _, v := range r.Views() {
		if v == in {
			continue
		}
		v.mu.RLock()
		j := v.dispatched[jobKey{namespace, id}]
		v.mu.RUnlock()
		if j != nil {
			return j
		}
	}
	return nil
}

// DispatchedIn are the live jobs the broker placed in region (Dispatched).
func (r *Regions) DispatchedIn(region string) []*api.Job {
	if v, _, ok := r.In(region); ok {
		return v.Dispatched()
	}
	return nil
}

// LoseIn drops the job namespace/id of region, which the broker lost
// (View.Lose).
func (r *Regions) LoseIn(region, namespace, id string) {
	if v, _, ok := r.In(region); ok {
		v.Lose(namespace, id)
	}
}

// Reached reports whether region is listed and followed now.
func (r *Regions) Reached(region string) bool {
	v, _, ok := r.In(region)
	if !ok || !v.Synced() {
		return false
	}
	since, _ := v.Unreachable()
	return since.IsZero()
}
