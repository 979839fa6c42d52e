package sim

import "math"

// The simulated Nomad: nodes with GPUs, allocations placed best fit (Nomad's
// bin-packing: the fullest node the allocation fits on), and priority
// preemption of allocations at least policy.MinPriorityGap below, lowest
// priority first.

// node is one client's GPUs.
type node struct {
	model  int // index in cluster.models
	gpus   int
	free   int
	allocs []*alloc
	lowest int // the lowest priority of its allocations (MaxInt: none)
	// borrowed are the GPUs borrowed allocations hold: with the free ones,
	// the most an owner's allocation could get here by preemption.
	borrowed int
	cpu      float64 // CPU and memory its allocations ask, in GPUs' worth
}

// alloc is one placed allocation.
type alloc struct {
	job  *simJob
	node int
	gpus int
	prio int
	cpu  float64 // CPU and memory it asks, in GPUs' worth
	// borrowed: its job was borrowed work when placed, or until promoted.
	borrowed bool
	placedAt float64 // when Nomad placed it: the broker sees it from the next instant
}

// cluster tracks which nodes have how many GPUs free, by model, so that best
// fit is a lookup, not a scan.
type cluster struct {
	models []string
	nodes  []node
	// byFree[model][f] are the nodes of model with f GPUs free; pos is each
	// node's index in its bucket.
	byFree [][][]int
	pos    []int
	// freeNodes[f] counts nodes with f GPUs free, all models (fragmentation).
	freeNodes []int
	// roomNodes[r] counts nodes whose free and borrowed GPUs add up to r,
	// all models: the largest allocation any node could make room for.
	roomNodes []int
	// Scratch space of the Nomad model's choices, kept between them.
	picked, perm []int
	cand         []*alloc
	// touched are the nodes whose allocations changed since the broker's
	// rooms were last read (run.rooms).
	touched   []int
	isTouched []bool
}

func newCluster(groups []NodeGroup) *cluster {
	c := &cluster{}
	most := 0
	for _, g := range groups {
		most = max(most, g.GPUs)
	}
	c.freeNodes, c.roomNodes = make([]int, most+1), make([]int, most+1)
	for _, g := range groups {
		m := c.modelIndex(g.Model)
		for len(c.byFree) <= m {
			c.byFree = append(c.byFree, make([][]int, most+1))
		}
		for i := 0; i < g.Count; i++ {
			id := len(c.nodes)
			c.nodes = append(c.nodes, node{model: m, gpus: g.GPUs, free: g.GPUs, lowest: math.MaxInt})
			c.pos = append(c.pos, len(c.byFree[m][g.GPUs]))
			c.byFree[m][g.GPUs] = append(c.byFree[m][g.GPUs], id)
			c.freeNodes[g.GPUs]++
			c.roomNodes[g.GPUs]++
			c.touch(id)
		}
	}
	return c
}

// touch notes that node id's allocations changed.
func (c *cluster) touch(id int) {
	for len(c.isTouched) <= id {
		c.isTouched = append(c.isTouched, false)
	}
	if !c.isTouched[id] {
		c.isTouched[id] = true
		c.touched = append(c.touched, id)
	}
}

func (c *cluster) modelIndex(model string) int {
	for i, m := range c.models {
		if m == model {
			return i
		}
	}
	c.models = append(c.models, model)
	return len(c.models) - 1
}

// models a request can use: the one it names, or all (-1: none here).
func (c *cluster) modelsFor(model string) (lo, hi int) {
	if model == "" {
		return 0, len(c.models)
	}
	for i, m := range c.models {
		if m == model {
			return i, i + 1
		}
	}
	return 0, 0
}

// fit is the best-fit node for gpus of model, or -1.
func (c *cluster) fit(model string, gpus int) int {
	lo, hi := c.modelsFor(model)
	best, bestFree := -1, 0
	for m := lo; m < hi; m++ {
		for f := gpus; f < len(c.byFree[m]); f++ {
			if b := c.byFree[m][f]; len(b) > 0 {
				if best < 0 || f < bestFree {
					best, bestFree = b[len(b)-1], f
				}
				break
			}
		}
	}
	return best
}

// setFree moves node id to the bucket of its new free count.
func (c *cluster) setFree(id, free int) {
	n := &c.nodes[id]
	b := c.byFree[n.model][n.free]
	last := b[len(b)-1]
	b[c.pos[id]], c.pos[last] = last, c.pos[id]
	c.byFree[n.model][n.free] = b[:len(b)-1]
	c.freeNodes[n.free]--
	c.roomNodes[n.free+n.borrowed]--
	c.roomNodes[free+n.borrowed]++
	n.free = free
	c.pos[id] = len(c.byFree[n.model][free])
	c.byFree[n.model][free] = append(c.byFree[n.model][free], id)
	c.freeNodes[free]++
}

func (c *cluster) place(a *alloc) {
	n := &c.nodes[a.node]
	n.allocs = append(n.allocs, a)
	n.cpu += a.cpu
	n.lowest = min(n.lowest, a.prio)
	c.setFree(a.node, n.free-a.gpus)
	if a.borrowed = a.job.borrowed; a.borrowed {
		c.lend(a, 1)
	}
	c.touch(a.node)
}

func (c *cluster) remove(a *alloc) {
	n := &c.nodes[a.node]
	for i, o := range n.allocs {
		if o == a {
			n.allocs[i] = n.allocs[len(n.allocs)-1]
			n.allocs = n.allocs[:len(n.allocs)-1]
			break
		}
	}
	n.cpu -= a.cpu
	if a.borrowed {
		c.lend(a, -1)
	}
	c.relow(a.node)
	c.setFree(a.node, n.free+a.gpus)
}

// lend counts a's GPUs as borrowed on its node (sign -1: no longer).
func (c *cluster) lend(a *alloc, sign int) {
	n := &c.nodes[a.node]
	c.roomNodes[n.free+n.borrowed]--
	n.borrowed += sign * a.gpus
	c.roomNodes[n.free+n.borrowed]++
}

// mostRoom is the largest allocation some node could take if every
// borrowed allocation on it were evicted.
func (c *cluster) mostRoom() int {
	for r := len(c.roomNodes) - 1; r > 0; r-- {
		if c.roomNodes[r] > 0 {
			return r
		}
	}
	return 0
}

// relow recomputes the lowest priority on node id.
func (c *cluster) relow(id int) {
	n := &c.nodes[id]
	n.lowest = math.MaxInt
	for _, o := range n.allocs {
		n.lowest = min(n.lowest, o.prio)
	}
	c.touch(id)
}

// victims finds the node where an allocation of gpus at priority prio fits
// by preempting the fewest GPUs of allocations at most prio-gap, lowest
// priority first; nil, -1 if none does.
func (c *cluster) victims(model string, gpus, prio, gap int) ([]*alloc, int) {
	lo, hi := c.modelsFor(model)
	var best []*alloc
	bestNode, bestGPUs := -1, 0
	var cand []*alloc
	for id := range c.nodes {
		n := &c.nodes[id]
		if n.model < lo || n.model >= hi || n.gpus < gpus || n.lowest > prio-gap {
			continue
		}
		cand = cand[:0]
		room := n.free
		for _, a := range n.allocs {
			if a.prio <= prio-gap {
				cand = append(cand, a)
				room += a.gpus
			}
		}
		if room < gpus {
			continue
		}
		sortAllocs(cand)
		room, taken := n.free, 0
		k := 0
		for ; room < gpus; k++ {
			room += cand[k].gpus
			taken += cand[k].gpus
		}
		if bestNode < 0 || taken < bestGPUs {
			best, bestNode, bestGPUs = append(best[:0], cand[:k]...), id, taken
		}
	}
	return best, bestNode
}

// sortAllocs orders by priority, lowest first, then the most recently
// placed first (Nomad's preemption prefers the lowest priority).
func sortAllocs(as []*alloc) {
	for i := 1; i < len(as); i++ {
		for k := i; k > 0 && (as[k].prio < as[k-1].prio || as[k].prio == as[k-1].prio && as[k].job.seq > as[k-1].job.seq); k-- {
			as[k], as[k-1] = as[k-1], as[k]
		}
	}
}

// stranded is the free GPUs on nodes with fewer than size free: room no
// waiting allocation of size can use.
func (c *cluster) stranded(size int) int {
	n := 0
	for f := 1; f < size && f < len(c.freeNodes); f++ {
		n += f * c.freeNodes[f]
	}
	return n
}
