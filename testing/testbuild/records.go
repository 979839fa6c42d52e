package testbuild

import (
	"context"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// JobRecords are records of jobs in memory, by job: consulkv.JobRecords.
type JobRecords[T any] map[nomadjob.Ref]T

func (m JobRecords[T]) Get(job nomadjob.Ref) (T, bool) { r, ok := m[job]; return r, ok }
func (m JobRecords[T]) Put(_ context.Context, job nomadjob.Ref, r T) error {
	m[job] = r
	return nil
}
func (m JobRecords[T]) Delete(_ context.Context, job nomadjob.Ref) error { delete(m, job); return nil }

// Stops are stopped-job records (consulkv.Stops); Writes records of the
// broker's writes (consulkv.Registrations).
type (
	Stops  = JobRecords[nomadjob.Stopped]
	Writes = JobRecords[nomadjob.Registered]
)

// Grants are scale grants in memory (consulkv.Scales), by job; Err, if
// set, is every read's answer.
type Grants struct {
	G   map[nomadjob.Ref]nomadjob.ScaleGrant
	Err error
}

func (g *Grants) Get(_ context.Context, job nomadjob.Ref) (nomadjob.ScaleGrant, bool, error) {
	v, ok := g.G[job]
	return v, ok, g.Err
}
func (g *Grants) Put(_ context.Context, job nomadjob.Ref, v nomadjob.ScaleGrant) error {
	if g.G == nil {
		g.G = map[nomadjob.Ref]nomadjob.ScaleGrant{}
	}
	g.G[job] = v
	return nil
}

// Ref is job namespace/id in the broker's own region.
func Ref(namespace, id string) nomadjob.Ref { return nomadjob.Ref{Namespace: namespace, ID: id} }
