package cluster

import (
	"cmp"
	"maps"
	"path"
	"slices"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// placing are the nodes admission placed a job's allocations on (placement
// mode broker), counted there until the job's allocations are seen on them:
// a decision right after sees the room taken before Nomad places anything.
type placing struct {
	seq   uint64         // the reservation it came with
	nodes map[string]int // GPUs by node
	until time.Time
}

// placements are the jobs' placements not yet seen, by job. The view calls
// them with its lock held, and builds its rooms again when they change.
type placements map[jobKey]placing

// has reports whether key has a placement not yet seen.
func (ps placements) has(key jobKey) bool {
	_, ok := ps[key]
	return ok
}

// drop forgets key's placement, and reports whether it had one (of the
// reservation seq, or any with seq 0).
func (ps placements) drop(key jobKey, seq uint64) bool {
	if pl, ok := ps[key]; ok && (seq == 0 || pl.seq == seq) {
		delete(ps, key)
		return true
	}
	return false
}

// move gives from's placement of the reservation seq to to (a dispatched
// child's), and reports whether it did.
func (ps placements) move(from, to jobKey, seq uint64) bool {
	pl, ok := ps[from]
	if !ok || pl.seq != seq {
		return false
	}
	delete(ps, from)
	ps[to] = pl
	return true
}

// pending is the GPUs the placements not yet seen take, by node, but for
// except's own. What the job's allocations seen hold there (on: GPUs by job
// and node) is taken off. until is when the first of them expires, no
// later than until as given. Those expired by now are dropped.
func (ps placements) pending(now time.Time, except jobKey, on map[jobKey]map[string]int, until time.Time) (map[string]int, time.Time) {
	out := map[string]int{}
	for key, pl := range ps {
		if !now.Before(pl.until) {
			delete(ps, key)
			continue
		}
		until = minTime(until, pl.until)
		if key == except {
			continue
		}
		for id, n := range pl.nodes {
			out[id] += max(0, n-on[key][id])
		}
	}
	return out, until
}

// HoldNodes holds nodes for waiting jobs (admission.Reserve: node id → job
// key): no other borrowed work is admitted onto them.
func (v *View) HoldNodes(held map[string]string) {
	v.mu.Lock()
	v.heldFor, v.rooms = held, nil
	v.mu.Unlock()
}

// HeldNodes are the nodes held for waiting jobs now.
func (v *View) HeldNodes() map[string]string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return maps.Clone(v.heldFor)
}

// Rooms are the nodes' device groups as admission places work on them.
func (v *View) Rooms() []admission.NodeRoom {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.nodeRooms(admission.Where{}, jobKey{})
}

// nodeRooms are the device groups of the schedulable nodes where may use:
// healthy GPUs, those free (held by no live allocation of another job than
// except, nor by another job's placement not yet seen), and the borrowed
// allocations on each. Expired placements are dropped. The slice may be
// shared: read it, do not change it.
func (v *View) nodeRooms(where admission.Where, except jobKey) []admission.NodeRoom {
	now := v.clock.Now()
	own := len(v.holds.of(except)) > 0 || v.placing.has(except)
	if where.Datacenters == nil && where.Pool == "" && where.Nodes == nil && !own {
		// Most decisions: a new job that may run anywhere. The rooms are
		// kept until the view changes (a registration must not walk every
		// allocation and node), or a placement counted in them expires.
		if v.rooms == nil || !now.Before(v.roomsUntil) {
			v.rooms, v.roomsUntil = v.buildRooms(where, jobKey{}, now)
		}
		return v.rooms
	}
	rooms, _ := v.buildRooms(where, except, now)
	return rooms
}

// buildRooms is nodeRooms built afresh, with when the first placement it
// counts expires.
func (v *View) buildRooms(where admission.Where, except jobKey, now time.Time) ([]admission.NodeRoom, time.Time) {
	until := now.Add(ReservationHold)
	held := map[nodeGroup]int{}
	var borrowed map[nodeGroup][]admission.Held
	jobOn := map[jobKey]map[string]int{} // GPUs of each placing job's allocations, by node
	for _, a := range v.allocs {
		key := jobKey{a.Namespace, a.JobID}
		if a.Preempted || key == except {
			continue
		}
		n := v.nodes[a.NodeID]
		for _, id := range a.GPUs {
			held[nodeGroup{a.NodeID, n.devices[id].Model}]++
		}
		if v.placing.has(key) {
			if jobOn[key] == nil {
				jobOn[key] = map[string]int{}
			}
			jobOn[key][a.NodeID] += len(a.GPUs)
		}
		if j := v.jobs.live[key]; j.borrowed && len(a.GPUs) > 0 {
			if borrowed == nil {
				borrowed = map[nodeGroup][]admission.Held{}
			}
			since := a.StartedAt
			if since.IsZero() {
				since = now
			}
			k := nodeGroup{a.NodeID, n.devices[a.GPUs[0]].Model}
			borrowed[k] = append(borrowed[k], admission.Held{GPUs: len(a.GPUs), Priority: j.priority, Since: since})
		}
	}
	pending, until := v.placing.pending(now, except, jobOn, until) // GPUs placements not yet seen take, by node
	if v.order == nil {
		v.order = v.nodes.order()
	}
	out := make([]admission.NodeRoom, 0, len(v.order)) // known, if empty: nothing fits
	for _, ng := range v.order {
		n := v.nodes[ng.node]
		if !eligible(ng.node, n, where) {
			continue
		}
		k := ng
		r := admission.NodeRoom{ID: ng.node, Region: v.region, Group: ng.group, GPUs: n.gpus[ng.group], Free: max(0, n.gpus[ng.group]-held[k]), Held: borrowed[k],
			ReservedFor: v.heldFor[ng.node]}
		for _, h := range r.Held {
			r.Borrowed += h.GPUs
		}
		if take := min(r.Free, pending[ng.node]); take > 0 { // a placement takes from the node's first groups
			r.Free -= take
			pending[ng.node] -= take
		}
		out = append(out, r)
	}
	return out, until
}

// eligible reports whether a job bound by where may run on node id.
func eligible(id string, n node, where admission.Where) bool {
	if where.Pool != "" && n.pool != where.Pool {
		return false
	}
	if where.Nodes != nil && !slices.Contains(where.Nodes, id) {
		return false
	}
	if len(where.Datacenters) == 0 {
		return true
	}
	for _, dc := range where.Datacenters {
		if ok, _ := path.Match(dc, n.datacenter); ok {
			return true
		}
	}
	return false
}

// place records where admission placed the allocations of j (key).
func (v *View) place(key jobKey, seq uint64, j admission.Job, placed admission.Placed) {
	if len(placed) == 0 {
		v.unplace(key)
		return
	}
	nodes := map[string]int{}
	for _, g := range j.Groups {
		for _, id := range placed[g.Name] {
			nodes[id] += g.GPUsPerAlloc
		}
	}
	v.placing[key] = placing{seq: seq, nodes: nodes, until: v.clock.Now().Add(ReservationHold)}
	v.rooms = nil
}

// unplace forgets where job key was placed.
func (v *View) unplace(key jobKey) {
	if v.placing.drop(key, 0) {
		v.rooms = nil
	}
}

// Unplaced is a batch job the broker pinned whose pinned task group has no
// live allocation: Nomad has not placed it, or the allocations it had
// ended (a node drained) and none replaced them.
type Unplaced struct {
	Namespace, ID string
	// NodeGone: a node it is pinned to is gone or takes no new work
	// (down, draining, ineligible).
	NodeGone bool
}

// Unplaced are the jobs pinned by the broker that wait for a placement.
func (v *View) Unplaced() []Unplaced {
	v.mu.RLock()
	defer v.mu.RUnlock()
	live := map[jobKey]map[string]bool{} // groups with a live allocation
	for _, a := range v.allocs {
		if a.Preempted {
			continue
		}
		key := jobKey{a.Namespace, a.JobID}
		if live[key] == nil {
			live[key] = map[string]bool{}
		}
		live[key][a.Group] = true
	}
	var out []Unplaced
	for key, j := range v.jobs.live {
		waiting, gone := false, false
		for group, ids := range j.pinned {
			if live[key][group] {
				continue
			}
			waiting = true
			for _, id := range ids {
				if n, ok := v.nodes[id]; !ok || !n.schedulable {
					gone = true
				}
			}
		}
		if waiting {
			out = append(out, Unplaced{Namespace: key.namespace, ID: key.id, NodeGone: gone})
		}
	}
	slices.SortFunc(out, func(a, b Unplaced) int { return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.ID, b.ID)) })
	return out
}

// nodeGroup is one device group of a node.
type nodeGroup struct{ node, group string }

// order is the device groups of the schedulable nodes with healthy GPUs,
// by node id then group: the order rooms are read in, kept until a node
// changes.
func (ns nodeSet) order() []nodeGroup {
	out := []nodeGroup{}
	for id, n := range ns {
		if !n.schedulable {
			continue
		}
		for g := range n.gpus {
			out = append(out, nodeGroup{id, g})
		}
	}
	slices.SortFunc(out, func(a, b nodeGroup) int { return cmp.Or(cmp.Compare(a.node, b.node), cmp.Compare(a.group, b.group)) })
	return out
}
