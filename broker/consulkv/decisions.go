package consulkv

import (
	"context"
	"fmt"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Decisions keeps reclaim decision records under <prefix>reclaim/<id>.
type Decisions struct{ r records[reclaim.Record] }

// NewDecisions returns the records under prefix (e.g. "nomad-gpu/").
func NewDecisions(kv *consul.KV, prefix string, aside *Aside) *Decisions {
	return &Decisions{records[reclaim.Record]{kv: kv, dir: prefix + "reclaim/", what: "reclaim decision", kind: "reclaim", aside: aside,
		version: func(r *reclaim.Record, i uint64) { r.ModifyIndex = i }}}
}

// Create writes a new record; false if one with its id exists.
func (d *Decisions) Create(ctx context.Context, r reclaim.Record) (bool, error) {
	return d.r.cas(ctx, r.ID, r, 0)
}

// Update writes r if it has not changed since it was read; false means
// someone else changed it first (a cancel, another leader).
func (d *Decisions) Update(ctx context.Context, r reclaim.Record) (bool, error) {
	return d.r.cas(ctx, r.ID, r, r.ModifyIndex)
}

// List returns every record.
func (d *Decisions) List(ctx context.Context) ([]reclaim.Record, error) {
	out, _, err := d.r.list(ctx, &consul.QueryOptions{}, nil)
	return out, err
}

// Get returns one record.
func (d *Decisions) Get(ctx context.Context, id string) (reclaim.Record, error) {
	if !queue.ValidID(id) {
		return reclaim.Record{}, reclaim.ErrNotFound
	}
	r, _, ok, err := d.r.get(ctx, id)
	if err == nil && !ok {
		err = fmt.Errorf("reclaim decision %s: %w", id, reclaim.ErrNotFound)
	}
	return r, err
}

// Delete removes a record if it has not changed since it was read.
func (d *Decisions) Delete(ctx context.Context, r reclaim.Record) (bool, error) {
	return d.r.remove(ctx, r.ID, r.ModifyIndex)
}
