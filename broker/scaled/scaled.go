// Package scaled keeps in Consul KV what the broker admitted when it scaled a
// job (nomad-gpu/scaled/<namespace>/<job>): a scale changes a job's counts but
// not its meta, so its admission stamp alone no longer verifies it.
package scaled

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Store keeps scale grants under <prefix>scaled/.
type Store struct {
	kv     *consul.KV
	prefix string
}

// NewStore returns a store under prefix (e.g. "nomad-gpu/").
func NewStore(kv *consul.KV, prefix string) *Store {
	return &Store{kv: kv, prefix: prefix + "scaled/"}
}

// key escapes namespace and job id: both may hold "/".
func (s *Store) key(namespace, job string) string {
	return s.prefix + url.PathEscape(namespace) + "/" + url.PathEscape(job)
}

// Get returns the grant of a job, if any.
func (s *Store) Get(ctx context.Context, namespace, job string) (nomadjob.ScaleGrant, bool, error) {
	var g nomadjob.ScaleGrant
	p, _, err := s.kv.Get(s.key(namespace, job), (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || p == nil {
		return g, false, err
	}
	if err := json.Unmarshal(p.Value, &g); err != nil {
		return g, false, fmt.Errorf("decode scale grant of %s/%s: %w", namespace, job, err)
	}
	return g, true, nil
}

// Put records a job's grant, replacing the one before.
func (s *Store) Put(ctx context.Context, namespace, job string, g nomadjob.ScaleGrant) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(&consul.KVPair{Key: s.key(namespace, job), Value: b}, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("record scale grant of %s/%s: %w", namespace, job, err)
	}
	return nil
}

// Verifier verifies a job's admission: its stamp as it stands, or as scaled
// through the broker. A job whose grant cannot be read is not verified.
func (s *Store) Verifier(st nomadjob.Stamper) func(context.Context, *api.Job) bool {
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
