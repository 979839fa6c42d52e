package consulkv

import (
	"context"
	"fmt"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Rollups keeps daily GPU time under <prefix>usage/<YYYY-MM-DD> and, under
// <prefix>usage-through, the mark of how far it is counted: every write moves
// that mark with a check-and-set in the same transaction, so an interval is
// counted once whichever leader writes it.
type Rollups struct {
	client *consul.Client
	days   records[usage.Rollup]
	mark   records[usage.Mark]
}

// NewRollups returns the rollups under prefix (e.g. "nomad-gpu/").
func NewRollups(client *consul.Client, prefix string, aside *Aside) *Rollups {
	return &Rollups{client: client,
		days: records[usage.Rollup]{kv: client.KV(), dir: prefix + "usage/", what: "usage of day", kind: "usage", aside: aside},
		mark: records[usage.Mark]{kv: client.KV(), dir: prefix, what: "usage mark", kind: "usage-through", aside: aside}}
}

const throughName = "usage-through"

// Mark returns the mark (zero: never counted) and its index for Commit.
func (r *Rollups) Mark(ctx context.Context) (usage.Mark, uint64, error) {
	m, index, _, err := r.mark.get(ctx, throughName)
	return m, index, err
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
	d, _, ok, err := r.days.get(ctx, day)
	if err == nil && !ok {
		d.Day = day
	}
	return d, err
}

// Commit writes days and the new mark, if the mark is still at index (0:
// not set); false when another leader moved it first.
func (r *Rollups) Commit(ctx context.Context, index uint64, m usage.Mark, days []usage.Rollup) (bool, error) {
	mark, err := r.mark.encode(throughName, m)
	if err != nil {
		return false, err
	}
	ops := consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: r.mark.dir + throughName, Index: index, Value: mark}}}
	for _, d := range days {
		b, err := r.days.encode(d.Day, d)
		if err != nil {
			return false, err
		}
		ops = append(ops, &consul.TxnOp{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: r.days.dir + d.Day, Value: b}})
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
	out, _, err := r.days.list(ctx, &consul.QueryOptions{}, func(day string) bool { return day >= from && day <= to })
	return out, err
}

// DeleteBefore removes the rollups of days before day.
func (r *Rollups) DeleteBefore(ctx context.Context, day string) error {
	keys, _, err := r.client.KV().Keys(r.days.dir, "", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("list usage: %w", err)
	}
	for _, k := range keys {
		if strings.TrimPrefix(k, r.days.dir) < day {
			if _, err := r.client.KV().Delete(k, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
				return fmt.Errorf("remove usage %s: %w", k, err)
			}
		}
	}
	return nil
}
