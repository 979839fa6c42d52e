// Package approvalkv keeps approvals in Consul KV under
// <prefix>approvals/<id>, with a snapshot every broker follows (a blocking
// query), so that admission reads them without a round trip; and the
// leader's Expirer, which marks granted approvals expired and requeues, by a
// reclaim decision, a job that only its expired approval kept within its
// tenant's limit.
package approvalkv

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Store keeps approvals.
type Store struct {
	kv     *consul.KV
	prefix string

	mu       sync.RWMutex
	snapshot map[string]approval.Approval
}

// NewStore returns a store under prefix (e.g. "nomad-gpu/").
func NewStore(kv *consul.KV, prefix string) *Store {
	return &Store{kv: kv, prefix: prefix + "approvals/", snapshot: map[string]approval.Approval{}}
}

// Create writes a new approval; false if its id exists.
func (s *Store) Create(ctx context.Context, a approval.Approval) (bool, error) {
	return s.cas(ctx, a, 0)
}

// Update writes a if it has not changed since it was read.
func (s *Store) Update(ctx context.Context, a approval.Approval) (bool, error) {
	return s.cas(ctx, a, a.ModifyIndex)
}

func (s *Store) cas(ctx context.Context, a approval.Approval, index uint64) (bool, error) {
	b, err := json.Marshal(a)
	if err != nil {
		return false, fmt.Errorf("encode approval %s: %w", a.ID, err)
	}
	ok, _, err := s.kv.CAS(&consul.KVPair{Key: s.prefix + a.ID, Value: b, ModifyIndex: index}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("write approval %s: %w", a.ID, err)
	}
	if ok {
		// This broker sees its own write at once; the others within the
		// moment their blocking query returns.
		s.mu.Lock()
		s.snapshot[a.ID] = a
		s.mu.Unlock()
	}
	return ok, nil
}

// Get reads one approval.
func (s *Store) Get(ctx context.Context, id string) (approval.Approval, error) {
	if !queue.ValidID(id) {
		return approval.Approval{}, approval.ErrNotFound
	}
	p, _, err := s.kv.Get(s.prefix+id, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return approval.Approval{}, fmt.Errorf("read approval %s: %w", id, err)
	}
	if p == nil {
		return approval.Approval{}, fmt.Errorf("approval %s: %w", id, approval.ErrNotFound)
	}
	return decode(p)
}

// List reads every approval, oldest request first.
func (s *Store) List(ctx context.Context) ([]approval.Approval, error) {
	out, _, err := s.list(ctx, 0)
	return out, err
}

func (s *Store) list(ctx context.Context, waitIndex uint64) ([]approval.Approval, uint64, error) {
	pairs, meta, err := s.kv.List(s.prefix, (&consul.QueryOptions{WaitIndex: waitIndex, WaitTime: 5 * time.Minute}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("list approvals: %w", err)
	}
	out := make([]approval.Approval, 0, len(pairs))
	for _, p := range pairs {
		a, err := decode(p)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out, meta.LastIndex, nil
}

func decode(p *consul.KVPair) (approval.Approval, error) {
	var a approval.Approval
	if err := json.Unmarshal(p.Value, &a); err != nil {
		return a, fmt.Errorf("decode approval %s: %w", p.Key, err)
	}
	a.ModifyIndex = p.ModifyIndex
	return a, nil
}

// Follow keeps the snapshot current (a blocking query on the prefix) until
// ctx ends; on an error it retries after a second.
func (s *Store) Follow(ctx context.Context) {
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
		if next < index {
			next = 0 // Consul's index went back (a restore): start over
		}
		index = next
	}
}

// Current is the snapshot of every approval.
func (s *Store) Current() []approval.Approval {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]approval.Approval, 0, len(s.snapshot))
	for _, a := range s.snapshot {
		out = append(out, a)
	}
	return out
}
