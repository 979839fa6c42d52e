package consulkv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// mirror is an in-memory copy of every record of one kind, kept current by
// a blocking query on its directory that decodes only the records whose
// version changed. The broker's own writes go in at once, the other
// brokers' within the moment the query returns. Reading it costs no round
// trip to Consul: a long queue is read on every submission.
type mirror[T any] struct {
	r records[T]

	mu      sync.RWMutex
	records map[string]mirrored[T] // by name
	// list is the records, made by all after each read of the directory
	// (nil: not yet), and kept by this broker's own writes and deletes:
	// names[i] is list[i]'s, at[name] its index.
	list  []T
	names []string
	at    map[string]int
	// shared: view handed list out; it is copied before an element in it
	// changes (an append writes past every view's end, and may stay).
	shared bool
	// gone is what this broker deleted, by name: the version it deleted
	// (0: not known), until a listing no longer has it.
	gone    map[string]uint64
	index   atomic.Uint64 // Consul's index of the directory at the last answer; 0: not followed
	version atomic.Uint64 // counts the copy's changes
}

type mirrored[T any] struct {
	v     T
	index uint64 // Consul's ModifyIndex of v; 0: written here, not read back yet
}

// followSpacing is the least time between two reads of a directory: while
// it changes all the time (submissions at a high rate), each read takes in
// the changes of this long, not one each. Consul sends the whole directory
// every time, so the spacing grows by followPerRecord for each record in
// it. At 10,000 queued jobs a read is megabytes to decode, and a copy read
// after every submission would cost more than the submissions. The
// broker's own writes are in its copy at once whatever the spacing; only
// other brokers' show later, and every change checks versions.
const (
	followSpacing   = 200 * time.Millisecond
	followPerRecord = 100 * time.Microsecond
)

// follow keeps the copy current until ctx ends; on an error it retries
// after a second, the copy marked as not followed (index 0) meanwhile.
func (m *mirror[T]) follow(ctx context.Context) {
	defer m.index.Store(0) // no longer current once it stops
	var index uint64
	var last time.Time
	spacing := followSpacing
	for ctx.Err() == nil {
		if wait := spacing - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		pairs, meta, err := m.r.kv.List(m.r.dir, (&consul.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		var next map[string]mirrored[T]
		if err == nil {
			spacing = followSpacing + time.Duration(len(pairs))*followPerRecord
			next, err = m.read(ctx, pairs)
		}
		if err != nil {
			m.index.Store(0)
			index = 0
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		m.mu.Lock()
		m.records, m.list = m.reconcile(next, meta.LastIndex), nil
		m.mu.Unlock()
		if meta.LastIndex != index {
			m.version.Add(1)
		}
		if meta.LastIndex < index {
			meta.LastIndex = 0 // Consul's index went back (a restore): start over
		}
		index = meta.LastIndex
		m.index.Store(index)
	}
}

// read is the copy as the listing pairs makes it: the records it has at
// their versions kept, the others decoded. One that cannot be read is set
// aside (or, with no Aside, skipped): it must not stop the copy of the
// others. One whose parts Consul did not give fails the read, to be made
// again.
func (m *mirror[T]) read(ctx context.Context, pairs consul.KVPairs) (map[string]mirrored[T], error) {
	next := make(map[string]mirrored[T], len(pairs))
	var changed []*consul.KVPair
	m.mu.RLock() // this broker's own writes go into m.records meanwhile
	for _, p := range pairs {
		name := strings.TrimPrefix(p.Key, m.r.dir)
		if o, ok := m.records[name]; ok && o.index == p.ModifyIndex {
			next[name] = o
		} else {
			changed = append(changed, p)
		}
	}
	m.mu.RUnlock()
	for _, p := range changed {
		v, ok, err := m.r.readable(ctx, p)
		if errors.Is(err, errIncomplete) {
			return nil, err
		}
		if ok && err == nil {
			next[strings.TrimPrefix(p.Key, m.r.dir)] = mirrored[T]{v: v, index: p.ModifyIndex}
		}
	}
	return next, nil
}

// reconcile is the listing next, made at Consul's index listed, with this
// broker's own changes that the listing is too old to hold. A record it
// wrote after the listing was made stays; one it deleted does not come
// back at the version it deleted. A listing answered just before a write
// or a delete here is applied just after it. Without this, a job queued
// here was missing from the copy, or one taken out back in it, until the
// next listing. m.mu is held.
func (m *mirror[T]) reconcile(next map[string]mirrored[T], listed uint64) map[string]mirrored[T] {
	for name, cur := range m.records {
		if l, ok := next[name]; cur.index > listed && (!ok || l.index < cur.index) {
			next[name] = cur
		}
	}
	for name, deleted := range m.gone {
		l, ok := next[name]
		switch {
		case !ok:
			delete(m.gone, name) // the listing has caught up
		case l.index <= deleted:
			delete(next, name)
		default:
			delete(m.gone, name) // made again since
		}
	}
	return next
}

// listNow is every record as Consul lists it now, for when the copy is not
// current (its query failing): the records whose version the copy holds
// are taken from it, so that a queue of 10,000 entries read each second
// meanwhile costs one listing, not a read of every request besides.
func (m *mirror[T]) listNow(ctx context.Context) ([]T, error) {
	pairs, _, err := m.r.kv.List(m.r.dir, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list %s records: %w", m.r.what, err)
	}
	next, err := m.read(ctx, pairs)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(next))
	for _, r := range next {
		out = append(out, r.v)
	}
	return out, nil
}

// followed reports whether the copy is current (follow has an answer and
// its last query did not fail).
func (m *mirror[T]) followed() bool { return m.index.Load() != 0 }

// all is every record of the copy, in no order, in a slice the caller may
// change.
func (m *mirror[T]) all() []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.current())
}

// get is the copy's record name, if it has one.
func (m *mirror[T]) get(name string) (T, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.records[name]
	return r.v, ok
}

// view is every record of the copy, in no order, in a slice shared with
// the copy and the other views: never change it. It costs no copy: at
// 10,000 queued jobs a copy for each submission was most of its time.
func (m *mirror[T]) view() []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shared = true
	return m.current()
}

// current is list, made from the records if need be; m.mu is held.
func (m *mirror[T]) current() []T {
	if m.list == nil {
		m.shared = false
		m.list, m.names, m.at = make([]T, 0, len(m.records)), make([]string, 0, len(m.records)), make(map[string]int, len(m.records))
		for name, r := range m.records {
			m.at[name] = len(m.list)
			m.list, m.names = append(m.list, r.v), append(m.names, name)
		}
	}
	return m.list
}

// own makes list the copy's own before an element in it changes; m.mu is
// held.
func (m *mirror[T]) own() {
	if m.shared {
		m.list, m.shared = slices.Clone(m.list), false
	}
}

// wrote puts this broker's own write of name, read back at its version
// index, in at once; a copy the query brought meanwhile at a later version
// stays (an older version kept would make every change from it fail).
func (m *mirror[T]) wrote(name string, v T, index uint64) {
	m.mu.Lock()
	if m.records == nil {
		m.records = map[string]mirrored[T]{}
	}
	if cur, ok := m.records[name]; !ok || cur.index < index {
		m.records[name] = mirrored[T]{v: v, index: index}
		if i, ok := m.at[name]; ok && m.list != nil {
			m.own()
			m.list[i] = v
		} else if m.list != nil {
			m.at[name] = len(m.list)
			m.list, m.names = append(m.list, v), append(m.names, name)
		}
	}
	m.mu.Unlock()
	m.version.Add(1)
}

// readBack reads name after this broker wrote it and puts it in the copy
// (a write does not tell the version it made); if it cannot be read, the
// query brings it.
func (m *mirror[T]) readBack(ctx context.Context, name string) {
	if v, index, ok, err := m.r.get(ctx, name); ok && err == nil {
		m.wrote(name, v, index)
	}
}

// removed takes this broker's own delete of name out at once.
func (m *mirror[T]) removed(name string) {
	m.mu.Lock()
	if m.gone == nil {
		m.gone = map[string]uint64{}
	}
	m.gone[name] = m.records[name].index
	delete(m.records, name)
	if i, ok := m.at[name]; ok && m.list != nil { // the last one takes its place
		m.own()
		last := len(m.list) - 1
		m.list[i], m.names[i] = m.list[last], m.names[last]
		m.at[m.names[i]] = i
		var zero T // nothing kept alive past the end
		m.list[last] = zero
		m.list, m.names = m.list[:last], m.names[:last]
		delete(m.at, name)
	}
	m.mu.Unlock()
	m.version.Add(1)
}
