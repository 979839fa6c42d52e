package sim

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// The simulated Nomad's choices of node and of victims. ModelNomad follows
// Nomad v1.6.3's scheduler as its source reads; ModelIdeal is the idealised
// one the simulator began with, kept to compare.
const (
	// ModelNomad: of the nodes an allocation fits, Nomad scores only the
	// first few in a random order, and takes victims by priority group,
	// largest first.
	ModelNomad = "nomad"
	// ModelIdeal: best fit over every node, and the node where preemption
	// evicts the fewest GPUs.
	ModelIdeal = "ideal"
)

// scoredNodes is how many feasible nodes Nomad scores for one placement
// (scheduler/stack.go:82-94, GenericStack.SetNodes): 2 for a batch job
// ("the power of two choices"), ⌈log₂ nodes⌉ and at least 2 for a service.
// The same limit holds for the pass with preemption (generic_sched.go:915-919
// runs the same stack again with Preempt set).
func scoredNodes(service bool, nodes int) int {
	if !service || nodes < 2 {
		return 2
	}
	return max(2, int(math.Ceil(math.Log2(float64(nodes)))))
}

// choose is Nomad's node for an allocation of gpus of model. Nomad shuffles
// the nodes for each evaluation (scheduler/util.go:166-183). Its limit
// iterator passes on the first limit nodes where the allocation fits
// (scheduler/select.go:38-60, after the bin-packing iterator drops the
// exhausted ones), and the highest score of those wins. Devices do not
// score (scheduler/rank.go:546-549 scores CPU and memory): the node whose
// CPU and memory are fullest after the placement scores highest
// (structs.ScoreFitBinPack), an allocation asking cpu of them (in GPUs'
// worth: Options.ProportionalAsks makes it its GPUs). -1 if the allocation
// fits no node.
func (c *cluster) choose(model string, gpus int, cpu float64, limit int, rng *rand.Rand) int {
	lo, hi := c.modelsFor(model)
	total := 0
	for m := lo; m < hi; m++ {
		for f := gpus; f < len(c.byFree[m]); f++ {
			total += len(c.byFree[m][f])
		}
	}
	best, bestScore := -1, 0.0
	c.picked = c.picked[:0]
	for len(c.picked) < min(limit, total) {
		i := rng.IntN(total)
		if slices.Contains(c.picked, i) {
			continue
		}
		c.picked = append(c.picked, i)
		id, _ := c.nth(lo, hi, gpus, i)
		if score := c.fullness(id, cpu); best < 0 || score > bestScore {
			best, bestScore = id, score
		}
	}
	return best
}

// fullness is how full node id's CPU and memory are with cpu more.
func (c *cluster) fullness(id int, cpu float64) float64 {
	n := &c.nodes[id]
	return (n.cpu + cpu) / float64(n.gpus)
}

// nth is the i-th node (and its free GPUs) of those of models [lo, hi) with
// at least gpus free.
func (c *cluster) nth(lo, hi, gpus, i int) (int, int) {
	for m := lo; m < hi; m++ {
		for f := gpus; f < len(c.byFree[m]); f++ {
			if b := c.byFree[m][f]; i < len(b) {
				return b[i], f
			} else {
				i -= len(b)
			}
		}
	}
	return -1, 0
}

// fits reports whether an allocation of gpus of model fits any node now.
func (c *cluster) fits(model string, gpus int) bool {
	lo, hi := c.modelsFor(model)
	for m := lo; m < hi; m++ {
		for f := gpus; f < len(c.byFree[m]); f++ {
			if len(c.byFree[m][f]) > 0 {
				return true
			}
		}
	}
	return false
}

// nomadVictims is Nomad's pass with preemption for an allocation of gpus of
// model at priority prio. The nodes come in a random order; the first limit
// where evicting allocations at least gap below makes room are scored (the
// same limit iterator), each with the victims PreemptForDevice chooses
// (deviceVictims). Among them the fullest (CPU and memory) after the
// placement wins. The preemption score (scheduler/rank.go:827-877) is
// within 1e-4 of 1 for any net priority below a few hundred, so
// bin-packing decides. nil, -1 if no
// node can make room.
func (c *cluster) nomadVictims(model string, gpus int, cpu float64, prio, gap, limit int, rng *rand.Rand) ([]*alloc, int) {
	lo, hi := c.modelsFor(model)
	if len(c.perm) != len(c.nodes) {
		c.perm = make([]int, len(c.nodes))
		for i := range c.perm {
			c.perm[i] = i
		}
	}
	var best []*alloc
	bestNode, bestScore, found := -1, 0.0, 0
	for i := 0; i < len(c.perm) && found < limit; i++ {
		k := i + rng.IntN(len(c.perm)-i) // a shuffle, drawn as far as it is read
		c.perm[i], c.perm[k] = c.perm[k], c.perm[i]
		id := c.perm[i]
		n := &c.nodes[id]
		if n.model < lo || n.model >= hi || n.gpus < gpus || n.lowest > prio-gap {
			continue
		}
		set := c.deviceVictims(n, gpus, prio-gap)
		if set == nil {
			continue
		}
		found++
		score := c.fullness(id, cpu)
		for _, a := range set {
			score -= a.cpu / float64(n.gpus)
		}
		if bestNode < 0 || score > bestScore {
			best, bestNode, bestScore = append(best[:0], set...), id, score
		}
	}
	return best, bestNode
}

// deviceVictims is PreemptForDevice on node n for an ask of gpus
// (admission.Victims: the broker predicts Nomad's choice by the same rule).
func (c *cluster) deviceVictims(n *node, gpus, maxPrio int) []*alloc {
	set := admission.Victims(c.cand, n.allocs, n.free, gpus, maxPrio, allocGPUs, allocPrio)
	if set != nil {
		c.cand = set
	}
	return set
}

func allocGPUs(a *alloc) int { return a.gpus }
func allocPrio(a *alloc) int { return a.prio }
