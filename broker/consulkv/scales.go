package consulkv

import (
	"context"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Scales keeps what the broker admitted when it scaled a job, under
// <prefix>scaled/<namespace>/<job>: a scale changes a job's counts but not its
// meta, so its admission stamp alone no longer verifies it.
type Scales struct{ r records[nomadjob.ScaleGrant] }

// NewScales returns the grants under prefix (e.g. "nomad-gpu/").
func NewScales(kv *consul.KV, prefix string) *Scales {
	return &Scales{records[nomadjob.ScaleGrant]{kv: kv, dir: prefix + "scaled/", what: "scale grant"}}
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

// Verifier verifies a job's admission: its stamp as it stands, or as scaled
// through the broker. A job whose grant cannot be read is not verified.
func (s *Scales) Verifier(st nomadjob.Stamper) func(context.Context, *api.Job) bool {
	return func(ctx context.Context, job *api.Job) bool {
		if st.Verify(job) {
			return true
		}
		if job.ID == nil {
			return false
		}
		g, ok, err := s.Get(ctx, nomadjob.Namespace(job), *job.ID)
		return err == nil && ok && st.VerifyScaled(job, g)
	}
}
