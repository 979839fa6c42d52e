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
	reloaded := make(chan struct{})
	service := true
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		KeepPreemption(ctx, tick, reloaded, func() (bool, bool) {
			mu.Lock()
			defer mu.Unlock()
			return true, service
		}, nomad, hclog.NewNullLogger())
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
	mu.Lock()
	service = false // a new policy
	mu.Unlock()
	reloaded <- struct{}{}
	tick <- time.Now()
	if _, s, n := nomad.get(); s || n != 3 {
		t.Fatalf("a reloaded policy not applied: service %v, %d sets", s, n)
	}
	cancel()
	<-done
}
