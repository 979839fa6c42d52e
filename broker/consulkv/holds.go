package consulkv

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// Holds keeps, under <prefix>holds, the nodes the leader holds for waiting
// jobs (placement reserve_after: node id → "namespace/job"), so that every
// broker's gate keeps other borrowed work off them, not only the leader's
// queue. The leader's queue pass is the key's owner: it writes the holds
// when they change and deletes the key when none is left.
type Holds struct {
	kv   *consul.KV
	key  string
	last map[string]string // what this broker last wrote (nil: nothing known)
}

// NewHolds returns the holds under prefix (e.g. "nomad-gpu/").
func NewHolds(kv *consul.KV, prefix string) *Holds { return &Holds{kv: kv, key: prefix + "holds"} }

// Put records the holds now (none: the key is deleted). Only the leader's
// queue pass calls it, one at a time.
func (h *Holds) Put(ctx context.Context, held map[string]string) error {
	if h.last != nil && maps.Equal(h.last, held) {
		return nil
	}
	var err error
	if len(held) == 0 {
		_, err = h.kv.Delete(h.key, (&consul.WriteOptions{}).WithContext(ctx))
	} else {
		var raw []byte
		if raw, err = json.Marshal(held); err == nil {
			_, err = h.kv.Put(&consul.KVPair{Key: h.key, Value: raw}, (&consul.WriteOptions{}).WithContext(ctx))
		}
	}
	if err != nil {
		h.last = nil
		return fmt.Errorf("write the nodes held for waiting jobs: %w", err)
	}
	h.last = maps.Clone(held)
	return nil
}

// Follow hands every change of the holds to apply (a blocking query),
// until ctx ends; a value that cannot be read counts as no hold (the next
// pass writes it again), and an error is retried after a second.
func (h *Holds) Follow(ctx context.Context, apply func(map[string]string)) {
	followMap(ctx, h.kv, h.key, apply)
}

// followMap hands every change of key's JSON object of strings to apply (a
// blocking query) until ctx ends: a value that cannot be read as one counts
// as empty, and an error is retried after a second.
func followMap(ctx context.Context, kv *consul.KV, key string, apply func(map[string]string)) {
	var index uint64
	for ctx.Err() == nil {
		pair, meta, err := kv.Get(key, (&consul.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if err != nil {
			index = 0
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		m := map[string]string{}
		if pair != nil && json.Unmarshal(pair.Value, &m) != nil {
			m = map[string]string{}
		}
		apply(m)
		if meta.LastIndex < index {
			meta.LastIndex = 0 // Consul's index went back (a restore): start over
		}
		index = meta.LastIndex
	}
}
