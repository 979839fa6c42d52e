package leader

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// scheduler is Nomad's preemption setting, which an operator may change.
type scheduler struct {
	mu             sync.Mutex
	batch, service bool
	sets           int
}

func (s *scheduler) SetPreemption(_ context.Context, batch, service bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.batch == batch && s.service == service {
		return false, nil
	}
	s.batch, s.service = batch, service
	s.sets++
	return true, nil
}

func (s *scheduler) get() (bool, bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batch, s.service, s.sets
}

func TestKeepPreemptionReassertsOnEveryTick(t *testing.T) {
	nomad := &scheduler{}
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		KeepPreemption(ctx, tick, func() (bool, bool) { return true, true }, nomad, hclog.NewNullLogger())
		close(done)
	}()
	tick <- time.Now() // the first assertion has run once the loop takes a tick
	if b, s, n := nomad.get(); !b || !s || n != 1 {
		t.Fatalf("not set at start: %v %v %d", b, s, n)
	}
	nomad.mu.Lock()
	nomad.batch = false // an operator switched it off
	nomad.mu.Unlock()
	tick <- time.Now()
	tick <- time.Now()
	if b, _, n := nomad.get(); !b || n != 2 {
		t.Fatalf("not set again after a change: %v %d", b, n)
	}
	cancel()
	<-done
}
