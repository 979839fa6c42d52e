package cluster

import (
	"maps"
	"slices"
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

// reservations are the admitted demand not yet known to be in Nomad, by
// job; seq numbers each, so that a Reservation acts on its own alone. The
// view calls them with its lock held.
type reservations struct {
	m    map[jobKey]reservation
	next uint64
}

func newReservations() reservations { return reservations{m: map[jobKey]reservation{}} }

// add reserves demand for key until until, and returns its seq.
func (rs *reservations) add(key jobKey, demand map[string]int, borrowed bool, until time.Time) uint64 {
	rs.next++
	rs.m[key] = reservation{seq: rs.next, demand: demand, borrowed: borrowed, until: until}
	return rs.next
}

// confirm records that Nomad took the registration of key's reservation seq
// at index (0: under another id, whose events follow within moments: it
// keeps settleGrace from now at most); false: that reservation is gone.
func (rs *reservations) confirm(key jobKey, seq, index uint64, now time.Time) bool {
	res, ok := rs.m[key]
	if !ok || res.seq != seq {
		return false
	}
	res.index = index
	if index == 0 {
		res.until = minTime(res.until, now.Add(settleGrace))
	}
	rs.m[key] = res
	return true
}

// move gives key's reservation seq to child, which Nomad took at index;
// false: that reservation is gone.
func (rs *reservations) move(key, child jobKey, seq, index uint64) bool {
	res, ok := rs.m[key]
	if !ok || res.seq != seq {
		return false
	}
	delete(rs.m, key)
	res.index = index
	rs.m[child] = res
	return true
}

// withdraw gives key's reservation seq up.
func (rs *reservations) withdraw(key jobKey, seq uint64) {
	if res, ok := rs.m[key]; ok && res.seq == seq {
		delete(rs.m, key)
	}
}

// settle ends key's confirmed reservation once the job as recorded (its
// demand, at modifyIndex) covers it, and gives one it does not cover
// settleGrace from now.
func (rs *reservations) settle(key jobKey, recorded bool, demand map[string]int, modifyIndex uint64, now time.Time) {
	res, ok := rs.m[key]
	if !ok || res.index == 0 || !recorded || modifyIndex < res.index {
		return
	}
	for model, n := range res.demand {
		if demand[model] < n {
			res.until = minTime(res.until, now.Add(settleGrace))
			rs.m[key] = res
			return
		}
	}
	delete(rs.m, key)
}

// stopped ends key's reservation when Nomad took its registration and has
// stopped the job since (at modifyIndex): nothing of it is still to come.
func (rs *reservations) stopped(key jobKey, modifyIndex uint64) {
	if res, ok := rs.m[key]; ok && res.index != 0 && res.index < modifyIndex {
		delete(rs.m, key)
	}
}

// registers reports whether key's reservation is the broker's registration
// of the version at modifyIndex (or one Nomad has not answered yet).
func (rs *reservations) registers(key jobKey, modifyIndex uint64) bool {
	res, ok := rs.m[key]
	return ok && (res.index == 0 || res.index == modifyIndex)
}

// live reports whether key holds a reservation that has not expired by now.
func (rs *reservations) live(key jobKey, now time.Time) bool {
	res, ok := rs.m[key]
	return ok && now.Before(res.until)
}

// unexpired drops the reservations expired by now, and returns the others.
func (rs *reservations) unexpired(now time.Time) map[jobKey]reservation {
	maps.DeleteFunc(rs.m, func(_ jobKey, r reservation) bool { return !now.Before(r.until) })
	return rs.m
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
	return v.admit(p, j, nil, admission.Region{})
}

// admit is Admit with what the job's tenant holds in other regions added to
// its usage, and what its region holds back (Regions).
func (v *View) admit(p *policy.Policy, j admission.Job, elsewhere map[string]admission.TenantUsage, region admission.Region) (admission.Decision, *Reservation) {
	v.mu.Lock()
	defer v.mu.Unlock()
	u := v.regionUsage(p, j, region)
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
		v.jobs.stable[key] = j.RevertTo
		atLeast(demand, demandByModel(j.RevertTo))
	}
	seq := v.reserved.add(key, demand, d.Outcome == admission.AdmitBorrowed, v.clock.Now().Add(ReservationHold))
	v.place(key, seq, j, d.Placed)
	return d, &Reservation{v: v, key: key, seq: seq}
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
	if r.v.reserved.confirm(r.key, r.seq, index, r.v.clock.Now()) {
		r.v.settle(r.key)
	}
}

// ConfirmAs is Confirm for a job Nomad created under an id of its own (a
// dispatched child, at its create index). The reservation moves to that
// id: it counts until the view's events show that job, however late they
// come, and never beside it.
func (r *Reservation) ConfirmAs(id string, index uint64) {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	defer r.v.mu.Unlock()
	child := jobKey{r.key.namespace, id}
	if !r.v.reserved.move(r.key, child, r.seq, index) {
		return
	}
	if r.v.placing.move(r.key, child, r.seq) {
		// The nodes chosen are the child's: its allocations show them
		// taken. Left under the parent's id, nothing of the parent's ever
		// would, and they looked taken until the placement expired.
		r.v.rooms = nil
	}
	r.key = child
	r.v.settle(r.key)
}

// settle ends a confirmed reservation that the job's recorded demand covers,
// and gives one it does not cover a short grace.
func (v *View) settle(key jobKey) {
	rec, recorded := v.jobs.live[key]
	v.reserved.settle(key, recorded, rec.demand, rec.modifyIndex, v.clock.Now())
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Release gives the reservation up: Nomad did not take the job. It sets off
// a queue pass, which may admit what the reservation held back.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	r.Withdraw()
	r.v.notify()
}

// Withdraw gives the reservation up without setting off a queue pass. The
// queue's own pass made it and withdraws it (the entry waits, backs off or
// is held back); a pass woken by its own withdrawals would decide the same
// again, in a loop.
func (r *Reservation) Withdraw() {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	defer r.v.mu.Unlock()
	r.v.reserved.withdraw(r.key, r.seq)
	if r.v.placing.drop(r.key, r.seq) {
		r.v.rooms = nil
	}
}

// heldSince is the GPUs the live allocations of key created after index
// hold, no more than its excess. It walks every allocation held: it is
// asked only while a job's allocations exceed its recorded demand.
func (v *View) heldSince(key jobKey, index uint64) int {
	excess := 0
	for _, e := range v.excess[key] {
		excess += e
	}
	return min(v.holds.createdAfter(key, index), excess)
}

// reservationExtra drops expired reservations and returns, per namespace, the
// GPUs by model that live ones add beyond what their job's recorded demand
// and its allocations count (nil with no reservation: usage is read for every
// decision and region).
func (v *View) reservationExtra(except jobKey) (extra, extraBorrowed map[string]map[string]int) {
	live := v.reserved.unexpired(v.clock.Now())
	if len(live) == 0 {
		return nil, nil
	}
	extra, extraBorrowed = map[string]map[string]int{}, map[string]map[string]int{}
	for key, r := range live {
		if key == except {
			continue
		}
		// The allocations Nomad placed for the registration it took (created
		// after its JobModifyIndex) count as excess while the job's own
		// event has not come: those GPUs are the reservation's, not more.
		// Their device names may differ from the model asked for ("" for
		// any), so they are taken in all.
		rec, counted := v.jobs.live[key].demand, 0
		if len(v.excess[key]) > 0 && r.index > 0 {
			// Only what they hold beyond the job's recorded demand: within
			// it they are that version's, and what the reservation adds
			// beyond it (the stable version a deployment may revert to)
			// still counts.
			counted = v.heldSince(key, r.index)
			for _, n := range rec {
				counted -= n
			}
			counted = max(counted, 0)
		}
		for _, model := range slices.Sorted(maps.Keys(r.demand)) {
			d := r.demand[model] - rec[model]
			take := min(max(d, 0), counted)
			d, counted = d-take, counted-take
			if d > 0 {
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
