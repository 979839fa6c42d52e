package consulkv

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Approvals keeps approvals under <prefix>approvals/<id>, with a snapshot
// every broker follows (a blocking query), so that admission reads them
// without a round trip.
type Approvals struct {
	r records[approval.Approval]

	mu       sync.RWMutex
	snapshot map[string]approval.Approval
	version  atomic.Uint64 // counts the snapshot's changes
}

// Version counts the changes of the snapshot Current returns.
func (s *Approvals) Version() uint64 { return s.version.Load() }

// NewApprovals returns the approvals under prefix (e.g. "nomad-gpu/").
func NewApprovals(kv *consul.KV, prefix string, aside *Aside) *Approvals {
	return &Approvals{r: records[approval.Approval]{kv: kv, dir: prefix + "approvals/", what: "approval", kind: "approvals", aside: aside,
		version: func(a *approval.Approval, i uint64) { a.ModifyIndex = i }}, snapshot: map[string]approval.Approval{}}
}

// Create writes a new approval; false if its id exists.
func (s *Approvals) Create(ctx context.Context, a approval.Approval) (bool, error) {
	return s.cas(ctx, a, 0)
}

// Update writes a if it has not changed since it was read.
func (s *Approvals) Update(ctx context.Context, a approval.Approval) (bool, error) {
	return s.cas(ctx, a, a.ModifyIndex)
}

func (s *Approvals) cas(ctx context.Context, a approval.Approval, index uint64) (bool, error) {
	ok, err := s.r.cas(ctx, a.ID, a, index)
	if ok {
		// This broker sees its own write at once; the others within the
		// moment their blocking query returns.
		s.mu.Lock()
		s.snapshot[a.ID] = a
		s.mu.Unlock()
		s.version.Add(1)
	}
	return ok, err
}

// Get reads one approval.
func (s *Approvals) Get(ctx context.Context, id string) (approval.Approval, error) {
	if !queue.ValidID(id) {
		return approval.Approval{}, approval.ErrNotFound
	}
	a, _, ok, err := s.r.get(ctx, id)
	if err == nil && !ok {
		err = fmt.Errorf("approval %s: %w", id, approval.ErrNotFound)
	}
	return a, err
}

// List reads every approval, oldest request first.
func (s *Approvals) List(ctx context.Context) ([]approval.Approval, error) {
	out, _, err := s.list(ctx, 0)
	return out, err
}

func (s *Approvals) list(ctx context.Context, waitIndex uint64) ([]approval.Approval, uint64, error) {
	out, index, err := s.r.list(ctx, &consul.QueryOptions{WaitIndex: waitIndex, WaitTime: 5 * time.Minute}, nil)
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out, index, err
}

// Follow keeps the snapshot current (a blocking query on the prefix) until
// ctx ends; on an error it retries after a second.
func (s *Approvals) Follow(ctx context.Context) {
	var index uint64
	for ctx.Err() == nil {
		all, next, err := s.list(ctx, index)
		if err != nil {
			index = 0
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		snap := make(map[string]approval.Approval, len(all))
		for _, a := range all {
			snap[a.ID] = a
		}
		s.mu.Lock()
		s.snapshot = snap
		s.mu.Unlock()
		if next != index {
			s.version.Add(1)
		}
		if next < index {
			next = 0 // Consul's index went back (a restore): start over
		}
		index = next
	}
}

// Current is the snapshot of every approval.
func (s *Approvals) Current() []approval.Approval {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]approval.Approval, 0, len(s.snapshot))
	for _, a := range s.snapshot {
		out = append(out, a)
	}
	return out
}
