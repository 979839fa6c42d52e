package admission

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// NodeRoom is one device group of a schedulable node (a model, or one NVLink
// island of it: Nomad takes all of a request's GPUs from one group) as a new
// allocation finds it.
type NodeRoom struct {
	ID     string // the node's id
	Region string // its Nomad region, as Where.Region names it
	Group  string // the device group's name
	// GPUs are its healthy GPUs; Free those no allocation holds and no
	// admission not yet placed counts on; Borrowed those borrowed work holds.
	GPUs, Free, Borrowed int
	// Held are the borrowed allocations on it: what Nomad may preempt for
	// work within a guarantee.
	Held []Held
	// ReservedFor is the job ("namespace/id") the node is held for, waiting
	// for its borrowed work to drain (placement reserve_after): other
	// borrowed work is not admitted onto it. "": none.
	ReservedFor string
}

// Held is a borrowed allocation: its GPUs, its Nomad priority (its sub-band)
// and when it started, from which the GPU time a preemption loses follows.
type Held struct {
	GPUs, Priority int
	Since          time.Time
}

// JobKey is how NodeRoom.ReservedFor names a job.
func JobKey(namespace, id string) string { return namespace + "/" + id }

// Placed is where admission placed a job's allocations: per task group, the
// node of each allocation.
type Placed map[string][]string

// Victims is Nomad's choice of allocations to preempt on one device group of
// a node for an ask of gpus, free GPUs being free already
// (scheduler/preemption.go, PreemptForDevice). Of cands, it takes those at
// maxPrio or below, grouped by priority, lowest first, in their order within
// a group, until they and the free GPUs cover the ask. Then, of those, it
// keeps the largest first until they alone cover it (selectBestAllocs does
// not count the free GPUs again). buf is scratch space; nil when they cannot
// cover it.
func Victims[T any](buf, cands []T, free, gpus, maxPrio int, size, prio func(T) int) []T {
	buf = buf[:0]
	for _, a := range cands {
		if prio(a) <= maxPrio {
			buf = append(buf, a)
		}
	}
	slices.SortStableFunc(buf, func(a, b T) int { return prio(a) - prio(b) })
	preempted, k := 0, 0
	for k < len(buf) && preempted+free < gpus {
		preempted += size(buf[k])
		k++
	}
	if preempted+free < gpus {
		return nil
	}
	set := buf[:k]
	slices.SortStableFunc(set, func(a, b T) int { return size(b) - size(a) })
	taken, k := 0, 0
	for k < len(set) && taken < gpus {
		taken += size(set[k])
		k++
	}
	return set[:k]
}

func heldGPUs(h Held) int     { return h.GPUs }
func heldPriority(h Held) int { return h.Priority }

// alloc is one allocation to place.
type alloc struct {
	group, model string
	gpus         int
}

// Place chooses a node for each allocation of job, largest first: best
// fit on free GPUs (the fewest left free), never on nodes held for another
// job. With preempt (the job is admitted within its guarantee at priority
// prio), it may then take nodes held for another job when nothing else has
// free GPUs for it. Failing those, it goes where the borrowed allocations
// Nomad would evict for it (Victims) lose the least GPU time by now. ok is
// false when some allocation fits nowhere. nodes are not changed: what
// earlier allocations take is kept aside.
func Place(job Job, nodes []NodeRoom, preempt bool, prio int, now time.Time) (Placed, bool) {
	var allocs []alloc
	for _, g := range job.Groups {
		for range g.Count {
			allocs = append(allocs, alloc{g.Name, g.Model, g.GPUsPerAlloc})
		}
	}
	slices.SortStableFunc(allocs, func(a, b alloc) int { return b.gpus - a.gpus })
	rooms := scratch{nodes: nodes}
	mine := JobKey(job.Namespace, job.ID)
	placed := Placed{}
	var buf []Held
	for _, a := range allocs {
		i := rooms.bestFit(a, mine, false)
		if i < 0 && preempt {
			i = rooms.bestFit(a, mine, true)
		}
		if i < 0 && preempt {
			i, buf = rooms.leastLoss(a, prio-policy.MinPriorityGap, now, buf)
		}
		if i < 0 {
			return nil, false
		}
		placed[a.group] = append(placed[a.group], nodes[i].ID)
	}
	return placed, true
}

// scratch are nodes as the allocations placed so far leave them: the rooms
// they changed are copies kept aside (most jobs have one allocation, and a
// decision must not copy every node).
type scratch struct {
	nodes   []NodeRoom
	changed map[int]*NodeRoom
}

func (s *scratch) at(i int) *NodeRoom {
	if r, ok := s.changed[i]; ok {
		return r
	}
	return &s.nodes[i]
}

// take is room i to change.
func (s *scratch) take(i int) *NodeRoom {
	if r, ok := s.changed[i]; ok {
		return r
	}
	if s.changed == nil {
		s.changed = map[int]*NodeRoom{}
	}
	r := s.nodes[i]
	r.Held = slices.Clone(r.Held)
	s.changed[i] = &r
	return &r
}

// FreeFor is how many free GPUs job's allocations could take now, not held
// for another job. They are those of the rooms that offer its largest
// allocation's model (a device name, a MIG profile, an NVLink island of an
// island group) with room for one of them. Dispatch's best_fit ranks
// regions by it.
func FreeFor(job Job, nodes []NodeRoom) int {
	var largest Group
	for _, g := range job.Groups {
		if g.GPUsPerAlloc > largest.GPUsPerAlloc {
			largest = g
		}
	}
	mine, free := JobKey(job.Namespace, job.ID), 0
	for i := range nodes {
		r := &nodes[i]
		if r.Free >= largest.GPUsPerAlloc && matches(r, alloc{model: largest.Model}, mine, false) {
			free += r.Free
		}
	}
	return free
}

// matches reports whether room can take an allocation of a.
func matches(room *NodeRoom, a alloc, mine string, reserved bool) bool {
	return offers(room.Group, a.model) && (room.ReservedFor == "" || room.ReservedFor == mine || reserved)
}

// offers reports whether a device group can give GPUs asked of model ("":
// any). A named model is a device name, which Nomad matches whole; the
// broker asks a model offered per NVLink island of any of its island groups
// (nomadjob.Request.MatchIslands).
func offers(group, model string) bool {
	return model == "" || group == model || policy.IslandModel(group) == model
}

// bestFit takes a's GPUs from the matching room with the fewest free GPUs
// that still holds them (reserved: rooms held for another job too); -1 if
// none does.
func (s *scratch) bestFit(a alloc, mine string, reserved bool) int {
	best, bestFree := -1, 0
	for i := range s.nodes {
		r := s.at(i)
		if r.Free < a.gpus || (best >= 0 && r.Free >= bestFree) || !matches(r, a, mine, reserved) {
			continue
		}
		best, bestFree = i, r.Free
		if bestFree == a.gpus {
			break // nothing fits better
		}
	}
	if best >= 0 {
		s.take(best).Free -= a.gpus
	}
	return best
}

// leastLoss takes a's GPUs from the matching room where Nomad's victims
// (those at maxPrio or below) lose the least GPU time at now, then evict
// the fewest GPUs; -1 if Nomad can make room nowhere.
func (s *scratch) leastLoss(a alloc, maxPrio int, now time.Time, buf []Held) (int, []Held) {
	best, bestLoss, bestGPUs := -1, 0.0, 0
	for i := range s.nodes {
		r := s.at(i)
		if !matches(r, a, "", true) || r.Free+r.Borrowed < a.gpus {
			continue
		}
		buf = Victims(buf, r.Held, r.Free, a.gpus, maxPrio, heldGPUs, heldPriority)
		if buf == nil {
			continue
		}
		loss, gpus := 0.0, 0
		for _, h := range buf {
			loss += float64(h.GPUs) * max(0, now.Sub(h.Since).Seconds())
			gpus += h.GPUs
		}
		if best < 0 || cmp.Or(cmp.Compare(loss, bestLoss), cmp.Compare(gpus, bestGPUs)) < 0 {
			best, bestLoss, bestGPUs = i, loss, gpus
		}
	}
	if best < 0 {
		return -1, buf
	}
	r := s.take(best)
	victims := Victims(buf, r.Held, r.Free, a.gpus, maxPrio, heldGPUs, heldPriority)
	freed := 0
	for _, v := range victims {
		freed += v.GPUs
		i := slices.Index(r.Held, v)
		r.Held = slices.Delete(r.Held, i, i+1)
	}
	r.Free += freed - a.gpus
	r.Borrowed -= freed
	return best, victims
}

// roomText is what a queued borrowed job is told of the nodes: the most
// free GPUs on one node, per device group it could use.
func roomText(job Job, nodes []NodeRoom) string {
	type most struct {
		group string
		free  int
	}
	var out []most
	for i := range nodes {
		r := &nodes[i]
		for _, g := range job.Groups {
			if !offers(r.Group, g.Model) {
				continue
			}
			k := slices.IndexFunc(out, func(m most) bool { return m.group == r.Group })
			if k < 0 {
				out = append(out, most{r.Group, r.Free})
			} else {
				out[k].free = max(out[k].free, r.Free)
			}
			break
		}
	}
	if len(out) == 0 {
		return "no node has GPUs it can use"
	}
	slices.SortFunc(out, func(a, b most) int { return cmp.Compare(a.group, b.group) })
	text := "the most free GPUs on one node: "
	for k, m := range out {
		if k > 0 {
			text += ", "
		}
		if m.group == "" {
			text += strconv.Itoa(m.free)
		} else {
			text += fmt.Sprintf("%d %s", m.free, m.group)
		}
	}
	return text
}

// Waiting is a tenant's oldest queued job, as Reserve reads it.
type Waiting struct {
	Namespace, ID, Tenant string
	Region                string // Where.Region: only its region's nodes are held for it
	Groups                []Group
	Since                 time.Time // when it was submitted
}

// Reserve holds nodes for large jobs that would otherwise wait for ever:
// borrowed work is admitted only where it fits now, so a node seldom
// drains enough for a job of a whole node. Of each tenant below its
// guarantee, the oldest waiting job (oldest), once it has waited
// placement.reserve_after, gets a node held per allocation: no other
// borrowed work is admitted there while the node's work ends. The nodes held
// for the same job before (held: node id → JobKey) stay held; others are
// those with the most free GPUs. The result is the nodes held now.
func Reserve(p *policy.Policy, oldest []Waiting, used map[string]float64, nodes []NodeRoom, held map[string]string, now time.Time) map[string]string {
	after := p.Placement.ReserveAfter
	out := map[string]string{}
	if after <= 0 {
		return out
	}
	taken := map[int]bool{}
	// heldFor is held by node index, read once a call that holds anything
	// (not once a node per job).
	var heldFor []string
	keeps := func(i int, key string) bool { return len(held) > 0 && heldFor[i] == key }
	for _, w := range oldest {
		t := p.Tenants[w.Tenant]
		if t == nil || now.Sub(w.Since) < after || !exceeds(t.Guaranteed.Total(), used[w.Tenant]) {
			continue
		}
		if heldFor == nil && len(held) > 0 {
			heldFor = make([]string, len(nodes))
			for i, r := range nodes {
				heldFor[i] = held[r.ID]
			}
		}
		key := JobKey(w.Namespace, w.ID)
		var allocs []alloc
		for _, g := range w.Groups {
			for range g.Count {
				allocs = append(allocs, alloc{g.Name, g.Model, g.GPUsPerAlloc})
			}
		}
		slices.SortStableFunc(allocs, func(a, b alloc) int { return b.gpus - a.gpus })
		var chosen []int
		for _, a := range allocs {
			best := -1
			for i, r := range nodes {
				if taken[i] || r.Region != w.Region || r.GPUs < a.gpus || !offers(r.Group, a.model) {
					continue
				}
				kept, bestKept := keeps(i, key), best >= 0 && keeps(best, key)
				if best < 0 || kept && !bestKept || kept == bestKept && r.Free > nodes[best].Free {
					best = i
				}
			}
			if best < 0 {
				break
			}
			taken[best] = true
			chosen = append(chosen, best)
		}
		for _, i := range chosen {
			if len(chosen) < len(allocs) {
				taken[i] = false // the job cannot be held for: no node is
				continue
			}
			out[nodes[i].ID] = key
		}
	}
	return out
}
