package cluster

import (
	"maps"
	"slices"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// The nodes add up as Nomad places on them. A request fits a node in one
// device group, a model offered per NVLink island in one island. A node
// that takes no work counts for nothing. A shared group's replicas count
// as their GPUs, each replica at the fewest replicas any node offers.
func TestANodeSetAddsUpAsNomadPlaces(t *testing.T) {
	const h100, island0, island1 = testbuild.H100, testbuild.H100 + " (island 0)", testbuild.H100 + " (island 1)"
	ns := nodeSet{
		"b": {schedulable: true, gpus: map[string]int{h100: 8}},
		"a": {schedulable: true, gpus: map[string]int{island0: 4, island1: 2}, islands: map[string]bool{island0: true, island1: true}},
		"c": {schedulable: false, gpus: map[string]int{h100: 8}},
		"d": {schedulable: true, gpus: map[string]int{h100 + " (shared)": 8}, replicas: map[string]int{h100 + " (shared)": 4}}, // 2 GPUs
		"e": {schedulable: true, gpus: map[string]int{h100 + " (shared)": 4}, replicas: map[string]int{h100 + " (shared)": 4}}, // 1 GPU
	}
	for _, c := range []struct {
		model string
		gpus  int
		want  []string
	}{
		{h100, 4, []string{"a", "b"}}, // a's largest island holds 4
		{h100, 5, []string{"b"}},
		{"", 6, []string{"a", "b", "d"}}, // any model: a node's devices in all, replicas too
		{h100, 9, nil},
	} {
		if got := ns.fittingIDs(c.model, c.gpus); !slices.Equal(got, c.want) || ns.fitting(c.model, c.gpus) != len(c.want) {
			t.Errorf("%d of %q fit on %v, want %v", c.gpus, c.model, got, c.want)
		}
	}
	if !ns.islanded(h100) || ns.islanded("NVIDIA A100") {
		t.Errorf("islanded: H100 %t, A100 %t; want H100 alone", ns.islanded(h100), ns.islanded("NVIDIA A100"))
	}
	replicas := ns.sharedReplicas()
	if want := map[string]int{h100 + " (shared)": 4}; !maps.Equal(replicas, want) {
		t.Errorf("replicas %v, want %v", replicas, want)
	}
	mixed := nodeSet{"x": ns["d"], "y": {schedulable: true, gpus: map[string]int{h100 + " (shared)": 2}, replicas: map[string]int{h100 + " (shared)": 2}}}
	if got := mixed.sharedReplicas()[h100+" (shared)"]; got != 2 {
		t.Errorf("replicas where nodes differ: %d, want the fewest, 2", got)
	}
	capacity, maxAlloc := ns.totals(testbuild.Policy(t, visionPolicy), replicas)
	if capacity[policy.AllGPUs] != 17 || maxAlloc[policy.AllGPUs] != 8 {
		t.Errorf("capacity %v, most on one node %v; want 8+6+2+1 = 17 GPUs (c takes no work), 8 at most", capacity, maxAlloc)
	}
	if got := ns.order(); len(got) != 5 || got[0] != (nodeGroup{"a", island0}) || got[2] != (nodeGroup{"b", h100}) {
		t.Errorf("order %v, want the schedulable nodes' groups by node then group", got)
	}
}

// Nomad's version attribute is read by its major and minor numbers; one
// that cannot be read is no older Nomad.
func TestNomadBeforeReadsMajorAndMinor(t *testing.T) {
	for v, want := range map[string]bool{"1.6.3": true, "1.7.7": true, "0.12.0": true, "1.8.0": false, "1.8.0-beta.1": false,
		"1.10.2": false, "2.0.0": false, "": false, "dev": false} {
		if got := nomadBefore(v, 1, 8); got != want {
			t.Errorf("nomadBefore(%q, 1.8) = %t, want %t", v, got, want)
		}
	}
}

// The nodes' generation moves when what preparing a job reads of them
// changes (a node joins or leaves, its GPUs' health), not with allocations
// nor with a listing that finds them as they were.
func TestTheNodesGenerationMovesOnlyWithWhatPreparingAJobReads(t *testing.T) {
	v := NewView(nil)
	n1, n2 := testbuild.Node("n1", testbuild.H100, 8, 0), testbuild.Node("n2", testbuild.H100, 8, 0)
	v.Reset(Snapshot{Nodes: []*api.Node{n1, n2}})
	g := v.NodesGeneration()
	v.ObserveAlloc(testbuild.Alloc("a", "vision", "train", "n1", 5, "n1-0").Build())
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0), testbuild.Node("n2", testbuild.H100, 8, 0)}})
	if v.NodesGeneration() != g {
		t.Fatalf("an allocation, or a listing of the same nodes, moved the nodes' generation")
	}
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 7, 1)) // a GPU sick
	if g2 := v.NodesGeneration(); g2 == g {
		t.Errorf("a sick GPU did not move it")
	} else if v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 7, 1)}}); v.NodesGeneration() == g2 {
		t.Errorf("a node gone from the listing did not move it")
	}
}
