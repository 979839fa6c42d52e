package cluster

import (
	"maps"
	"testing"
	"time"
)

// A placement not yet seen takes its GPUs on its nodes, less what the job's
// allocations seen there hold already, until it expires. The job's own
// decision does not count it. A dispatched child takes its parent's
// placement of the same reservation only.
func TestPlacementsTakeTheirNodesUntilSeenOrExpired(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	train, serve, child := jobKey{"vision", "train"}, jobKey{"vision", "serve"}, jobKey{"vision", "train/dispatch-1"}
	ps := placements{
		train: {seq: 1, nodes: map[string]int{"n1": 4, "n2": 2}, until: t0.Add(time.Minute)},
		serve: {seq: 2, nodes: map[string]int{"n1": 1}, until: t0.Add(10 * time.Second)},
	}
	on := map[jobKey]map[string]int{train: {"n1": 3}}
	pending, until := ps.pending(t0, jobKey{}, on, t0.Add(time.Hour))
	if want := map[string]int{"n1": 2, "n2": 2}; !maps.Equal(pending, want) || until != t0.Add(10*time.Second) {
		t.Errorf("pending %v until %s, want %v until the first expiry", pending, until, want)
	}
	if pending, _ := ps.pending(t0, train, on, t0.Add(time.Hour)); !maps.Equal(pending, map[string]int{"n1": 1}) {
		t.Errorf("train's own decision counts %v, want serve's alone", pending)
	}
	if pending, _ := ps.pending(t0.Add(30*time.Second), jobKey{}, on, t0.Add(time.Hour)); ps.has(serve) || !maps.Equal(pending, map[string]int{"n1": 1, "n2": 2}) {
		t.Errorf("after serve's expiry: %v, serve kept %t", pending, ps.has(serve))
	}
	if ps.move(train, child, 9) || !ps.move(train, child, 1) || ps.has(train) || !ps.has(child) {
		t.Errorf("a move of another reservation's placement, or of its own: %v", ps)
	}
	if ps.drop(child, 9) || !ps.drop(child, 0) || len(ps) != 0 {
		t.Errorf("a drop of another reservation's placement, or of any: %v", ps)
	}
}
