package consulkv

import (
	"context"
	"fmt"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Profiles keeps right-sizing profiles under <prefix>rightsizing/<namespace>/<job>.
type Profiles struct {
	client *consul.Client
	r      records[usage.Profile]
}

// NewProfiles returns the profiles under prefix (e.g. "nomad-gpu/").
func NewProfiles(client *consul.Client, prefix string, aside *Aside) *Profiles {
	return &Profiles{client: client, r: records[usage.Profile]{kv: client.KV(), dir: prefix + "rightsizing/", what: "right-sizing profile", kind: "rightsizing", aside: aside}}
}

// List returns every stored profile.
func (s *Profiles) List(ctx context.Context) ([]usage.Profile, error) {
	out, _, err := s.r.list(ctx, &consul.QueryOptions{}, nil)
	return out, err
}

// txnMax is the most operations Consul takes in one transaction.
const txnMax = 64

// Put writes profiles, many to a transaction; what it returns is what was
// not written.
func (s *Profiles) Put(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	return s.batch(ctx, ps, func(p usage.Profile) (*consul.KVTxnOp, error) {
		name := escape(p.Namespace, p.Job)
		b, err := s.r.encode(name, p)
		if err != nil {
			return nil, err
		}
		return &consul.KVTxnOp{Verb: consul.KVSet, Key: s.r.dir + name, Value: b}, nil
	})
}

// Delete removes profiles; what it returns is what was not removed.
func (s *Profiles) Delete(ctx context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	return s.batch(ctx, ps, func(p usage.Profile) (*consul.KVTxnOp, error) {
		return &consul.KVTxnOp{Verb: consul.KVDelete, Key: s.r.dir + escape(p.Namespace, p.Job)}, nil
	})
}

func (s *Profiles) batch(ctx context.Context, ps []usage.Profile, op func(usage.Profile) (*consul.KVTxnOp, error)) ([]usage.Profile, error) {
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
