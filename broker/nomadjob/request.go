package nomadjob

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// Kind is which job request a body is: Nomad reads each into its own struct.
type Kind int

const (
	Register Kind = iota // PUT /v1/jobs, /v1/job/<id>
	Plan                 // PUT /v1/job/<id>/plan
	Validate             // PUT /v1/validate/job
)

// Request is a job register, plan or validate request read as Nomad reads it.
type Request struct {
	Doc       *jsondoc.Doc
	Job       *api.Job
	JobID     string
	Namespace string // resolved as Nomad resolves it
	Region    string // the region asked for; "" when none (the agent's own)
	// Dispatched is the region the broker chose for a job that leaves it
	// to the broker (AutoRegion), as Nomad names it; Pin writes it.
	Dispatched string
	// DispatchID names this dispatch (MetaDispatchID); Stamp writes it.
	DispatchID string
	// QueuedAt is when the job began to wait in the broker's queue (zero:
	// it does not wait), which an ordered dispatch's spill_after counts from.
	QueuedAt       time.Time
	PreserveCounts bool
	// Token is the ACL token the body carries (SecretID), which Nomad acts
	// on for a register or a plan when no header carries one.
	Token string

	current  *api.Job          // as given to Groups
	revertTo []admission.Group // as given to RevertsTo
}

// ReadRequest reads a job request body with the request's query. It refuses a
// body Nomad could read differently from the broker, a job without an id, and
// a multiregion job.
func ReadRequest(kind Kind, body []byte, query url.Values) (*Request, error) {
	var target any
	switch kind {
	case Plan:
		target = &api.JobPlanRequest{}
	case Validate:
		target = &api.JobValidateRequest{}
	default:
		target = &api.JobRegisterRequest{}
	}
	doc, err := jsondoc.Parse(body, target)
	if err != nil {
		return nil, err
	}
	if !doc.Root().IsObject() || !doc.Root().Get("Job").IsObject() {
		return nil, errors.New(`malformed request: no "Job" object in the body`)
	}
	var (
		job            *api.Job
		w              api.WriteRequest
		preserveCounts bool
	)
	switch t := target.(type) {
	case *api.JobPlanRequest:
		job, w = t.Job, t.WriteRequest
	case *api.JobValidateRequest:
		job, w = t.Job, t.WriteRequest
	case *api.JobRegisterRequest:
		job, w, preserveCounts = t.Job, t.WriteRequest, t.PreserveCounts
	}
	if job.ID == nil && kind != Validate {
		return nil, errors.New("malformed request: the job has no ID")
	}
	if job.Multiregion != nil {
		return nil, errors.New("multiregion jobs are not admitted by nomad-gpu: register the job in each region through that region's broker")
	}
	r := &Request{Doc: doc, Job: job, JobID: deref(job.ID), PreserveCounts: preserveCounts, Token: w.SecretID,
		Namespace: ResolveNamespace(query.Get("namespace"), w.Namespace, deref(job.Namespace)),
		Region:    resolveRegion(query.Get("region"), w.Region, deref(job.Region))}
	return r, nil
}

// Target is where Nomad v1.6 applies a job call other than register, plan
// and validate, and the idempotency token it reads for it.
type Target struct {
	Namespace        string
	Region           string // "" for the agent's own
	IdempotencyToken string
	// AuthToken is the ACL token the body carries, which Nomad acts on when
	// no header carries one.
	AuthToken string
}

// CallTarget reads a call's Target as Nomad does: the query's namespace,
// region and idempotency_token first. Where the query gives none, and Nomad
// decodes the call's body into a request that carries a WriteRequest
// (dispatch, revert, stable, evaluate and the deployment writes:
// bodyCounts), it reads the body's Namespace, Region, IdempotencyToken and
// AuthToken, as encoding/json reads them. Else it is the default namespace
// and the agent's own region.
func CallTarget(query url.Values, body []byte, bodyCounts bool) (Target, error) {
	var w Target
	if bodyCounts && len(bytes.TrimSpace(body)) > 0 {
		if _, err := jsondoc.Parse(body, &w); err != nil {
			return Target{}, err
		}
	}
	for _, f := range []struct {
		field *string
		param string
	}{{&w.Region, "region"}, {&w.IdempotencyToken, "idempotency_token"}} {
		if q := query.Get(f.param); q != "" {
			*f.field = q
		}
	}
	w.Namespace = ResolveNamespace(query.Get("namespace"), w.Namespace, "")
	return w, nil
}

// ResolveNamespace is Nomad v1.6's order for a job request: the namespace
// query parameter, then the request body's Namespace, then the job's own.
func ResolveNamespace(query, body, job string) string {
	for _, ns := range []string{query, body, job} {
		if ns != "" {
			return ns
		}
	}
	return DefaultNamespace
}

// resolveRegion is Nomad v1.6's order: the query parameter, overridden by the
// body's Region, else the job's; "global" means the agent's own ("").
func resolveRegion(query, body, job string) string {
	r := query
	if body != "" {
		r = body
	}
	if r == "" {
		r = job
	}
	if r == api.GlobalRegion {
		return ""
	}
	return r
}

// AutoRegion reports whether the job leaves its region to the broker (meta
// nomad-gpu.region = "auto"), or an error for another value of that key.
func (r *Request) AutoRegion() (bool, error) {
	v, ok := r.Job.Meta[MetaRegion]
	switch {
	case !ok:
		return false, nil
	case v == RegionAuto:
		return true, nil
	}
	return false, fmt.Errorf("meta %s = %q: its one value is %q (the broker chooses the region); to name a region, set the job's region", MetaRegion, v, RegionAuto)
}

// AsksForGPUs reports whether the job asks for any GPU, as it stands and
// before anything is looked up: a job that does not is no admission's.
func (r *Request) AsksForGPUs() (bool, error) {
	groups, err := Groups(r.Job, Placement{PreserveCounts: r.PreserveCounts})
	return len(groups) > 0, err
}

// Groups is the request's GPU demand as Nomad will place it, given the job's
// current version (nil if none) and the nodes system jobs would run on.
func (r *Request) Groups(current *api.Job, nodesFitting func(string, int) int) ([]admission.Group, error) {
	r.current = current
	return Groups(r.Job, Placement{Current: current, PreserveCounts: r.PreserveCounts, NodesFitting: nodesFitting})
}

// RevertsTo records the version Nomad reverts the job to if the deployment
// this request starts fails (the latest stable one, nil if none): admission
// counts the larger of the two. Call it for a job that AutoReverts.
func (r *Request) RevertsTo(stable *api.Job, nodesFitting func(string, int) int) error {
	if stable == nil {
		return nil
	}
	groups, err := Groups(stable, Placement{NodesFitting: nodesFitting})
	if err != nil {
		return fmt.Errorf("its stable version %d, which Nomad reverts to if the deployment fails: %w", deref(stable.Version), err)
	}
	r.revertTo = groups
	return nil
}

// Admission is the request as admission sees it.
func (r *Request) Admission(groups []admission.Group) admission.Job {
	j := AdmissionJob(r.Job, r.Namespace, groups)
	j.ID, j.RevertTo, j.Where.Region = r.JobID, r.revertTo, r.Region
	return j
}

// Pin writes into the document what Nomad must read exactly as the broker
// did (after Groups): the resolved namespace, in the body and the job, and
// the region when it is not the broker's own. Every task group's count is
// made explicit, so that neither a scaling default nor PreserveCounts can
// place more than was counted.
func (r *Request) Pin() {
	root := r.Doc.Root()
	job := root.Get("Job")
	root.Set("Namespace", r.Namespace)
	job.Set("Namespace", r.Namespace)
	switch {
	case r.Dispatched != "":
		// The body's region overrides the query's (Nomad's regionForJob):
		// the registration goes where the broker chose, whatever the
		// caller's -region. The job says it is auto (its queue's region may
		// have made it so), so that a queued copy, which now names a region,
		// is dispatched again.
		root.Set("Region", r.Dispatched)
		job.Set("Region", r.Dispatched)
		r.Job.Region = &r.Dispatched
		job.Object("Meta").Set(MetaRegion, RegionAuto)
		if r.Job.Meta == nil {
			r.Job.Meta = map[string]string{}
		}
		r.Job.Meta[MetaRegion] = RegionAuto
	case r.Region != "":
		// Another region than the broker's own: the job itself names it,
		// so that a queued copy registered later goes there too.
		job.Set("Region", r.Region)
		r.Job.Region = &r.Region
	}
	if root.Get("PreserveCounts") != nil {
		root.Set("PreserveCounts", false)
	}
	nodes := job.Get("TaskGroups").Elems()
	for i, tg := range r.Job.TaskGroups {
		if tg == nil || i >= len(nodes) || !nodes[i].IsObject() {
			continue
		}
		count, err := groupCount(tg)
		if cur := currentGroup(r.current, deref(tg.Name)); r.PreserveCounts && cur != nil && cur.Count != nil {
			count, err = *cur.Count, nil
		}
		if err == nil {
			nodes[i].Set("Count", count)
			tg.Count = &count
		}
	}
}

// Admit writes decision d into the request as Nomad must run it: the nodes
// admission placed it on first (PinTo), then its priority and meta with the
// stamp st makes, which binds those pins. It says what it pinned, for the
// answer.
func (r *Request) Admit(d admission.Decision, st Stamper) string {
	pinned := r.PinTo(d.Placed)
	r.Stamp(d, st.Stamp(r.Namespace, r.Job, d))
	return pinned
}

// Stamp writes an admission into the document: the priority, and the broker's
// meta keys in place of any the caller wrote, whatever their spelling, with
// the region the broker chose (Dispatched). The caller's nomad-gpu.ttl and
// nomad-gpu.region (exactly so spelt: what admission read) stay.
func (r *Request) Stamp(d admission.Decision, stamp string) {
	job := r.Doc.Root().Get("Job")
	job.Set("Priority", d.Priority)
	meta := job.Object("Meta")
	meta.Delete(func(k string) bool { return IsBrokerMeta(k) && k != MetaTTL && k != MetaRegion })
	for k, v := range BrokerMeta(d, stamp) {
		meta.Set(k, v)
	}
	if r.Dispatched != "" {
		meta.Set(MetaDispatched, r.Dispatched)
		meta.Set(MetaDispatchID, r.DispatchID)
	}
}

// IsBrokerMeta reports whether a meta key is in the broker's nomad-gpu.
// namespace, in any spelling.
func IsBrokerMeta(key string) bool {
	return strings.HasPrefix(strings.ToLower(key), "nomad-gpu.")
}

// Body is the request to forward.
func (r *Request) Body() []byte { return r.Doc.Bytes() }
