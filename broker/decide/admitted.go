package decide

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Grants reads what the broker recorded when it changed a job without a new
// stamp: scaled, dispatched from a parent, promoted or moved between
// sub-bands (consulkv.Scales).
type Grants interface {
	Get(ctx context.Context, job nomadjob.Ref) (nomadjob.ScaleGrant, bool, error)
}

// GrantRecords are Grants the broker writes.
type GrantRecords interface {
	Grants
	Put(ctx context.Context, job nomadjob.Ref, g nomadjob.ScaleGrant) error
}

// Stops tells the jobs the broker admitted that Nomad stopped since
// (consulkv.Stops).
type Stops interface {
	Get(job nomadjob.Ref) (nomadjob.Stopped, bool)
}

// Registrations tells the JobModifyIndex of the broker's own last write of
// each job it admitted (consulkv.Registrations).
type Registrations interface {
	Get(job nomadjob.Ref) (nomadjob.Registered, bool)
}

// Records are what the broker keeps of the jobs it admitted besides their
// stamps; each may be nil (none kept).
type Records struct {
	Grants        Grants
	Stops         Stops
	Registrations Registrations
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

// Decision is the decision the broker made on job, as Check verified it:
// its tenant, queue, workload and priority as the job stands (stamped, or
// granted since by a scale or a sub-band move), borrowed or not. What
// changes a job's nodes alone (a re-pin) stamps this decision again: the
// job is not decided a second time on a cluster that moved on since.
func (a Admitted) Decision(job *api.Job) admission.Decision {
	d := admission.Decision{Outcome: admission.Admit, Tenant: job.Meta[nomadjob.MetaTenant], Queue: job.Meta[nomadjob.MetaQueue],
		Workload: job.Meta[nomadjob.MetaWorkload]}
	if job.Priority != nil {
		d.Priority = *job.Priority
	}
	if a.Borrowed {
		d.Outcome = admission.AdmitBorrowed
	}
	return d
}

// Check is the one rule for whether job (as Nomad returns it) is the
// broker's admission. It must be the version the broker last wrote, or the
// one Nomad stopped since, by its JobModifyIndex against records of the
// job's own region (two regions' indexes do not compare). And its stamp must
// verify as the job stands, else the grant recorded for it. A version made
// past the broker (registered again after a stop, reverted, scaled, or
// made current again by marking an old version stable, straight in Nomad)
// is not its admission, whatever stamp it carries. A grant that cannot be
// read is an error, and the job is not taken as admitted.
func Check(ctx context.Context, st nomadjob.Stamper, rec Records, job *api.Job) (Admitted, error) {
	borrowed := job.Meta[nomadjob.MetaBorrowed] == "true"
	if job.ID == nil {
		return Admitted{}, nil
	}
	ref := nomadjob.RefOf(job)
	if !written(rec, ref, job) {
		return Admitted{}, nil
	}
	if st.Verify(job) {
		return Admitted{OK: true, Grant: nomadjob.ScaleGrant{Stamped: nomadjob.GPUGroupCounts(job)}, Borrowed: borrowed}, nil
	}
	if rec.Grants == nil {
		return Admitted{}, nil
	}
	g, ok, err := rec.Grants.Get(ctx, ref)
	if err != nil || !ok || !st.VerifyScaled(job, g) {
		return Admitted{}, err
	}
	return Admitted{OK: true, Grant: g, ByGrant: true, Borrowed: borrowed && !g.Promoted(job)}, nil
}

// written reports whether the version of job that Nomad runs is one the
// broker's records allow. After a stop, only the stopped version itself
// (its allocations stopping) is, until the broker registers the job again.
// Else the broker's last write is (from it on, while one is in flight).
func written(rec Records, ref nomadjob.Ref, job *api.Job) bool {
	if job.JobModifyIndex == nil {
		return true
	}
	at := *job.JobModifyIndex
	if rec.Stops != nil {
		if s, ok := rec.Stops.Get(ref); ok && !s.Pending {
			return at == s.Index
		}
	}
	if rec.Registrations != nil && (job.Stop == nil || !*job.Stop) {
		if r, ok := rec.Registrations.Get(ref); ok {
			return at == r.Index || (r.Pending && at > r.Index)
		}
	}
	return true
}

// Verifier is Check as the cluster's observer asks it: admitted, and
// borrowed. A job whose grant cannot be read is not verified.
func Verifier(st nomadjob.Stamper, rec Records) func(context.Context, *api.Job) (admitted, borrowed bool) {
	return func(ctx context.Context, job *api.Job) (bool, bool) {
		a, _ := Check(ctx, st, rec, job)
		return a.OK, a.Borrowed
	}
}

// StopRecords are the stopped-job records a registration through the
// broker revives a job from.
type StopRecords interface {
	Stops
	Put(ctx context.Context, job nomadjob.Ref, s nomadjob.Stopped) error
	Delete(ctx context.Context, job nomadjob.Ref) error
}

// Revive readies the registration through the broker of job, which Nomad
// may have stopped since the broker admitted it. Its record is marked
// pending first, so that a version Nomad then answers with is the broker's.
// Once Nomad answered, settle deletes it when Nomad took the job, or marks
// it not pending again. Without a record (or records nil) there is nothing
// to do.
// A settle that fails leaves the record pending: the broker's version, and
// any after it, verify (no admitted work is taken for unadmitted) until the
// job's next stop.
func Revive(ctx context.Context, records StopRecords, job nomadjob.Ref) (settle func(taken bool) error, err error) {
	none := func(bool) error { return nil }
	if records == nil {
		return none, nil
	}
	s, ok := records.Get(job)
	if !ok {
		return none, nil
	}
	s.Pending = true
	if err := records.Put(ctx, job, s); err != nil {
		return nil, fmt.Errorf("mark stopped job %s/%s as registered again: %w", job.Namespace, job.ID, err)
	}
	return func(taken bool) error {
		ctx := context.WithoutCancel(ctx)
		var err error
		if taken {
			err = records.Delete(ctx, job)
		} else {
			s.Pending = false
			err = records.Put(ctx, job, s)
		}
		if err != nil {
			return fmt.Errorf("settle the stopped record of %s/%s: %w", job.Namespace, job.ID, err)
		}
		return nil
	}, nil
}

// RegistrationRecords are the records of the broker's own writes of jobs.
type RegistrationRecords interface {
	Registrations
	Put(ctx context.Context, job nomadjob.Ref, r nomadjob.Registered) error
}

// Rewrite readies a write through the broker that makes a new version of
// job (a registration, a revert, a scale). Its record, if it has one, is
// marked pending first, so that the version Nomad makes verifies from the
// first moment. Once Nomad answered, settle records the JobModifyIndex Nomad
// made it at, or, with 0 (Nomad did not take it), puts the record back as
// it was.
// records nil: none kept. A settle that fails leaves the record pending:
// the broker's version, and any after it, verify until the next write.
func Rewrite(ctx context.Context, records RegistrationRecords, job nomadjob.Ref, now time.Time) (settle func(index uint64) error, err error) {
	if records == nil {
		return func(uint64) error { return nil }, nil
	}
	before, had := records.Get(job)
	// Without a record the stamp alone decides (Check), so the version
	// Nomad makes verifies meanwhile: nothing to mark pending.
	if had {
		pending := before
		pending.Pending, pending.At = true, now.UTC()
		if err := records.Put(ctx, job, pending); err != nil {
			return nil, fmt.Errorf("record the write of %s/%s: %w", job.Namespace, job.ID, err)
		}
	}
	return func(index uint64) error {
		ctx := context.WithoutCancel(ctx)
		var err error
		switch {
		case index != 0:
			err = records.Put(ctx, job, nomadjob.Registered{Index: index, At: now.UTC()})
		case had:
			err = records.Put(ctx, job, before)
		}
		if err != nil {
			return fmt.Errorf("settle the write record of %s/%s: %w", job.Namespace, job.ID, err)
		}
		return nil
	}, nil
}

// Registering readies a registration of job through the broker (a revert
// is one): Revive and Rewrite, settled together with the JobModifyIndex
// Nomad took it at (0: not taken).
func Registering(ctx context.Context, stops StopRecords, writes RegistrationRecords, job nomadjob.Ref, now time.Time) (settle func(index uint64) error, err error) {
	revived, err := Revive(ctx, stops, job)
	if err != nil {
		return nil, err
	}
	rewritten, err := Rewrite(ctx, writes, job, now)
	if err != nil {
		return nil, errors.Join(err, revived(false))
	}
	return func(index uint64) error { return errors.Join(revived(index != 0), rewritten(index)) }, nil
}
