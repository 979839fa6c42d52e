package consulkv

import (
	"context"
	"fmt"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// byJob names the records kept per job: <region>/<namespace>/<job>. One
// written before records were keyed by region (<namespace>/<job>) is the
// home region's: read, and deleted with it, until its owner prunes it.
type byJob struct{ home string }

func (b byJob) region(r string) string {
	if r == "" || r == api.GlobalRegion {
		return b.home
	}
	return r
}

// names are the name of ref's record, then the one it had before records
// were keyed by region, if any.
func (b byJob) names(ref nomadjob.Ref) []string {
	region := b.region(ref.Region)
	out := []string{escape(region, ref.Namespace, ref.ID)}
	if region == b.home {
		out = append(out, escape(ref.Namespace, ref.ID))
	}
	return out
}

// ref is the job a record's name is of; region "" for a name written
// before records were keyed by region (any region may hold that job).
func (b byJob) ref(name string) (nomadjob.Ref, bool) {
	if parts, ok := unescape(name, 3); ok {
		return nomadjob.Ref{Region: parts[0], Namespace: parts[1], ID: parts[2]}, true
	}
	if parts, ok := unescape(name, 2); ok {
		return nomadjob.Ref{Namespace: parts[0], ID: parts[1]}, true
	}
	return nomadjob.Ref{}, false
}

// jobGone is gone as prune asks it, by a record's name: a name no record
// of a job could have is gone.
func (b byJob) jobGone(ctx context.Context, gone func(ctx context.Context, job nomadjob.Ref) (bool, error)) func(name string) (bool, error) {
	return func(name string) (bool, error) {
		ref, ok := b.ref(name)
		if !ok {
			return true, nil
		}
		return gone(ctx, ref)
	}
}

// JobRecords is one kind of record kept per job (byJob), with a copy every
// broker follows, so that verifying a job costs no round trip.
type JobRecords[T any] struct {
	r records[T]
	m *mirror[T]
	b byJob
}

func newJobRecords[T any](r records[T], home string) *JobRecords[T] {
	return &JobRecords[T]{r: r, m: &mirror[T]{r: r}, b: byJob{home: home}}
}

// Follow keeps the copy current until ctx ends.
func (p *JobRecords[T]) Follow(ctx context.Context) { p.m.follow(ctx) }

// Get is a job's record, if the copy has one.
func (p *JobRecords[T]) Get(job nomadjob.Ref) (T, bool) {
	for _, name := range p.b.names(job) {
		if v, ok := p.m.get(name); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// Put writes a job's record, replacing the one before.
func (p *JobRecords[T]) Put(ctx context.Context, job nomadjob.Ref, v T) error {
	names := p.b.names(job)
	// A legacy record would show again once this one is deleted; one the
	// copy does not have is not deleted (a write of it for nothing).
	legacy := p.kept(names[1:])
	index, err := p.r.replace(ctx, names[0], v, legacy)
	if err != nil {
		return err
	}
	p.m.wrote(names[0], v, index)
	for _, name := range legacy {
		p.m.removed(name)
	}
	return nil
}

// kept are the names the copy has a record under: a delete of one it has
// not is a round trip for nothing. Another broker's write of one shows in
// the copy within a blocking query, and the record's owner prunes it.
func (p *JobRecords[T]) kept(names []string) []string {
	var out []string
	for _, name := range names {
		if _, ok := p.m.get(name); ok {
			out = append(out, name)
		}
	}
	return out
}

// Delete removes a job's record, whatever its version.
func (p *JobRecords[T]) Delete(ctx context.Context, job nomadjob.Ref) error {
	names := p.b.names(job)
	return p.delete(ctx, append(names[:1], p.kept(names[1:])...)...)
}

// delete removes records by name, whatever their version.
func (p *JobRecords[T]) delete(ctx context.Context, names ...string) error {
	for _, name := range names {
		if _, err := p.r.kv.Delete(p.r.dir+name, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
			return fmt.Errorf("delete %s %s: %w", p.r.what, name, err)
		}
		p.m.removed(name)
	}
	return nil
}

// prune deletes the records gone picks; it returns how many.
func (p *JobRecords[T]) prune(ctx context.Context, gone func(name string) (bool, error)) (int, error) {
	return p.r.prune(ctx, gone, p.m.removed)
}
