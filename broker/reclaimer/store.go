package reclaimer

import (
	"context"
	"encoding/json"
	"fmt"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Store keeps decision records under <prefix>reclaim/ in Consul KV.
type Store struct {
	kv     *consul.KV
	prefix string
}

// NewStore returns a store under prefix (e.g. "nomad-gpu/").
func NewStore(kv *consul.KV, prefix string) *Store {
	return &Store{kv: kv, prefix: prefix + "reclaim/"}
}

// Create writes a new record; false if one with its id exists.
func (s *Store) Create(ctx context.Context, r reclaim.Record) (bool, error) {
	return s.cas(ctx, r, 0)
}

// Update writes r if it has not changed since it was read; false means
// someone else changed it first (a cancel, another leader).
func (s *Store) Update(ctx context.Context, r reclaim.Record) (bool, error) {
	return s.cas(ctx, r, r.ModifyIndex)
}

func (s *Store) cas(ctx context.Context, r reclaim.Record, index uint64) (bool, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return false, fmt.Errorf("encode reclaim decision %s: %w", r.ID, err)
	}
	ok, _, err := s.kv.CAS(&consul.KVPair{Key: s.prefix + r.ID, Value: b, ModifyIndex: index}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("write reclaim decision %s: %w", r.ID, err)
	}
	return ok, nil
}

// List returns every record.
func (s *Store) List(ctx context.Context) ([]reclaim.Record, error) {
	pairs, _, err := s.kv.List(s.prefix, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list reclaim decisions: %w", err)
	}
	out := make([]reclaim.Record, 0, len(pairs))
	for _, p := range pairs {
		r, err := decode(p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Get returns one record.
func (s *Store) Get(ctx context.Context, id string) (reclaim.Record, error) {
	if !queue.ValidID(id) {
		return reclaim.Record{}, reclaim.ErrNotFound
	}
	p, _, err := s.kv.Get(s.prefix+id, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return reclaim.Record{}, fmt.Errorf("read reclaim decision %s: %w", id, err)
	}
	if p == nil {
		return reclaim.Record{}, fmt.Errorf("reclaim decision %s: %w", id, reclaim.ErrNotFound)
	}
	return decode(p)
}

// Delete removes a record if it has not changed since it was read.
func (s *Store) Delete(ctx context.Context, r reclaim.Record) (bool, error) {
	ok, _, err := s.kv.DeleteCAS(&consul.KVPair{Key: s.prefix + r.ID, ModifyIndex: r.ModifyIndex}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("remove reclaim decision %s: %w", r.ID, err)
	}
	return ok, nil
}

func decode(p *consul.KVPair) (reclaim.Record, error) {
	var r reclaim.Record
	if err := json.Unmarshal(p.Value, &r); err != nil {
		return r, fmt.Errorf("decode reclaim decision %s: %w", p.Key, err)
	}
	r.ModifyIndex = p.ModifyIndex
	return r, nil
}
