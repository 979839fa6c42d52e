// Package reclaimtest holds an in-memory store of reclaim decision records
// for tests.
package reclaimtest

import (
	"context"
	"sort"
	"sync"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// NewMem returns an empty store.
func NewMem() *Mem { return &Mem{recs: map[string]reclaim.Record{}} }

// Mem keeps reclaim decision records in memory, with Consul's check-and-set.
type Mem struct {
	mu    sync.Mutex
	index uint64
	recs  map[string]reclaim.Record
}

func (m *Mem) Create(_ context.Context, r reclaim.Record) (bool, error) {
	return m.cas(r, 0), nil
}
func (m *Mem) Update(_ context.Context, r reclaim.Record) (bool, error) {
	return m.cas(r, r.ModifyIndex), nil
}
func (m *Mem) cas(r reclaim.Record, index uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.recs[r.ID]; (ok && cur.ModifyIndex != index) || (!ok && index != 0) {
		return false
	}
	m.index++
	r.ModifyIndex = m.index
	m.recs[r.ID] = r
	return true
}
func (m *Mem) Get(_ context.Context, id string) (reclaim.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return r, reclaim.ErrNotFound
	}
	return r, nil
}
func (m *Mem) List(context.Context) ([]reclaim.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []reclaim.Record
	for _, r := range m.recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
func (m *Mem) Delete(_ context.Context, r reclaim.Record) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.recs[r.ID]; !ok || cur.ModifyIndex != r.ModifyIndex {
		return false, nil
	}
	delete(m.recs, r.ID)
	return true, nil
}
