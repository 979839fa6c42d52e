package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/testbuild"
)

// listings hands out one snapshot per List call (the last one repeats) and an
// event stream that never says anything, as when a job is purged.
type listings struct {
	mu    sync.Mutex
	snaps []Snapshot
	lists int
}

func (l *listings) List(context.Context) (Snapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.snaps[min(l.lists, len(l.snaps)-1)]
	l.lists++
	return s, nil
}

func (l *listings) Events(ctx context.Context, _ uint64) (<-chan *api.Events, error) {
	return make(chan *api.Events), nil
}

func TestResyncDropsAPurgedJob(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	node := testbuild.Node("n", testbuild.H100, 8, 0)
	src := &listings{snaps: []Snapshot{
		{Nodes: []*api.Node{node}, Jobs: []*api.Job{testbuild.Job("vision", "a").Group("g", 1, 4, "gpu").Build()}},
		{Nodes: []*api.Node{node}}, // purged: no event ever said so
	}}
	v := NewView(nil)
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Follow(ctx, src, hclog.NewNullLogger(), tick)
	waitUsage := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for v.Usage(p).Tenants["vision"].Used.Total() != want {
			if time.Now().After(deadline) {
				t.Fatalf("vision uses %d GPUs, want %d", v.Usage(p).Tenants["vision"].Used.Total(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUsage(4)
	tick <- time.Now()
	waitUsage(0)
}
