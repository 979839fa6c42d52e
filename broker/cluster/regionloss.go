package cluster

import (
	"time"

	"github.com/hashicorp/nomad/api"
)

// unreached notes that following the region failed (err), from the first
// failure since it was last listed.
func (v *View) unreached(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.status.failed(v.clock.Now(), err.Error())
}

// reached notes that the region was listed in full.
func (v *View) reached() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.status.listed()
}

// Unreachable is since when following the view's region has failed, and the
// last failure (zero while it is followed).
func (v *View) Unreachable() (since time.Time, why string) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.status.unreachable, v.status.unreachableWhy
}

// Dispatched are the live jobs the broker placed in the view's region, as
// Nomad last returned them, by namespace and id.
func (v *View) Dispatched() []*api.Job {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.status.dispatchedJobs()
}

// Lose drops a job of a region the broker lost, as Nomad will once it marks
// its allocations lost: they end now (the ledger charges them until now)
// and the job holds nothing of its tenant's guarantee. Its GPUs count
// against its tenant's limit alone (Unsettled) until the region is listed
// again, and its listing shows the job again if it still runs there.
func (v *View) Lose(namespace, id string) {
	v.mu.Lock()
	now := v.clock.Now()
	if j, ok := v.jobs.live[jobKey{namespace, id}]; ok && len(j.demand) > 0 {
		v.status.lose(jobKey{namespace, id}, j.demand)
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
		j := v.status.dispatched[jobKey{namespace, id}]
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
