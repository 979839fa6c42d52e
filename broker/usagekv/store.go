// Package usagekv keeps the broker's usage data in Consul KV, and runs the
// leader's two watchers that write it: the right-sizing profile of each job
// under <prefix>rightsizing/<namespace>/<job> (Store, written by Recorder), and
// the daily GPU-time rollups under <prefix>usage/<day> with their mark
// <prefix>usage-through (Rollups, written by Ledger, which also feeds the GPU
// seconds metric and the tenants' budgets).
package usagekv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Store keeps profiles under <prefix>rightsizing/.
type Store struct {
	client *consul.Client
	prefix string
}

// NewStore returns a store under prefix (e.g. "nomad-gpu/").
func NewStore(client *consul.Client, prefix string) *Store {
	return &Store{client: client, prefix: prefix + "rightsizing/"}
}

// key escapes namespace and job id: both may hold "/".
func (s *Store) key(namespace, job string) string {
	return s.prefix + url.PathEscape(namespace) + "/" + url.PathEscape(job)
}

// List returns every stored profile.
func (s *Store) List(ctx context.Context) ([]usage.Profile, error) {
	pairs, _, err := s.client.KV().List(s.prefix, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list right-sizing profiles: %w", err)
	}
	out := make([]usage.Profile, 0, len(pairs))
	for _, p := range pairs {
		var pr usage.Profile
		if err := json.Unmarshal(p.Value, &pr); err != nil {
			return nil, fmt.Errorf("decode right-sizing profile %s: %w", p.Key, err)
		}
		out = append(out, pr)
	}
	return out, nil
}

// txnMax is the most operations Consul takes in one transaction.
const txnMax = 64

// Put writes profiles, many to a transaction; what it returns is what was
// not written.
func (s *Store) Put(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	return s.batch(ctx, ps, func(p usage.Profile) (*consul.KVTxnOp, error) {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encode right-sizing profile of %s/%s: %w", p.Namespace, p.Job, err)
		}
		return &consul.KVTxnOp{Verb: consul.KVSet, Key: s.key(p.Namespace, p.Job), Value: b}, nil
	})
}

// Delete removes profiles; what it returns is what was not removed.
func (s *Store) Delete(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	return s.batch(ctx, ps, func(p usage.Profile) (*consul.KVTxnOp, error) {
		return &consul.KVTxnOp{Verb: consul.KVDelete, Key: s.key(p.Namespace, p.Job)}, nil
	})
}

func (s *Store) batch(ctx context.Context, ps []usage.Profile, op func(usage.Profile) (*consul.KVTxnOp, error)) ([]usage.Profile, error) {
	for start := 0; start < len(ps); start += txnMax {
		chunk := ps[start:min(start+txnMax, len(ps))]
		ops := make(consul.TxnOps, 0, len(chunk))
		for _, p := range chunk {
			o, err := op(p)
			if err != nil {
				return ps[start:], err
			}
			ops = append(ops, &consul.TxnOp{KV: o})
		}
		ok, resp, _, err := s.client.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
		if err == nil && !ok {
			err = fmt.Errorf("%v", resp.Errors)
		}
		if err != nil {
			return ps[start:], fmt.Errorf("write right-sizing profiles: %w", err)
		}
	}
	return nil, nil
}
