package usagekv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Rollups keeps daily GPU time under <prefix>usage/<YYYY-MM-DD> and, under
// <prefix>usage-through, the time it is counted up to: every write moves
// that mark with a check-and-set in the same transaction, so an interval is
// counted once whichever leader writes it.
type Rollups struct {
	client *consul.Client
	prefix string
}

// NewRollups returns the rollups under prefix (e.g. "nomad-gpu/").
func NewRollups(client *consul.Client, prefix string) *Rollups {
	return &Rollups{client: client, prefix: prefix}
}

func (r *Rollups) dayKey(day string) string { return r.prefix + "usage/" + day }
func (r *Rollups) throughKey() string       { return r.prefix + "usage-through" }

// Mark is how far GPU time is counted, and the tenants' decayed GPU-hours
// up to there: both move together.
type Mark struct {
	Through time.Time     `json:"through"`
	Decayed usage.Decayed `json:"decayed_gpu_hours"`
}

// Mark returns the mark (zero: never counted) and its index for Commit.
func (r *Rollups) Mark(ctx context.Context) (Mark, uint64, error) {
	p, _, err := r.client.KV().Get(r.throughKey(), (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || p == nil {
		return Mark{}, 0, wrap("read the usage mark", err)
	}
	var m Mark
	if err := json.Unmarshal(p.Value, &m); err != nil {
		return Mark{}, 0, fmt.Errorf("usage mark %s: %w", p.Key, err)
	}
	return m, p.ModifyIndex, nil
}

// Decayed returns the tenants' decayed GPU-hours as of now.
func (r *Rollups) Decayed(ctx context.Context, now time.Time, halfLife time.Duration) (map[string]float64, error) {
	m, _, err := r.Mark(ctx)
	if err != nil {
		return nil, err
	}
	return m.Decayed.As(now, halfLife), nil
}

// Day returns one day's rollup (empty if none).
func (r *Rollups) Day(ctx context.Context, day string) (usage.Rollup, error) {
	p, _, err := r.client.KV().Get(r.dayKey(day), (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || p == nil {
		return usage.Rollup{Day: day}, wrap("read usage of "+day, err)
	}
	return decodeRollup(p)
}

func decodeRollup(p *consul.KVPair) (usage.Rollup, error) {
	var out usage.Rollup
	if err := json.Unmarshal(p.Value, &out); err != nil {
		return out, fmt.Errorf("decode usage %s: %w", p.Key, err)
	}
	return out, nil
}

// Commit writes days and the new mark, if the mark is still at index (0:
// not set); false when another leader moved it first.
func (r *Rollups) Commit(ctx context.Context, index uint64, m Mark, days []usage.Rollup) (bool, error) {
	mark, err := json.Marshal(m)
	if err != nil {
		return false, fmt.Errorf("encode the usage mark: %w", err)
	}
	ops := consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: r.throughKey(), Index: index, Value: mark}}}
	for _, d := range days {
		b, err := json.Marshal(d)
		if err != nil {
			return false, fmt.Errorf("encode usage of %s: %w", d.Day, err)
		}
		ops = append(ops, &consul.TxnOp{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: r.dayKey(d.Day), Value: b}})
	}
	ok, _, _, err := r.client.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("write usage: %w", err)
	}
	return ok, nil
}

// Days returns the rollups of the days from from to to (YYYY-MM-DD, both
// included).
func (r *Rollups) Days(ctx context.Context, from, to string) ([]usage.Rollup, error) {
	pairs, _, err := r.client.KV().List(r.prefix+"usage/", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list usage: %w", err)
	}
	var out []usage.Rollup
	for _, p := range pairs {
		day := strings.TrimPrefix(p.Key, r.prefix+"usage/")
		if day < from || day > to {
			continue
		}
		d, err := decodeRollup(p)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// DeleteBefore removes the rollups of days before day.
func (r *Rollups) DeleteBefore(ctx context.Context, day string) error {
	keys, _, err := r.client.KV().Keys(r.prefix+"usage/", "", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("list usage: %w", err)
	}
	for _, k := range keys {
		if strings.TrimPrefix(k, r.prefix+"usage/") < day {
			if _, err := r.client.KV().Delete(k, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
				return fmt.Errorf("remove usage %s: %w", k, err)
			}
		}
	}
	return nil
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
