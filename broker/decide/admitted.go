package decide

import (
	"context"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Grants reads what the broker recorded when it changed a job without a new
// stamp: scaled, dispatched from a parent, promoted or moved between
// sub-bands (consulkv.Scales).
type Grants interface {
	Get(ctx context.Context, namespace, job string) (nomadjob.ScaleGrant, bool, error)
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
// recorded for it (grants nil: none kept) does. A grant that cannot be read
// is an error, and the job is not taken as admitted.
func Check(ctx context.Context, st nomadjob.Stamper, grants Grants, job *api.Job) (Admitted, error) {
	borrowed := job.Meta[nomadjob.MetaBorrowed] == "true"
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
func Verifier(st nomadjob.Stamper, grants Grants) func(context.Context, *api.Job) (admitted, borrowed bool) {
	return func(ctx context.Context, job *api.Job) (bool, bool) {
		a, _ := Check(ctx, st, grants, job)
		return a.OK, a.Borrowed
	}
}
