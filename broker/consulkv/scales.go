package consulkv

import (
	"context"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Scales keeps what the broker admitted when it scaled a job, or dispatched
// a child of one, under <prefix>scaled/<region>/<namespace>/<job>. A scale
// changes a job's counts but not its meta, and a child carries its parent's
// stamp, so the admission stamp alone no longer verifies either. Prune is
// the keys' owner: the leader deletes those of jobs Nomad no longer has.
type Scales struct {
	r records[nomadjob.ScaleGrant]
	b byJob
}

// NewScales returns the grants under prefix (e.g. "nomad-gpu/") of the jobs
// of every region; home is the broker's own.
func NewScales(kv *consul.KV, prefix, home string, aside *Aside) *Scales {
	return &Scales{r: records[nomadjob.ScaleGrant]{kv: kv, dir: prefix + "scaled/", what: "scale grant", kind: "scaled", aside: aside},
		b: byJob{home: home}}
}

// Get returns the grant of a job, if any.
func (s *Scales) Get(ctx context.Context, job nomadjob.Ref) (nomadjob.ScaleGrant, bool, error) {
	for _, name := range s.b.names(job) {
		if g, _, ok, err := s.r.get(ctx, name); ok || err != nil {
			return g, ok, err
		}
	}
	return nomadjob.ScaleGrant{}, false, nil
}

// Put records a job's grant, replacing the one before.
func (s *Scales) Put(ctx context.Context, job nomadjob.Ref, g nomadjob.ScaleGrant) error {
	names := s.b.names(job)
	// A legacy grant would verify the job by an older admission: deleted in
	// the same transaction.
	_, err := s.r.replace(ctx, names[0], g, names[1:])
	return err
}

// Prune deletes the grants of the jobs gone says Nomad no longer has (a
// region "": any region governed), and a key no grant could be under; it
// returns how many it deleted. A grant whose job cannot be looked up stays,
// for the next time.
func (s *Scales) Prune(ctx context.Context, gone func(ctx context.Context, job nomadjob.Ref) (bool, error)) (int, error) {
	return s.r.prune(ctx, s.b.jobGone(ctx, gone), nil)
}
