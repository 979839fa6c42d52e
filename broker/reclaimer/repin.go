package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// RepinAfter is how long a pinned job may wait unplaced on nodes that
// still take work (Nomad blocked it: another placement took the room)
// before it is pinned again.
const RepinAfter = time.Minute

// Repinner pins again, before they run, the batch jobs the broker placed
// (placement mode broker) that their nodes cannot take: a node gone, down,
// draining or ineligible at once, any other after RepinAfter. Only a task
// group without a live allocation is pinned again: Nomad replaces running
// allocations whose constraints change. The job is registered again with
// its new pin and a new stamp that binds it, at its priority, as admitted.
// It does so in every region governed, each on its own nodes.
type Repinner struct {
	Log      hclog.Logger
	Policies policy.Source
	View     RepinView // the broker's own region
	Jobs     PromoteJobs
	// Elsewhere are the other regions governed, by name (none: one region).
	Elsewhere map[string]RepinRegion
	// Records tell the broker's admissions as they stand.
	Records decide.Records
	// Writes record the versions the repinner makes (nil: none kept).
	Writes  decide.RegistrationRecords
	Stamper nomadjob.Stamper
	// Lock holds off other decisions on the job meanwhile (the gate's too).
	Lock  func(namespace, id string) (unlock func())
	Audit *audit.Log

	waiting map[[3]string]time.Time // since when each unplaced job (region, namespace, id) was seen so
}

// RepinView is what the repinner reads of a region: its pinned jobs not
// placed yet, and its nodes.
type RepinView interface {
	Unplaced() []cluster.Unplaced
	UsageFor(p *policy.Policy, j admission.Job) admission.Usage
	NodesFitting(model string, gpus int) int
}

// RepinRegion is a region other than the broker's own: its view, and its
// Nomad client, through which its jobs are read and registered.
type RepinRegion struct {
	View RepinView
	Jobs PromoteJobs
}

// Observed implements Watcher.
func (r *Repinner) Observed(ctx context.Context, now time.Time, _ []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	p := r.Policies.Current()
	seen := map[[3]string]time.Time{}
	var errs []error
	regions := append([]string{""}, slices.Sorted(maps.Keys(r.Elsewhere))...) // "": the broker's own
	for _, region := range regions {
		in := RepinRegion{View: r.View, Jobs: r.Jobs}
		if region != "" {
			in = r.Elsewhere[region]
		}
		for _, u := range in.View.Unplaced() {
			key := [3]string{region, u.Namespace, u.ID}
			since, ok := r.waiting[key]
			if !ok {
				since = now
			}
			seen[key] = since
			if !u.NodeGone && now.Sub(since) < RepinAfter {
				continue
			}
			if err := r.repin(ctx, p, region, in, u, now); err != nil {
				errs = append(errs, fmt.Errorf("pin %s/%s again%s: %w", u.Namespace, u.ID, inRegion(region), err))
			}
		}
	}
	r.waiting = seen
	return errors.Join(errs...)
}

// inRegion names region in an error ("": the broker's own, unnamed).
func inRegion(region string) string {
	if region == "" {
		return ""
	}
	return " in region " + region
}

// repin places the job again on the nodes of its region (in) as they are
// and registers it there with the new pin, if Nomad still has it as the
// broker admitted it and a node can take it.
func (r *Repinner) repin(ctx context.Context, p *policy.Policy, region string, in RepinRegion, u cluster.Unplaced, now time.Time) error {
	defer r.Lock(u.Namespace, u.ID)()
	doc, job, err := in.Jobs.JobDoc(ctx, u.Namespace, u.ID)
	if err != nil || job == nil || job.Priority == nil || job.JobModifyIndex == nil || (job.Stop != nil && *job.Stop) {
		return err
	}
	a, err := decide.Check(ctx, r.Stamper, r.Records, job)
	if err != nil || !a.OK || a.Grant.Parent != "" {
		// Not the broker's admission as it stands, or a dispatched child
		// (it carries its parent's stamp). A job scaled or moved to a
		// sub-band was admitted as it stands: its new stamp is made for
		// its counts and priority now.
		return err
	}
	req, err := nomadjob.ReadRequest(nomadjob.Register, fmt.Appendf(nil, `{"Job":%s}`, doc.Bytes()), url.Values{"namespace": {u.Namespace}})
	if err != nil {
		return err
	}
	nomadjob.Unpin(req.Job)
	j, err := nomadjob.Admission(req.Job, in.View.NodesFitting)
	if err != nil {
		return err
	}
	d := a.Decision(job)
	var ok bool
	d.Placed, ok = admission.Place(j, in.View.UsageFor(p, j).Nodes, !a.Borrowed, d.Priority, now)
	if !ok {
		return nil // no node can take it now: the next pass tries again
	}
	pinned := req.Admit(d, r.Stamper)
	ref := nomadjob.Ref{Region: region, Namespace: u.Namespace, ID: u.ID}
	if err := register(ctx, in.Jobs, r.Writes, ref, req.Doc.Root().Get("Job").Bytes(), *job.JobModifyIndex, now); err != nil {
		return err
	}
	why := "Nomad has not placed it for " + RepinAfter.String()
	if u.NodeGone {
		why = "a node it was pinned to takes no new work"
	}
	r.Log.Info("pinned job placed again before it runs", "region", region, "namespace", u.Namespace, "job", u.ID, "why", why, "pin", pinned)
	r.Audit.Write(audit.Event{Who: audit.BrokerAct, What: audit.Repin, Namespace: u.Namespace, Job: u.ID, Tenant: d.Tenant, Queue: d.Queue,
		Result: why + inRegion(region) + ": " + strings.TrimPrefix(pinned, "nomad-gpu: ")})
	return nil
}
