package sim

import (
	"slices"
	"strconv"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// The broker's placement (policy placement): the rooms admission reads
// node by node, the jobs pinned to the nodes it chose, and the nodes held for
// a job that waited reserve_after.

// roomsNow are the nodes as the broker sees them now: free GPUs less those
// pinned jobs not placed yet wait for, and the borrowed allocations on each.
// An allocation placed at this instant holds its GPUs but is no borrowed
// victim yet: the broker's view learns of it from Nomad after the pass that
// admitted it, so a later admission of that pass cannot pin onto it.
// Only the nodes whose allocations changed since the last call are read again.
func (r *run) roomsNow() []admission.NodeRoom {
	if r.rooms == nil {
		r.rooms = make([]admission.NodeRoom, len(r.c.nodes))
		r.waitingOn = make([]int, len(r.c.nodes))
		r.reservedFor = make([]string, len(r.c.nodes))
	}
	seen := 0
	for ; seen < len(r.unseen) && r.unseen[seen].at < r.now; seen++ {
		r.c.touch(r.unseen[seen].node)
	}
	r.unseen = r.unseen[:copy(r.unseen, r.unseen[seen:])]
	for _, id := range r.c.touched {
		r.c.isTouched[id] = false
		n := &r.c.nodes[id]
		room := &r.rooms[id]
		*room = admission.NodeRoom{ID: strconv.Itoa(id), Group: r.c.models[n.model], GPUs: n.gpus, Free: max(0, n.free-r.waitingOn[id]),
			Held: room.Held[:0], ReservedFor: r.reservedFor[id]}
		for _, a := range n.allocs {
			if !a.job.borrowed || a.placedAt == r.now {
				continue
			}
			since := r.now
			if a.job.state == stRunning {
				since = a.job.startedAt
			}
			room.Borrowed += a.gpus
			room.Held = append(room.Held, admission.Held{GPUs: a.gpus, Priority: a.prio, Since: r.time(since)})
		}
	}
	r.c.touched = r.c.touched[:0]
	return r.rooms
}

// placedOn is a node given an allocation at an instant.
type placedOn struct {
	node int
	at   float64
}

// pin records the nodes the broker chose for j (nil: Nomad chooses).
func (r *run) pin(j *simJob, placed admission.Placed) {
	j.pin = j.pin[:0]
	for _, id := range placed["g"] {
		j.pin = append(j.pin, atoi(id))
	}
	if len(j.pin) == 0 {
		j.pin = nil
	}
}

// waitOn counts the GPUs j's unplaced pinned allocations wait for on their
// nodes (sign -1: no longer).
func (r *run) waitOn(j *simJob, sign int) {
	if r.waitingOn == nil {
		r.roomsNow()
	}
	for _, id := range j.pin[len(j.placed):] {
		r.waitingOn[id] += sign * j.GPUs
		r.c.touch(id)
	}
}

// placePinned places the allocations of pinned jobs that their nodes take
// now, by preemption where the job may preempt, in Nomad's order (priority,
// then registration); the others stay blocked. false if it placed none.
func (r *run) placePinned() bool {
	slices.SortFunc(r.pinned, func(a, b *simJob) int {
		if a.prio != b.prio {
			return b.prio - a.prio
		}
		return int(a.seq) - int(b.seq)
	})
	any := false
	kept := r.pinned[:0]
	for _, j := range r.pinned {
		if j.state != stPending || j.pin == nil {
			continue
		}
		for len(j.placed) < j.allocs() && r.placeOnPin(j) {
			any = true
		}
		if j.state == stPending {
			kept = append(kept, j)
		}
	}
	clear(r.pinned[len(kept):])
	r.pinned = kept
	return any
}

// placeOnPin places j's next allocation on its node if the node takes it.
func (r *run) placeOnPin(j *simJob) bool {
	id := j.pin[len(j.placed)]
	n := &r.c.nodes[id]
	if n.free < j.GPUs {
		if !r.preempts || !r.mayPreempt(j) {
			return false
		}
		victims := r.c.deviceVictims(n, j.GPUs, j.prio-policy.MinPriorityGap)
		if victims == nil {
			return false
		}
		seen := map[*simJob]bool{}
		for _, a := range slices.Clone(victims) {
			if !seen[a.job] {
				seen[a.job] = true
				r.preempt(a.job)
			}
		}
	}
	r.waitingOn[id] -= j.GPUs
	r.start(j, id)
	return true
}

// repin chooses nodes again for pinned jobs that their nodes have blocked
// since the last reclaim pass, as the leader does before they run.
func (r *run) repin() {
	now := r.time(r.now)
	for _, j := range r.pinned {
		if j.state != stPending || j.pin == nil {
			continue
		}
		left := j.adm
		left.Groups = []admission.Group{left.Groups[0]}
		left.Groups[0].Count = j.allocs() - len(j.placed)
		placed, ok := admission.Place(left, r.roomsNow(), !j.borrowed, j.prio, now)
		if !ok {
			continue
		}
		r.waitOn(j, -1)
		j.pin = j.pin[:len(j.placed)]
		for _, id := range placed["g"] {
			j.pin = append(j.pin, atoi(id))
		}
		r.waitOn(j, 1)
		r.res.Repins++
	}
	r.place()
}

// reserve holds nodes for the tenants' oldest waiting jobs as the leader
// does before a pass (admission.Reserve).
func (r *run) reserve(used map[string]float64) {
	if r.p.Placement.ReserveAfter <= 0 {
		return
	}
	var oldest []admission.Waiting
	for _, t := range r.tenants {
		var first *queue.Entry
		for k, l := range t.lists {
			if len(l) > 0 && (first == nil || olderFirst(l[0], *first) < 0) {
				first = &t.lists[k][0]
			}
		}
		if first != nil {
			j := &r.jobs[atoi(first.ID)]
			oldest = append(oldest, admission.Waiting{Namespace: j.adm.Namespace, ID: j.ID, Tenant: t.name, Groups: j.adm.Groups, Since: first.SubmittedAt})
		}
	}
	rooms := r.roomsNow()
	held := map[string]string{}
	for i, key := range r.reservedFor {
		if key != "" {
			held[rooms[i].ID] = key
		}
	}
	now := admission.Reserve(r.p, oldest, used, rooms, held, r.time(r.now))
	// Few nodes are held: those held before, then those held now.
	for i, key := range r.reservedFor {
		if key != "" && now[rooms[i].ID] != key {
			r.reservedFor[i] = now[rooms[i].ID]
			r.c.touch(i)
		}
	}
	for id, key := range now {
		if i := atoi(id); r.reservedFor[i] != key {
			r.reservedFor[i] = key
			r.c.touch(i)
		}
	}
	r.res.Reserved += len(now)
}
