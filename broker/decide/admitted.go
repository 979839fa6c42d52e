package decide

import (
	"context"
	"fmt"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Grants reads what the broker recorded when it changed a job without a new
// stamp: scaled, dispatched from a parent, promoted or moved between
// sub-bands (consulkv.Scales).
type Grants interface {
	Get(ctx context.Context, namespace, job string) (nomadjob.ScaleGrant, bool, error)
}

// Stops tells the jobs the broker admitted that Nomad stopped since
// (consulkv.Stops).
type Stops interface {
	Stopped(namespace, job string) (nomadjob.Stopped, bool)
}

// Admitted is whether a job Nomad has is the broker's admission, and by what.
type Admitted struct {
	OK bool
	// Grant is what the admission covers: for a stamp that verifies as the
	// job stands, its own counts (Stamped); else the grant it verifies by.
	Grant   nomadjob.ScaleGrant
	ByGrant bool
	// Borrowed: it runs borrowed as admitted (no longer once promoted).
	Borrowed bool
}

// Check is the one rule for whether job (as Nomad returns it) is the
// broker's admission: its stamp verifies as the job stands, else the grant
// recorded for it (grants nil: none kept) does; and it is not a version
// registered after Nomad stopped the admitted one, unless by the broker
// (stops nil: none kept). A grant that cannot be read is an error, and the
// job is not taken as admitted.
func Check(ctx context.Context, st nomadjob.Stamper, grants Grants, stops Stops, job *api.Job) (Admitted, error) {
	borrowed := job.Meta[nomadjob.MetaBorrowed] == "true"
	if job.ID != nil && stops != nil && job.JobModifyIndex != nil {
		if s, ok := stops.Stopped(nomadjob.Namespace(job), *job.ID); ok && !s.Pending && *job.JobModifyIndex > s.Index {
			return Admitted{}, nil // its stamp replayed after the stop
		}
	}
	if st.Verify(job) {
		return Admitted{OK: true, Grant: nomadjob.ScaleGrant{Stamped: nomadjob.GPUGroupCounts(job)}, Borrowed: borrowed}, nil
	}
	if grants == nil || job.ID == nil {
		return Admitted{}, nil
	}
	g, ok, err := grants.Get(ctx, nomadjob.Namespace(job), *job.ID)
	if err != nil || !ok || !st.VerifyScaled(job, g) {
		return Admitted{}, err
	}
	return Admitted{OK: true, Grant: g, ByGrant: true, Borrowed: borrowed && !g.Promoted(job)}, nil
}

// Verifier is Check as the cluster's observer asks it: admitted, and
// borrowed. A job whose grant cannot be read is not verified.
func Verifier(st nomadjob.Stamper, grants Grants, stops Stops) func(context.Context, *api.Job) (admitted, borrowed bool) {
	return func(ctx context.Context, job *api.Job) (bool, bool) {
		a, _ := Check(ctx, st, grants, stops, job)
		return a.OK, a.Borrowed
	}
}

// StopRecords are the stopped-job records a registration through the
// broker revives a job from.
type StopRecords interface {
	Stops
	Put(ctx context.Context, namespace, job string, s nomadjob.Stopped) error
	Delete(ctx context.Context, namespace, job string) error
}

// Revive readies the registration through the broker of job
// namespace/id, which Nomad may have stopped since the broker admitted it:
// its record is marked pending first (a version Nomad then answers with is
// the broker's), and settle, once Nomad answered, deletes it when Nomad
// took the job, or marks it not pending again. Without a record (or
// records nil) there is nothing to do.
// A settle that fails leaves the record pending: the broker's version, and
// any after it, verify (no admitted work is taken for unadmitted) until the
// job's next stop.
func Revive(ctx context.Context, records StopRecords, namespace, id string) (settle func(taken bool) error, err error) {
	none := func(bool) error { return nil }
	if records == nil {
		return none, nil
	}
	s, ok := records.Stopped(namespace, id)
	if !ok {
		return none, nil
	}
	s.Pending = true
	if err := records.Put(ctx, namespace, id, s); err != nil {
		return nil, fmt.Errorf("mark stopped job %s/%s as registered again: %w", namespace, id, err)
	}
	return func(taken bool) error {
		ctx := context.WithoutCancel(ctx)
		var err error
		if taken {
			err = records.Delete(ctx, namespace, id)
		} else {
			s.Pending = false
			err = records.Put(ctx, namespace, id, s)
		}
		if err != nil {
			return fmt.Errorf("settle the stopped record of %s/%s: %w", namespace, id, err)
		}
		return nil
	}, nil
}
