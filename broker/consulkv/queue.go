package consulkv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Queue keeps queued jobs under <prefix>queue/<id>. While Follow runs, List
// reads its in-memory copy of them.
type Queue struct {
	r records[queue.Entry]
	m *mirror[queue.Entry]
}

// Follow keeps the queue's in-memory copy and Index current (a blocking query
// on the queue, which returns when an entry is added, changed or removed)
// until ctx ends.
func (q *Queue) Follow(ctx context.Context) { q.m.follow(ctx) }

// Index is Consul's index of the queue as Follow last saw it: it moves
// whenever an entry is added, changed or removed (0: not known).
func (q *Queue) Index() uint64 { return q.m.index.Load() }

// NewQueue returns the queue under prefix (e.g. "nomad-gpu/").
func NewQueue(kv *consul.KV, prefix string, aside *Aside) *Queue {
	r := records[queue.Entry]{kv: kv, dir: prefix + "queue/", what: "queue entry", kind: "queue", aside: aside,
		version: func(e *queue.Entry, i uint64) { e.ModifyIndex = i }, valid: validEntry}
	return &Queue{r: r, m: &mirror[queue.Entry]{r: r}}
}

// validEntry says why an entry that decodes is not one the broker wrote
// under name: listed, it could not be cancelled, and would be parked again
// at every pass.
func validEntry(name string, e *queue.Entry) error {
	switch {
	case e.ID != name:
		return fmt.Errorf("its id %q is not its key's (an empty record, or a copy)", e.ID)
	case e.JobID == "" || e.Namespace == "":
		return errors.New("it names no job or no namespace")
	case len(e.Request) == 0 || string(e.Request) == "null":
		return errors.New("it holds no register request")
	}
	return nil
}

// Put writes an entry; queue.ErrTooLarge when Consul refuses a value that
// large (kv_max_value_size, 512 KiB by default).
func (q *Queue) Put(ctx context.Context, e queue.Entry) error {
	err := q.r.put(ctx, e.ID, e)
	if err == nil {
		// The leader's next pass may change it (checking its version)
		// before the copy's query returns.
		q.m.readBack(ctx, e.ID)
	}
	var se consul.StatusError
	if errors.As(err, &se) && se.Code == http.StatusRequestEntityTooLarge {
		return fmt.Errorf("queue entry %s: %w (%s)", e.ID, queue.ErrTooLarge, strings.TrimSpace(se.Body))
	}
	return err
}

// List returns every entry (in no order): the in-memory copy while Follow keeps it
// current, else read from Consul. The copy may lag another broker's write
// by the moment its blocking query takes to return; every change made from
// an entry read checks its version, so a stale one changes nothing.
func (q *Queue) List(ctx context.Context) ([]queue.Entry, error) {
	if q.m.followed() {
		return q.m.all(), nil
	}
	out, _, err := q.r.list(ctx, &consul.QueryOptions{}, nil)
	return out, err
}

// View is List without the copy: the slice is shared, so the caller must
// never change it or an entry in it.
func (q *Queue) View(ctx context.Context) ([]queue.Entry, error) {
	if q.m.followed() {
		return q.m.view(), nil
	}
	return q.List(ctx)
}

// Get returns one entry.
func (q *Queue) Get(ctx context.Context, id string) (queue.Entry, error) {
	if !queue.ValidID(id) {
		return queue.Entry{}, queue.ErrNotFound
	}
	e, _, ok, err := q.r.get(ctx, id)
	if err == nil && !ok {
		err = fmt.Errorf("queue entry %s: %w", id, queue.ErrNotFound)
	}
	return e, err
}

// Remove deletes an entry if it has not changed since it was read; false means
// another broker got there first.
func (q *Queue) Remove(ctx context.Context, e queue.Entry) (bool, error) {
	ok, err := q.r.remove(ctx, e.ID, e.ModifyIndex)
	if ok {
		q.m.removed(e.ID)
	}
	return ok, err
}

// Claim marks an entry as being admitted at, if it has not changed since it
// was read, and returns it at its new version; false means it changed or
// is gone (cancelled, stopped, replaced, or claimed by another leader).
func (q *Queue) Claim(ctx context.Context, e queue.Entry, at time.Time) (queue.Entry, bool, error) {
	e.Admitting = at
	ok, err := q.r.cas(ctx, e.ID, e, e.ModifyIndex)
	if err != nil || !ok {
		return e, false, err
	}
	claimed, _, found, err := q.r.get(ctx, e.ID)
	if found && err == nil {
		q.m.wrote(e.ID, claimed, claimed.ModifyIndex)
	}
	return claimed, found && err == nil, err
}

// Park marks an entry parked with the reason, if it has not changed since it
// was read; false means another broker got there first.
func (q *Queue) Park(ctx context.Context, e queue.Entry, reason string, at time.Time) (bool, error) {
	e.Parked, e.ParkedAt = reason, at
	ok, err := q.r.cas(ctx, e.ID, e, e.ModifyIndex)
	if ok {
		q.m.readBack(ctx, e.ID)
	}
	return ok, err
}
