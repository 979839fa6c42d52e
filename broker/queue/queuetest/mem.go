// Package queuetest has an in-memory queue store for unit tests of the code that
// uses the queue; the real store (Consul KV) is tested against a real agent.
package queuetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Mem is a queue store in memory, safe for concurrent use.
type Mem struct {
	mu      sync.Mutex
	entries map[string]queue.Entry
	index   uint64 // counts the changes, as Consul's index moves
}

// Index moves with every change, as Consul's index of the queue does.
func (m *Mem) Index() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.index + 1
}

// NewMem returns a store holding entries.
func NewMem(entries ...queue.Entry) *Mem {
	m := &Mem{entries: map[string]queue.Entry{}}
	for _, e := range entries {
		m.entries[e.ID] = e
	}
	return m
}

// Put stores an entry.
func (m *Mem) Put(_ context.Context, e queue.Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[e.ID] = e
	m.index++
	return nil
}

// View returns every entry (a copy: nothing here is shared).
func (m *Mem) View(ctx context.Context) ([]queue.Entry, error) { return m.List(ctx) }

// List returns every entry.
func (m *Mem) List(context.Context) ([]queue.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]queue.Entry, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, e)
	}
	return out, nil
}

// Get returns one entry, or queue.ErrNotFound.
func (m *Mem) Get(_ context.Context, id string) (queue.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return e, fmt.Errorf("queue entry %s: %w", id, queue.ErrNotFound)
	}
	return e, nil
}

// Remove deletes an entry; false if it was not there.
func (m *Mem) Remove(_ context.Context, e queue.Entry) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.entries[e.ID]
	delete(m.entries, e.ID)
	m.index++
	return ok, nil
}

// Claim marks an entry as being admitted at, if it is there at the version
// read (its ModifyIndex), and returns it at its next version.
func (m *Mem) Claim(_ context.Context, e queue.Entry, at time.Time) (queue.Entry, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.entries[e.ID]; !ok || cur.ModifyIndex != e.ModifyIndex {
		return e, false, nil
	}
	e.Admitting = at
	e.ModifyIndex++
	m.entries[e.ID] = e
	m.index++
	return e, true, nil
}

// Park marks an entry parked.
func (m *Mem) Park(_ context.Context, e queue.Entry, reason string, at time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[e.ID]; !ok {
		return false, nil
	}
	e.Parked, e.ParkedAt = reason, at
	m.entries[e.ID] = e
	m.index++
	return true, nil
}

// IDs returns the ids of the queued entries.
func (m *Mem) IDs() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for id := range m.entries {
		out[id] = true
	}
	return out
}
