package consulkv

import (
	"context"
	"fmt"
	"sort"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Approvals keeps approvals under <prefix>approvals/<id>, with a snapshot
// every broker follows (a blocking query), so that admission reads them
// without a round trip.
type Approvals struct {
	r records[approval.Approval]
	m *mirror[approval.Approval]
}

// Version counts the changes of the snapshot Current returns.
func (s *Approvals) Version() uint64 { return s.m.version.Load() }

// NewApprovals returns the approvals under prefix (e.g. "nomad-gpu/").
func NewApprovals(kv *consul.KV, prefix string, aside *Aside) *Approvals {
	r := records[approval.Approval]{kv: kv, dir: prefix + "approvals/", what: "approval", kind: "approvals", aside: aside,
		version: func(a *approval.Approval, i uint64) { a.ModifyIndex = i }}
	return &Approvals{r: r, m: &mirror[approval.Approval]{r: r}}
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
		s.m.readBack(ctx, a.ID)
	}
	return ok, err
}

// Delete removes an approval if it has not changed since it was read;
// false when it changed first.
func (s *Approvals) Delete(ctx context.Context, a approval.Approval) (bool, error) {
	ok, err := s.r.remove(ctx, a.ID, a.ModifyIndex)
	if ok {
		s.m.removed(a.ID)
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
	out, _, err := s.r.list(ctx, &consul.QueryOptions{}, nil)
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out, err
}

// Follow keeps the snapshot current (a blocking query on the prefix) until
// ctx ends; on an error it retries after a second.
func (s *Approvals) Follow(ctx context.Context) { s.m.follow(ctx) }

// Current is the snapshot of every approval.
func (s *Approvals) Current() []approval.Approval { return s.m.all() }
