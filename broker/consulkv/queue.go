package consulkv

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Queue keeps queued jobs under <prefix>queue/<id>, each one's register
// request under <prefix>queue-body/<id>, gzip-compressed. Every change of an
// entry makes Consul send each broker the directory again, and the requests
// are most of its bytes (20 KB each for real training jobs, against a few
// hundred bytes of facts), so they are read once, when the entry is new.
// While Follow runs, List reads its in-memory copy of them.
type Queue struct {
	r      records[queue.Entry]
	m      *mirror[queue.Entry]
	bodies string // <prefix>queue-body/
	// orphans are the requests the last PruneRequests found without an
	// entry: deleted if the next finds them so too.
	orphans map[string]bool
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
	q := &Queue{bodies: prefix + "queue-body/"}
	q.r = records[queue.Entry]{kv: kv, dir: prefix + "queue/", what: "queue entry", kind: "queue", aside: aside,
		version: func(e *queue.Entry, i uint64) { e.ModifyIndex = i }, valid: validEntry, complete: q.readRequest}
	q.m = &mirror[queue.Entry]{r: q.r}
	return q
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
	case e.RequestBytes == 0 && (len(e.Request) == 0 || string(e.Request) == "null"):
		return errors.New("it holds no register request")
	}
	return nil
}

// readRequest reads the request of the entry name where it is kept apart:
// compressed, it stays so in the copy (Packed).
func (q *Queue) readRequest(ctx context.Context, name string, e *queue.Entry) error {
	if e.RequestBytes == 0 {
		return nil
	}
	p, _, err := q.r.kv.Get(q.bodies+name, (&consul.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return err
	case p == nil || len(p.Value) == 0:
		return fmt.Errorf("its request %s%s is %w", q.bodies, name, errMissing)
	case p.Flags&flagGzip == 0:
		e.Request = p.Value
		return nil
	}
	if _, err := gzip.NewReader(bytes.NewReader(p.Value)); err != nil {
		// Unreadable as the entry says: set aside with it.
		return fmt.Errorf("its request %s%s, gzip: %w (%w)", q.bodies, name, err, errMissing)
	}
	e.Request, e.Packed = nil, p.Value
	return nil
}

// flagGzip marks a request kept gzip-compressed (Consul's KV flags): a
// jobspec's JSON shrinks to a third or less, and a Consul server holds each
// byte of it in its state store, its raft log and its heap's headroom.
const flagGzip = 1

// compressed is request as queue-body/ keeps it, with its flags.
func compressed(request []byte) ([]byte, uint64) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed) // a valid level: no error
	if _, err := zw.Write(request); err != nil || zw.Close() != nil || buf.Len() >= len(request) {
		return request, 0
	}
	return buf.Bytes(), flagGzip
}

// stored is e as its record keeps it: without the request kept apart.
func stored(e queue.Entry) queue.Entry {
	if e.RequestBytes > 0 {
		e.Request, e.Packed = nil, nil
	}
	return e
}

// Put writes an entry, its request first, so that an entry is never without
// one; queue.ErrTooLarge when Consul refuses a value that large
// (kv_max_value_size, 512 KiB by default). e carries its request in Request.
func (q *Queue) Put(ctx context.Context, e queue.Entry) error {
	e.RequestBytes = len(e.Request)
	wo := (&consul.WriteOptions{}).WithContext(ctx)
	body, flags := compressed(e.Request)
	if _, err := q.r.kv.Put(&consul.KVPair{Key: q.bodies + e.ID, Value: body, Flags: flags}, wo); err != nil {
		return tooLarge(e.ID, fmt.Errorf("write queue entry %s's request: %w", e.ID, err))
	}
	if flags&flagGzip != 0 {
		e.Request, e.Packed = nil, body // the copy holds it as Consul does
	}
	if err := q.r.put(ctx, e.ID, stored(e)); err != nil {
		if _, derr := q.r.kv.Delete(q.bodies+e.ID, wo); derr != nil {
			err = fmt.Errorf("%w (its request stays until PruneRequests: %w)", err, derr)
		}
		return tooLarge(e.ID, err)
	}
	// The leader's next pass may change it (checking its version) before
	// the copy's query returns.
	q.readBack(ctx, e)
	return nil
}

// tooLarge is err as queue.ErrTooLarge where Consul refused the value's size.
func tooLarge(id string, err error) error {
	var se consul.StatusError
	if errors.As(err, &se) && se.Code == http.StatusRequestEntityTooLarge {
		return fmt.Errorf("queue entry %s: %w (%s)", id, queue.ErrTooLarge, strings.TrimSpace(se.Body))
	}
	return err
}

// readBack puts e, which this broker just wrote, in the copy at the version
// Consul gave it (a write does not tell it); the request is e's own, which
// the write did not change. If it cannot be read, the query brings it.
func (q *Queue) readBack(ctx context.Context, e queue.Entry) {
	if v, index, ok := q.reread(ctx, e); ok {
		q.m.wrote(e.ID, v, index)
	}
}

// reread reads e's record again, with e's request.
func (q *Queue) reread(ctx context.Context, e queue.Entry) (queue.Entry, uint64, bool) {
	p, _, err := q.r.kv.Get(q.r.dir+e.ID, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || p == nil {
		return e, 0, false
	}
	v, err := q.r.decode(p)
	if err != nil {
		return e, 0, false
	}
	if v.RequestBytes > 0 {
		v.Request, v.Packed = e.Request, e.Packed
	}
	return v, p.ModifyIndex, true
}

// List returns every entry (in no order): the in-memory copy while Follow keeps it
// current, else read from Consul. The copy may lag another broker's write
// by the moment its blocking query takes to return; every change made from
// an entry read checks its version, so a stale one changes nothing.
func (q *Queue) List(ctx context.Context) ([]queue.Entry, error) {
	if q.m.followed() {
		return q.m.all(), nil
	}
	return q.m.listNow(ctx)
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

// Remove deletes an entry if it has not changed since it was read, then its
// request; false means another broker got there first.
func (q *Queue) Remove(ctx context.Context, e queue.Entry) (bool, error) {
	ok, err := q.r.remove(ctx, e.ID, e.ModifyIndex)
	if ok {
		q.m.removed(e.ID)
		if e.RequestBytes > 0 {
			// Failing, it is left to PruneRequests: the entry is gone.
			_, _ = q.r.kv.Delete(q.bodies+e.ID, (&consul.WriteOptions{}).WithContext(ctx))
		}
	}
	return ok, err
}

// Claim marks an entry as being admitted at, if it has not changed since it
// was read, and returns it at its new version; false means it changed or
// is gone (cancelled, stopped, replaced, or claimed by another leader).
func (q *Queue) Claim(ctx context.Context, e queue.Entry, at time.Time) (queue.Entry, bool, error) {
	e.Admitting = at
	ok, err := q.r.cas(ctx, e.ID, stored(e), e.ModifyIndex)
	if err != nil || !ok {
		return e, false, err
	}
	claimed, index, found := q.reread(ctx, e)
	if found {
		q.m.wrote(e.ID, claimed, index)
	}
	return claimed, found, nil
}

// Park marks an entry parked with the reason, if it has not changed since it
// was read; false means another broker got there first.
func (q *Queue) Park(ctx context.Context, e queue.Entry, reason string, at time.Time) (bool, error) {
	e.Parked, e.ParkedAt = reason, at
	ok, err := q.r.cas(ctx, e.ID, stored(e), e.ModifyIndex)
	if ok {
		q.readBack(ctx, e)
	}
	return ok, err
}

// PruneRequests deletes the requests under queue-body/ that no entry owns,
// neither queued nor set aside, at this call and the one before: a Put
// writes its request a moment before its entry, and a Remove deletes it a
// moment after, or not at all when Consul failed it then. It returns how
// many it deleted.
func (q *Queue) PruneRequests(ctx context.Context) (int, error) {
	qo := (&consul.QueryOptions{}).WithContext(ctx)
	bodies, _, err := q.r.kv.Keys(q.bodies, "", qo)
	if err != nil {
		return 0, fmt.Errorf("list queued requests: %w", err)
	}
	owned := map[string]bool{}
	dirs := []string{q.r.dir}
	if q.r.aside != nil {
		dirs = append(dirs, q.r.aside.dir+q.r.kind+"/")
	}
	for _, dir := range dirs {
		keys, _, err := q.r.kv.Keys(dir, "", qo)
		if err != nil {
			return 0, fmt.Errorf("list queue entries: %w", err)
		}
		for _, k := range keys {
			owned[strings.TrimPrefix(k, dir)] = true
		}
	}
	orphans, deleted := map[string]bool{}, 0
	for _, k := range bodies {
		id := strings.TrimPrefix(k, q.bodies)
		switch {
		case owned[id]:
		case q.orphans[id]:
			if _, err := q.r.kv.Delete(k, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
				return deleted, fmt.Errorf("delete queued request %s: %w", id, err)
			}
			deleted++
		default:
			orphans[id] = true
		}
	}
	q.orphans = orphans
	return deleted, nil
}
