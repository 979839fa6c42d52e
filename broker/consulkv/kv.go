// Package consulkv is the broker's storage in Consul KV: every record it
// keeps, each kind under its own path below the configured prefix (default
// nomad-gpu/):
//
//	queue/<id>                             queued jobs (Queue), each request under queue-body/<id>
//	reclaim/<id>                           reclaim decisions (Decisions)
//	approvals/<id>                         approvals, with a snapshot every broker follows (Approvals)
//	scaled/<region>/<namespace>/<job>      what a scale or dispatch through the broker admitted (Scales)
//	stopped/<region>/<namespace>/<job>     admitted jobs Nomad stopped since, followed (Stops)
//	registered/<region>/<namespace>/<job>  the JobModifyIndex of the broker's last write of each job, followed (Registrations)
//	backoff/<namespace>/<job>              preemptions of jobs evicted while borrowed, followed (Backoffs)
//	rightsizing/<namespace>/<job>          right-sizing profiles (Profiles)
//	usage/<day>, usage-through             daily GPU time and how far it is counted (Rollups)
//	holds                                  the nodes the leader holds for waiting jobs, followed (Holds)
//	drained                                the regions no new work goes to, followed (Drains)
//	admission-key                          the key admission stamps are made with (StampKey)
//	quarantine/<kind>/<name>               records that could not be read, set aside as they were (Aside)
//
// ("Followed": every broker keeps a copy current with a blocking query.)
//
// A job's records are its region's: two regions each keep their own job of
// one id. One written before records were keyed by region
// (<namespace>/<job>) is the broker's home region's.
//
// Values are JSON. A record's version is Consul's ModifyIndex, and every
// change of one that was read is a check-and-set against it, so that two
// brokers never both act on the same version. The leader lock (leader) is
// the leader package's.
package consulkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	consul "github.com/hashicorp/consul/api"
)

// records is one kind of JSON record under a directory of the prefix.
type records[T any] struct {
	kv   *consul.KV
	dir  string // e.g. "nomad-gpu/queue/"
	what string // what one record is, for errors: "queue entry"
	// version sets a record's version when it is read (nil: it keeps none).
	version func(*T, uint64)
	// kind names the records under quarantine/ and in metrics: "queue".
	kind string
	// aside sets a record that cannot be read aside, so that it stops
	// nothing (nil: reading it fails).
	aside *Aside
	// valid says why a record that decodes is still not one of its kind
	// (null, {}, an id that is not its key's: a copy); nil: any decodes.
	valid func(name string, v *T) error
	// complete reads what a record keeps under another key into it (nil:
	// nothing). An error wrapping errMissing makes the record unreadable;
	// any other is Consul's, and the read fails.
	complete func(ctx context.Context, name string, v *T) error
}

// errMissing is a record's part that is not where the record says;
// errIncomplete a record whose parts Consul did not answer for.
var (
	errMissing    = errors.New("missing")
	errIncomplete = errors.New("its parts could not be read")
)

// Aside moves records that cannot be decoded (a hand edit, a torn write)
// out of their directory to <prefix>quarantine/<kind>/<name>, as they were,
// and tells of each: one such record must never stop the others of its kind.
type Aside struct {
	client *consul.Client
	dir    string
	told   func(Unreadable)
}

// Unreadable is a record set aside.
type Unreadable struct {
	Kind, Key string
	MovedTo   string // "" when it could not be moved (it is skipped all the same)
	Err       error
}

// NewAside sets records aside under prefix (e.g. "nomad-gpu/"); told hears
// of each (logs, metrics).
func NewAside(client *consul.Client, prefix string, told func(Unreadable)) *Aside {
	return &Aside{client: client, dir: prefix + "quarantine/", told: told}
}

// setAside moves p to quarantine/<kind>/<name> in one transaction, if it is
// still the version read.
func (a *Aside) setAside(ctx context.Context, kind, name string, p *consul.KVPair, why error) {
	u := Unreadable{Kind: kind, Key: p.Key, Err: why}
	to := a.dir + kind + "/" + name
	ops := consul.TxnOps{
		{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: to, Value: p.Value, Flags: p.Flags}},
		{KV: &consul.KVTxnOp{Verb: consul.KVDeleteCAS, Key: p.Key, Index: p.ModifyIndex}},
	}
	ok, _, _, err := a.client.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err == nil && ok {
		u.MovedTo = to
	}
	a.told(u)
}

// SetAside lists the records set aside: key under quarantine/, size, and
// Consul's modify index.
func (a *Aside) SetAside(ctx context.Context) ([]SetAsideRecord, error) {
	pairs, _, err := a.client.KV().List(a.dir, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list records set aside: %w", err)
	}
	out := make([]SetAsideRecord, 0, len(pairs))
	for _, p := range pairs {
		out = append(out, SetAsideRecord{Key: p.Key, Bytes: len(p.Value), ModifyIndex: p.ModifyIndex})
	}
	return out, nil
}

// SetAsideRecord is one record under quarantine/.
type SetAsideRecord struct {
	Key         string `json:"key"`
	Bytes       int    `json:"bytes"`
	ModifyIndex uint64 `json:"modify_index"`
}

// escape makes a key's name from parts that may hold "/" (namespaces, job ids).
func escape(parts ...string) string {
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

func (r records[T]) decode(p *consul.KVPair) (T, error) {
	var v T
	if err := json.Unmarshal(p.Value, &v); err != nil {
		return v, fmt.Errorf("decode %s %s: %w", r.what, p.Key, err)
	}
	if r.valid != nil {
		if err := r.valid(strings.TrimPrefix(p.Key, r.dir), &v); err != nil {
			return v, fmt.Errorf("decode %s %s: %w", r.what, p.Key, err)
		}
	}
	if r.version != nil {
		r.version(&v, p.ModifyIndex)
	}
	return v, nil
}

func (r records[T]) encode(name string, v T) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", r.what, name, err)
	}
	return b, nil
}

// readable decodes p; one that cannot be decoded is set aside, and false.
func (r records[T]) readable(ctx context.Context, p *consul.KVPair) (T, bool, error) {
	v, err := r.decode(p)
	if err == nil && r.complete != nil {
		if err = r.complete(ctx, strings.TrimPrefix(p.Key, r.dir), &v); err != nil && !errors.Is(err, errMissing) {
			return v, false, fmt.Errorf("read %s %s: %w: %w", r.what, p.Key, errIncomplete, err)
		}
	}
	if err == nil {
		return v, true, nil
	}
	if r.aside == nil {
		return v, false, err
	}
	r.aside.setAside(ctx, r.kind, strings.TrimPrefix(p.Key, r.dir), p, err)
	return v, false, nil
}

// get reads the record name and its version; false when there is none (or
// it could not be read, and was set aside).
func (r records[T]) get(ctx context.Context, name string) (T, uint64, bool, error) {
	var zero T
	p, _, err := r.kv.Get(r.dir+name, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return zero, 0, false, fmt.Errorf("read %s %s: %w", r.what, name, err)
	}
	if p == nil {
		return zero, 0, false, nil
	}
	v, ok, err := r.readable(ctx, p)
	if !ok {
		return zero, 0, false, err
	}
	return v, p.ModifyIndex, true, nil
}

// list reads the records whose names keep takes (nil: every one; q may
// make it a blocking query) and the index of the answer.
func (r records[T]) list(ctx context.Context, q *consul.QueryOptions, keep func(name string) bool) ([]T, uint64, error) {
	pairs, meta, err := r.kv.List(r.dir, q.WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("list %s records: %w", r.what, err)
	}
	out := make([]T, 0, len(pairs))
	for _, p := range pairs {
		if keep != nil && !keep(strings.TrimPrefix(p.Key, r.dir)) {
			continue
		}
		v, ok, err := r.readable(ctx, p)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			out = append(out, v)
		}
	}
	return out, meta.LastIndex, nil
}

// put writes the record name, whatever was there.
func (r records[T]) put(ctx context.Context, name string, v T) error {
	b, err := r.encode(name, v)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(&consul.KVPair{Key: r.dir + name, Value: b}, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("write %s %s: %w", r.what, name, err)
	}
	return nil
}

// replace writes the record name and deletes the records named in stale,
// in one transaction, and returns the version written (a write alone does
// not tell it, so the copy would read it back).
func (r records[T]) replace(ctx context.Context, name string, v T, stale []string) (uint64, error) {
	b, err := r.encode(name, v)
	if err != nil {
		return 0, err
	}
	ops := consul.KVTxnOps{{Verb: consul.KVSet, Key: r.dir + name, Value: b}}
	for _, s := range stale {
		ops = append(ops, &consul.KVTxnOp{Verb: consul.KVDelete, Key: r.dir + s})
	}
	ok, resp, _, err := r.kv.Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err == nil && (!ok || resp == nil || len(resp.Results) == 0) {
		err = fmt.Errorf("transaction refused: %+v", resp)
	}
	if err != nil {
		return 0, fmt.Errorf("write %s %s: %w", r.what, name, err)
	}
	return resp.Results[0].ModifyIndex, nil
}

// cas writes the record name if its version is still index (0: if there is
// none); false when another writer changed it first.
func (r records[T]) cas(ctx context.Context, name string, v T, index uint64) (bool, error) {
	b, err := r.encode(name, v)
	if err != nil {
		return false, err
	}
	ok, _, err := r.kv.CAS(&consul.KVPair{Key: r.dir + name, Value: b, ModifyIndex: index}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("write %s %s: %w", r.what, name, err)
	}
	return ok, nil
}

// remove deletes the record name if its version is still index; false when
// another writer changed it first.
func (r records[T]) remove(ctx context.Context, name string, index uint64) (bool, error) {
	ok, _, err := r.kv.DeleteCAS(&consul.KVPair{Key: r.dir + name, ModifyIndex: index}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("remove %s %s: %w", r.what, name, err)
	}
	return ok, nil
}

// names reads the names of the records and their versions.
func (r records[T]) names(ctx context.Context) (map[string]uint64, error) {
	pairs, _, err := r.kv.List(r.dir, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list %s records: %w", r.what, err)
	}
	out := make(map[string]uint64, len(pairs))
	for _, p := range pairs {
		out[strings.TrimPrefix(p.Key, r.dir)] = p.ModifyIndex
	}
	return out, nil
}

// prune deletes the records gone picks (removed, if not nil, hears of
// each); it returns how many. Gone's first error is returned once every
// other record was looked at.
func (r records[T]) prune(ctx context.Context, gone func(name string) (bool, error), removed func(name string)) (int, error) {
	names, err := r.names(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	var firstErr error
	for name, index := range names {
		if g, err := gone(name); err != nil || !g {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if ok, err := r.remove(ctx, name, index); err != nil {
			return deleted, err
		} else if ok {
			if removed != nil {
				removed(name)
			}
			deleted++
		}
	}
	return deleted, firstErr
}

// unescape is escape's parts back; false for a name escape did not make.
func unescape(name string, n int) ([]string, bool) {
	parts := strings.Split(name, "/")
	if len(parts) != n {
		return nil, false
	}
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil {
			return nil, false
		}
		parts[i] = u
	}
	return parts, true
}
