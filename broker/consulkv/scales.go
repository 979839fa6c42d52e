package consulkv

import (
	"context"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Scales keeps what the broker admitted when it scaled a job, or dispatched
// a child of one, under <prefix>scaled/<namespace>/<job>: a scale changes a
// job's counts but not its meta, and a child carries its parent's stamp, so
// the admission stamp alone no longer verifies either. Prune is the keys'
// owner: the leader deletes those of jobs Nomad no longer has.
type Scales struct{ r records[nomadjob.ScaleGrant] }

// NewScales returns the grants under prefix (e.g. "nomad-gpu/").
func NewScales(kv *consul.KV, prefix string, aside *Aside) *Scales {
	return &Scales{records[nomadjob.ScaleGrant]{kv: kv, dir: prefix + "scaled/", what: "scale grant", kind: "scaled", aside: aside}}
}

// Get returns the grant of a job, if any.
func (s *Scales) Get(ctx context.Context, namespace, job string) (nomadjob.ScaleGrant, bool, error) {
	g, _, ok, err := s.r.get(ctx, escape(namespace, job))
	return g, ok, err
}

// Put records a job's grant, replacing the one before.
func (s *Scales) Put(ctx context.Context, namespace, job string, g nomadjob.ScaleGrant) error {
	return s.r.put(ctx, escape(namespace, job), g)
}

// Prune deletes the grants of the jobs gone says Nomad no longer has, and a
// key no grant could be under; it returns how many it deleted. A grant whose
// job cannot be looked up stays, for the next time.
func (s *Scales) Prune(ctx context.Context, gone func(ctx context.Context, namespace, job string) (bool, error)) (int, error) {
	names, err := s.r.names(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	var firstErr error
	for name, index := range names {
		if parts, ok := unescape(name, 2); ok {
			if g, err := gone(ctx, parts[0], parts[1]); err != nil || !g {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
		}
		if ok, err := s.r.remove(ctx, name, index); err != nil {
			return deleted, err
		} else if ok {
			deleted++
		}
	}
	return deleted, firstErr
}
