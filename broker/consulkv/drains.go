package consulkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	consul "github.com/hashicorp/consul/api"
)

// Drains keeps, under <prefix>drained, the regions no new work goes to
// (gpu-broker region drain: region → who drained it and when), which every
// broker's view follows. The drain and resume calls own the key: a resume
// deletes its region's entry, and the key with the last one.
type Drains struct {
	kv  *consul.KV
	key string
}

// NewDrains returns the drains under prefix (e.g. "nomad-gpu/").
func NewDrains(kv *consul.KV, prefix string) *Drains {
	return &Drains{kv: kv, key: prefix + "drained"}
}

// errConflict is a write another broker's made first: read and try again.
var errConflict = errors.New("changed meanwhile")

// Set drains region, by saying who and when, or resumes it (by ""), and
// returns the drains now. Brokers may write at once: each write is a
// check-and-set of what it read.
func (d *Drains) Set(ctx context.Context, region, by string) (map[string]string, error) {
	for range 10 {
		drained, err := d.set(ctx, region, by)
		if !errors.Is(err, errConflict) {
			return drained, err
		}
	}
	return nil, fmt.Errorf("record region %s's drain: %w ten times", region, errConflict)
}

func (d *Drains) set(ctx context.Context, region, by string) (map[string]string, error) {
	pair, _, err := d.kv.Get(d.key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read the drained regions: %w", err)
	}
	drained, index := map[string]string{}, uint64(0)
	if pair != nil {
		index = pair.ModifyIndex
		if json.Unmarshal(pair.Value, &drained) != nil {
			drained = map[string]string{} // unreadable: rewritten whole
		}
	}
	next := maps.Clone(drained)
	if by == "" {
		delete(next, region)
	} else {
		next[region] = by
	}
	var ok bool
	w := (&consul.WriteOptions{}).WithContext(ctx)
	switch {
	case len(next) == 0 && pair == nil:
		return next, nil
	case len(next) == 0:
		ok, _, err = d.kv.DeleteCAS(&consul.KVPair{Key: d.key, ModifyIndex: index}, w)
	default:
		raw, _ := json.Marshal(next)
		ok, _, err = d.kv.CAS(&consul.KVPair{Key: d.key, Value: raw, ModifyIndex: index}, w)
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("write the drained regions: %w", err)
	case !ok:
		return nil, errConflict
	}
	return next, nil
}

// Follow hands every change of the drains to apply (a blocking query),
// until ctx ends.
func (d *Drains) Follow(ctx context.Context, apply func(map[string]string)) {
	followMap(ctx, d.kv, d.key, apply)
}
