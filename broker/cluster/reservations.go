package cluster

import (
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// reservation is demand admitted by this broker and sent to Nomad, counted
// (as the larger of it and what the job's events say) until it expires, so
// that a decision taken right after it sees it even before Nomad's event.
type reservation struct {
	seq      uint64
	demand   map[string]int
	borrowed bool
	until    time.Time
	index    uint64 // Nomad's JobModifyIndex for it, once Nomad took the job
}

// settleGrace is how long a reservation stays after its job's event when the
// event shows less than was reserved: the deployment event with the canaries
// follows the job event.
const settleGrace = 5 * time.Second

// ReservationHold bounds how long an admitted job counts on its own before
// Nomad's events show it: normally they do within a second.
const ReservationHold = 2 * time.Minute

// Admit decides on job (its namespace and id in job) against the current
// usage and, when it admits, reserves the demand before any other decision
// can see the usage without it. The reservation holds until the job's events
// show it, it is released (the registration failed), or ReservationHold ends.
func (v *View) Admit(p *policy.Policy, j admission.Job) (admission.Decision, *Reservation) {
	return v.admit(p, j, nil)
}

// admit is Admit with what the job's tenant holds in other regions added to
// its usage (Regions).
func (v *View) admit(p *policy.Policy, j admission.Job, elsewhere map[string]admission.TenantUsage) (admission.Decision, *Reservation) {
	v.mu.Lock()
	defer v.mu.Unlock()
	u := v.usageFor(p, j)
	addTenants(u, elsewhere)
	d := admission.Decide(p, j, u)
	if d.Demand.Total() == 0 || (d.Outcome != admission.Admit && d.Outcome != admission.AdmitBorrowed) {
		return d, nil
	}
	key := jobKey{j.Namespace, j.ID}
	demand := demandByModel(j.Groups)
	if len(j.RevertTo) > 0 {
		// What Nomad read as the stable version is known from now on, so
		// that the deployment's events count it.
		v.stable[key] = j.RevertTo
		atLeast(demand, demandByModel(j.RevertTo))
	}
	v.nextRes++
	v.reserved[key] = reservation{seq: v.nextRes, demand: demand, borrowed: d.Outcome == admission.AdmitBorrowed,
		until: v.clock.Now().Add(ReservationHold)}
	v.place(key, v.nextRes, j, d.Placed)
	return d, &Reservation{v: v, key: key, seq: v.nextRes}
}

// Reservation is admitted demand not yet known to be in Nomad.
type Reservation struct {
	v   *View
	key jobKey
	seq uint64
}

// Confirm records that Nomad took the job at index (its JobModifyIndex): the
// reservation ends once the view's events show the job at that index with
// all the reserved demand. Index 0 is a job Nomad created under another id
// (dispatch, periodic force): its own events follow within moments.
func (r *Reservation) Confirm(index uint64) {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	defer r.v.mu.Unlock()
	if res, ok := r.v.reserved[r.key]; ok && res.seq == r.seq {
		res.index = index
		if index == 0 {
			res.until = minTime(res.until, r.v.clock.Now().Add(settleGrace))
		}
		r.v.reserved[r.key] = res
		r.v.settle(r.key)
	}
}

// ConfirmAs is Confirm for a job Nomad created under an id of its own (a
// dispatched child, at its create index): the reservation moves to that id,
// so that it counts until the view's events show that job, however late
// they come, and never beside it.
func (r *Reservation) ConfirmAs(id string, index uint64) {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	defer r.v.mu.Unlock()
	res, ok := r.v.reserved[r.key]
	if !ok || res.seq != r.seq {
		return
	}
	delete(r.v.reserved, r.key)
	r.key = jobKey{r.key.namespace, id}
	res.index = index
	r.v.reserved[r.key] = res
	r.v.settle(r.key)
}

// settle ends a confirmed reservation that the job's recorded demand covers,
// and gives one it does not cover a short grace.
func (v *View) settle(key jobKey) {
	res, ok := v.reserved[key]
	rec, recorded := v.jobs[key]
	if !ok || res.index == 0 || !recorded || rec.modifyIndex < res.index {
		return
	}
	for model, n := range res.demand {
		if rec.demand[model] < n {
			res.until = minTime(res.until, v.clock.Now().Add(settleGrace))
			v.reserved[key] = res
			return
		}
	}
	delete(v.reserved, key)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Release gives the reservation up: Nomad did not take the job.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	if res, ok := r.v.reserved[r.key]; ok && res.seq == r.seq {
		delete(r.v.reserved, r.key)
	}
	if pl, ok := r.v.placing[r.key]; ok && pl.seq == r.seq {
		r.v.unplace(r.key)
	}
	r.v.mu.Unlock()
	r.v.notify()
}

// reservationExtra drops expired reservations and returns, per namespace, the
// GPUs by model that live ones add beyond their job's recorded demand.
func (v *View) reservationExtra(except jobKey) (extra, extraBorrowed map[string]map[string]int) {
	extra, extraBorrowed = map[string]map[string]int{}, map[string]map[string]int{}
	now := v.clock.Now()
	for key, r := range v.reserved {
		if !now.Before(r.until) {
			delete(v.reserved, key)
			continue
		}
		if key == except {
			continue
		}
		rec := v.jobs[key].demand
		for model, n := range r.demand {
			if d := n - rec[model]; d > 0 {
				if extra[key.namespace] == nil {
					extra[key.namespace], extraBorrowed[key.namespace] = map[string]int{}, map[string]int{}
				}
				extra[key.namespace][model] += d
				if r.borrowed {
					extraBorrowed[key.namespace][model] += d
				}
			}
		}
	}
	return extra, extraBorrowed
}
