// Package decide is the one admission sequence around the one decision
// (admission.Decide). A GPU job request is prepared as Nomad will read it,
// enriched with what approvals grant and what a re-borrow backoff holds
// back, decided, and reserved unless it is a preview. The gate (register,
// plan, scale, dispatch, revert), the leader's queue pass, `gpu-broker job
// check` and the simulator all go through it, so a change to the sequence is
// made here once. It also holds the one rule for whether a job Nomad runs is the
// broker's admission (Check).
package decide

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Cluster is what a decision is made against: the nodes a job's groups fit
// on, the usage (and the nodes) as a decision on a job sees them, and the
// decision that reserves at once.
type Cluster interface {
	NodesFitting(model string, gpus int) int
	// FittingNodes are the ids of the nodes NodesFitting counts.
	FittingNodes(model string, gpus int) []string
	// Islanded reports whether some node offers model per NVLink island
	// (nomadjob.Request.MatchIslands).
	Islanded(model string) bool
	// UsageFor is the usage without j's own, with the nodes it may use.
	UsageFor(p *policy.Policy, j admission.Job) admission.Usage
	// Admit decides and, when it admits, reserves the demand at once.
	Admit(p *policy.Policy, j admission.Job) (admission.Decision, *cluster.Reservation)
}

// Regional is a cluster over several Nomad regions (cluster.Regions): a
// request is prepared against its own region's nodes.
type Regional interface {
	// In is the view of region as a request names it and the name
	// admission.Where keys it by; false when the broker does not govern it.
	In(region string) (*cluster.View, string, bool)
}

// in is the cluster of region, and its name as admission keys it.
func (s *Sequence) in(region string) (Cluster, string, error) {
	r, ok := s.Cluster.(Regional)
	if !ok {
		return s.Cluster, region, nil
	}
	v, name, ok := r.In(region)
	if !ok {
		return nil, "", &JobError{fmt.Errorf("region %q is not one this broker governs", region)}
	}
	return v, name, nil
}

// RegionVersions reads the versions of another region's jobs than the
// broker's own.
type RegionVersions interface {
	In(region string) Versions
}

// Versions reads the versions of a job Nomad has: the gate reads them with
// the caller's token, the queue with the broker's.
type Versions interface {
	// Job is the job Nomad runs now; nil (no error) when it has none.
	Job(ctx context.Context, namespace, id string) (*api.Job, error)
	// StableJob is its latest stable version; nil when it has none.
	StableJob(ctx context.Context, namespace, id string) (*api.Job, error)
}

// Mode says whether a decision holds the GPUs it admits.
type Mode int

const (
	// Reserve: a registration or a queue pass; an admission reserves its
	// GPUs before any other decision can see the usage without them.
	Reserve Mode = iota
	// Preview: a plan, a parameterized parent, a policy-parked entry
	// reconsidered, job check; nothing is held.
	Preview
)

// Sequence is the admission sequence against one cluster.
type Sequence struct {
	Cluster Cluster
	enrich.Enricher
}

// Decide decides on j, enriched; with Reserve an admission holds its GPUs in
// the reservation returned (nil otherwise: Release and Confirm are no-ops).
func (s *Sequence) Decide(p *policy.Policy, j admission.Job, mode Mode) (admission.Decision, *cluster.Reservation) {
	if mode == Preview {
		return s.Enricher.Decide(p, j, s.Cluster.UsageFor(p, j)), nil
	}
	return s.Cluster.Admit(p, s.Enrich(p, j))
}

// Request is a job request prepared for its decision: counts and nodes
// pinned as counted, what its workload asks written in, its GPU demand.
type Request struct {
	*nomadjob.Request
	Groups []admission.Group
	// Wrote says what the job's workload wrote into it, for its answer.
	Wrote []string
	// Dispatch says which region the broker chose for a job that left it
	// to the broker, and why ("": it named its region).
	Dispatch string
	// Auto: the job left its region to the broker, which chose it by the
	// regions' usage as they were.
	Auto bool
}

// AdmissionJob is the request as admission decides on it.
func (r *Request) AdmissionJob() admission.Job { return r.Admission(r.Groups) }

// JobError is a request that cannot be admitted as it stands: the gate
// answers it 400, the queue parks it. Any other error of Prepare is a
// lookup that failed (try again).
type JobError struct{ Err error }

func (e *JobError) Error() string { return e.Err.Error() }
func (e *JobError) Unwrap() error { return e.Err }

// IsJobError reports whether err is the job's own.
func IsJobError(err error) bool {
	var je *JobError
	return errors.As(err, &je)
}

// Prepare readies req for its decision, in the one order every caller
// shares. It finds its region's cluster (the broker chooses one, dispatch,
// for a job that leaves its region to the broker) and the version Nomad runs
// there, when counts or canaries depend on it. It reads the nodes a system
// job may run on, the groups as Nomad will place them, and the stable
// version a failing deployment reverts to. Last it pins the namespace,
// region and counts, and writes the job's workload in.
func (s *Sequence) Prepare(ctx context.Context, p *policy.Policy, req *nomadjob.Request, versions Versions) (*Request, error) {
	auto, err := req.AutoRegion()
	if err != nil {
		return nil, &JobError{err}
	}
	auto = auto || req.Region == "" && p.AutoRegionFor(req.Namespace, req.Job.Meta[nomadjob.MetaQueue])
	var dispatched string
	if auto {
		if req.Region, dispatched, err = s.dispatch(p, req); err != nil {
			return nil, err
		}
	}
	c, region, err := s.in(req.Region)
	if err != nil {
		return nil, err
	}
	if auto && dispatched != "" {
		req.Dispatched, req.DispatchID = req.Region, DispatchID(s.Clock.Now())
	}
	req.Region = region
	if rv, ok := versions.(RegionVersions); ok && region != "" {
		versions = rv.In(region)
	}
	var current *api.Job
	if req.PreserveCounts || nomadjob.HasCanaries(req.Job) {
		if current, err = versions.Job(ctx, req.Namespace, req.JobID); err != nil {
			return nil, err
		}
	}
	islands := req.MatchIslands(c.Islanded)
	req.PinNodes(c.FittingNodes)
	groups, err := req.Groups(current, c.NodesFitting)
	if err != nil {
		return nil, &JobError{err}
	}
	if nomadjob.AutoReverts(req.Job) {
		stable, err := versions.StableJob(ctx, req.Namespace, req.JobID)
		if err != nil {
			return nil, err
		}
		if err := req.RevertsTo(stable, c.NodesFitting); err != nil {
			return nil, &JobError{err}
		}
	}
	req.Pin()
	wrote := append(islands, req.ApplyWorkload(p.WorkloadFor(req.Namespace, req.Job.Meta[nomadjob.MetaQueue]))...)
	return &Request{Request: req, Groups: groups, Wrote: wrote, Dispatch: dispatched, Auto: auto}, nil
}

// Existing is a job Nomad has as admission decides on a call that changes
// it without a body (scale, dispatch, revert): its groups as Nomad will
// place them (current: the version it runs, for a revert's canaries).
func (s *Sequence) Existing(job, current *api.Job, namespace string) (admission.Job, error) {
	c, region, err := s.in(deref(job.Region))
	if err != nil {
		return admission.Job{}, err
	}
	groups, err := nomadjob.Groups(job, nomadjob.Placement{Current: current, NodesFitting: c.NodesFitting})
	if err != nil {
		return admission.Job{}, &JobError{err}
	}
	j := nomadjob.AdmissionJob(job, namespace, groups)
	j.Where.Region = region
	return j, nil
}

// DispatchID names a dispatch made at now (meta nomad-gpu.dispatch-id): ids
// sort by time, the random part keeping two made at once apart.
func DispatchID(now time.Time) string {
	return fmt.Sprintf("%016x%08x", now.UnixNano(), rand.Uint32())
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
