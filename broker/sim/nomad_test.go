package sim

import (
	"math/rand/v2"
	"testing"
)

// Nomad scores only the first few feasible nodes of a shuffle
// (scheduler/stack.go:82-94, select.go:38-60). A batch job's allocation
// lands on the best-fitting node only when the shuffle puts it among the
// first two, about 2 in 10 here (1 - C(9,2)/C(10,2)); the ideal model always
// takes it.
func TestNomadScoresTheFirstTwoFeasibleNodesOfAShuffle(t *testing.T) {
	c := newCluster([]NodeGroup{{Model: "H100", GPUs: 8, Count: 10}})
	c.place(&alloc{job: &simJob{}, node: 3, gpus: 6, prio: 40, cpu: 6}) // node 3: 2 free, the best fit for 2
	rng := rand.New(rand.NewPCG(1, 2))
	const tries = 4000
	best := 0
	for range tries {
		if c.choose("H100", 2, 2, scoredNodes(false, 10), rng) == 3 {
			best++
		}
	}
	if share := float64(best) / tries; share < 0.17 || share > 0.23 {
		t.Errorf("best fit chosen %.3f of the time, want about 0.2", share)
	}
	if n := c.choose("H100", 2, 2, 10, rng); n != 3 {
		t.Errorf("scoring every feasible node chose %d, want the best fit 3", n)
	}
	// CPU and memory decide, not GPUs: a node with GPUs free but its CPU
	// asked for by a job of few GPUs scores higher than the best GPU fit.
	c.place(&alloc{job: &simJob{}, node: 5, gpus: 1, prio: 40, cpu: 7})
	if n := c.choose("H100", 2, 2, 10, rng); n != 5 {
		t.Errorf("scoring every feasible node chose %d, want 5, the fullest by CPU", n)
	}
	if n := c.fit("H100", 2); n != 3 {
		t.Errorf("ideal model chose %d, want 3", n)
	}
	if n := c.choose("H100", 9, 9, 2, rng); n != -1 {
		t.Errorf("an allocation larger than every node placed on %d", n)
	}
	for _, tc := range []struct {
		service     bool
		nodes, want int
	}{{false, 1250, 2}, {true, 1250, 11}, {true, 3, 2}, {true, 1, 2}} {
		if got := scoredNodes(tc.service, tc.nodes); got != tc.want {
			t.Errorf("scoredNodes(service %t, %d nodes) = %d, want %d", tc.service, tc.nodes, got, tc.want)
		}
	}
}

// PreemptForDevice (scheduler/preemption.go:475-606): allocations at least
// 10 below, lowest priority group first, in the node's order, until they and
// the free GPUs cover the ask; then the largest of those first, until they
// alone cover it.
func TestNomadPreemptsByPriorityGroupThenLargestFirst(t *testing.T) {
	type a struct {
		name       string
		gpus, prio int
	}
	for _, tc := range []struct {
		name       string
		allocs     []a
		ask, prio  int
		want       string
		idealEvict int // GPUs the ideal model evicts: the newest first
	}{
		{"the larger of the lowest group, not both", []a{{"a", 1, 20}, {"b", 4, 20}, {"c", 3, 30}}, 2, 45, "b", 4},
		{"a larger one of a higher group before a smaller lower one", []a{{"a", 1, 20}, {"c", 3, 30}, {"d", 4, 50}}, 3, 45, "c", 4},
		{"free GPUs count towards the first set only", []a{{"a", 1, 20}, {"b", 6, 20}}, 2, 45, "a", 6},
		{"nothing 10 below can make room", []a{{"a", 4, 40}, {"b", 4, 40}}, 1, 45, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster([]NodeGroup{{Model: "H100", GPUs: 8, Count: 1}})
			for i, x := range tc.allocs {
				c.place(&alloc{job: &simJob{Job: &Job{ID: x.name}, seq: uint64(i)}, node: 0, gpus: x.gpus, prio: x.prio})
			}
			got := ""
			victims, node := c.nomadVictims("H100", tc.ask, float64(tc.ask), tc.prio, 10, 2, rand.New(rand.NewPCG(1, 2)))
			for _, v := range victims {
				got += v.job.ID
			}
			if got != tc.want || (node < 0) != (tc.want == "") {
				t.Errorf("Nomad model evicts %q on node %d, want %q", got, node, tc.want)
			}
			ideal, _ := c.victims("H100", tc.ask, tc.prio, 10)
			evicted := 0
			for _, v := range ideal {
				evicted += v.gpus
			}
			if evicted != tc.idealEvict {
				t.Errorf("ideal model evicts %d GPUs, want %d", evicted, tc.idealEvict)
			}
		})
	}
}

// mostRoom is what the report's "no node could make room" reads: free and
// borrowed GPUs of one node, kept as allocations come, go and are promoted.
func TestTheMostRoomCountsFreeAndBorrowedGPUsOfOneNode(t *testing.T) {
	c := newCluster([]NodeGroup{{Model: "H100", GPUs: 8, Count: 2}})
	owned, lent := &simJob{}, &simJob{borrowed: true}
	guaranteed := func(node, gpus int) *alloc {
		a := &alloc{job: owned, node: node, gpus: gpus, prio: 60}
		c.place(a)
		return a
	}
	if got := c.mostRoom(); got != 8 {
		t.Fatalf("empty: most room %d, want 8", got)
	}
	g0, _ := guaranteed(0, 2), guaranteed(1, 3)
	if got := c.mostRoom(); got != 6 {
		t.Fatalf("2 and 3 guaranteed GPUs on the two nodes: most room %d, want 6", got)
	}
	b := &alloc{job: lent, node: 0, gpus: 6, prio: 20}
	c.place(b)
	if got := c.mostRoom(); got != 6 {
		t.Errorf("6 borrowed beside node 0's 2 guaranteed: most room %d, want 6 (evictable)", got)
	}
	b.borrowed = false // promoted, as run.promote does
	c.lend(b, -1)
	if got := c.mostRoom(); got != 5 {
		t.Errorf("node 0's 6 promoted: most room %d, want node 1's 5", got)
	}
	c.remove(b)
	c.remove(g0)
	if got := c.mostRoom(); got != 8 {
		t.Errorf("node 0 emptied: most room %d, want 8", got)
	}
}
