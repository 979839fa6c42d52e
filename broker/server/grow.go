package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// Scale, dispatch, periodic force and revert change GPU demand without a job
// body. They cannot wait in the queue (Nomad answers them at once), so what
// admission would not admit now is refused with the reason, and the user may
// try again later. The broker reads the job they act on with the caller's
// token; when it cannot, it refuses (fails closed) with the reason. Each acts
// in the namespace and region Nomad applies it to (readJobCall).

// jobCall is a job call's body and the namespace and region Nomad applies it to.
type jobCall struct {
	body              []byte
	namespace, region string
	idempotencyToken  string
}

// readJobCall reads the body of a job call other than register, plan and
// validate, and where Nomad applies it (nomadjob.CallTarget).
func (s *Server) readJobCall(w http.ResponseWriter, r *http.Request, c call) (jobCall, error) {
	body, err := s.readBody(w, r)
	if err != nil {
		return jobCall{}, err
	}
	// Nomad rebuilds a scale's request, and reads no body for a stop or a
	// periodic force: only the query counts for those.
	bodyCounts := r.Method != http.MethodDelete && (c == callDispatch || c == callRevert || c == callStable || c == callEvaluate || c == callJobWrite || c == callDeploymentWrite)
	t, err := nomadjob.CallTarget(r.URL.Query(), body, bodyCounts)
	if err != nil {
		return jobCall{}, front.Fail(front.ErrBadRequest, "%s: %v", c, err)
	}
	front.BodyToken(r, t.AuthToken)
	bodyRegion(r, t.Region)
	return jobCall{body: body, namespace: t.Namespace, region: t.Region, idempotencyToken: t.IdempotencyToken}, nil
}

// bodyRegion puts the region a job call's body names into its query when
// the query names none. Nomad acts in that region (parseRegion keeps a
// body's region unless the query has one), so the broker reads and decides
// on the job there, and forwards the call naming it.
func bodyRegion(r *http.Request, region string) {
	q := r.URL.Query()
	if region == "" || q.Get("region") != "" {
		return
	}
	q.Set("region", region)
	r.URL.RawQuery = q.Encode()
}

func (s *Server) scale(w http.ResponseWriter, r *http.Request, jc jobCall, jobID string) error {
	var req api.ScalingRequest
	doc, err := s.parseCall(r, jc, &req)
	if err != nil {
		return err
	}
	if req.Count == nil {
		s.passThrough(w, r, doc.Bytes()) // a scaling event without a count changes nothing
		return nil
	}
	ns := jc.namespace
	defer s.cluster.LockJob(ns, jobID)()
	job, err := s.callers.As(r).CurrentJob(ns, jobID)
	if err != nil {
		return lookupFailed(err, "scale", jobID)
	}
	group := req.Target["Group"]
	if *req.Count < 0 || *req.Count > nomadjob.MaxGroupCount {
		return front.Fail(front.ErrBadRequest, "scale of %q: count %d is out of range 0..%d", jobID, *req.Count, nomadjob.MaxGroupCount)
	}
	before, admittedBefore := s.stampedGrant(r, job)
	counts := nomadjob.GPUGroupCounts(job) // as Nomad runs it now
	up := false
	for _, tg := range job.TaskGroups {
		if tg != nil && tg.Name != nil && *tg.Name == group {
			n := int(*req.Count)
			up = tg.Count == nil || n > *tg.Count
			tg.Count = &n
		}
	}
	ref := nomadjob.Ref{Region: jc.region, Namespace: ns, ID: jobID}
	rec := s.rewritten(r, ref, false)
	if admittedBefore && s.scales != nil {
		// The stamp covers counts: record what is admitted now, before Nomad
		// has it, so that the job stays verifiable. When Nomad does not take
		// the scale (an active deployment blocks it), the grant goes back to
		// the counts Nomad still runs, so the job stays verifiable as it is.
		grant := before // what else it says (a promotion, a sub-band) still holds
		grant.Stamp, grant.Admitted = job.Meta[nomadjob.MetaAdmission], nomadjob.GPUGroupCounts(job)
		undo := grant
		undo.Admitted = counts
		rec = rec.and(&record{
			before: func() error { return s.scales.Put(r.Context(), ref, grant) },
			refused: func() {
				if err := s.scales.Put(context.WithoutCancel(r.Context()), ref, undo); err != nil {
					s.log.Error("scale refused by Nomad: its grant could not be restored; the reclaim rule unadmitted may see the job so",
						"job", jobID, "namespace", ns, "error", err)
				}
			}})
	}
	if up && admittedBefore {
		// Timed from Nomad taking it to the first new allocation running.
		rec = rec.and(&record{accepted: func(uint64) {
			s.metrics.ScaledUp(ns, jobID, job.Meta[nomadjob.MetaTenant], job.Meta[nomadjob.MetaQueue], s.clock.Now())
		}})
	}
	// Scaling changes no spec: Nomad places no canaries for it. The job
	// keeps the priority it runs at: for one moved to a sub-band, it was
	// admitted at the band's base its stamp was made for.
	priority := derefInt(job.Priority)
	if before.SubBand && before.StampedPriority != 0 {
		priority = before.StampedPriority
	}
	_, err = s.checkThenForward(w, r, doc.Bytes(), job, nil, priority, ns, jobID, "scale", rec)
	return err
}

// record is what the broker records of a call it admitted. It records
// before Nomad has the call, so that what Nomad runs is verifiable from the
// first moment, and once Nomad answered: accepted (with the JobModifyIndex
// it answered with) or refused (any answer but 200, or none). Each part may
// be nil.
type record struct {
	before   func() error
	accepted func(index uint64)
	refused  func()
}

// and is rec, then next: next is not readied when rec could not be.
func (rec *record) and(next *record) *record {
	return &record{
		before: func() error {
			if err := rec.run(); err != nil {
				return err
			}
			if err := next.run(); err != nil {
				rec.settle(false, 0)
				return err
			}
			return nil
		},
		accepted: func(index uint64) { rec.settle(true, index); next.settle(true, index) },
		refused:  func() { rec.settle(false, 0); next.settle(false, 0) },
	}
}

// run readies rec (nil: nothing to ready).
func (rec *record) run() error {
	if rec == nil || rec.before == nil {
		return nil
	}
	return rec.before()
}

// revived is the record of an evaluation of job ref, which may run the job
// again as a registration does. Its stopped record, if any, is revived like
// a registration's (decide.Revive), so that the broker's own admission is
// not read as unadmitted afterwards. It makes no new version.
func (s *Server) revived(r *http.Request, ref nomadjob.Ref) *record {
	var settle func(taken bool) error
	return &record{
		before: func() (err error) {
			settle, err = decide.Revive(r.Context(), s.stops, ref)
			return err
		},
		accepted: func(uint64) { s.settled(settle(true)) },
		refused:  func() { s.settled(settle(false)) },
	}
}

// rewritten is the record of a call that makes a new version of job ref: a
// scale, or with registers a revert, which registers a version again as a
// registration does (decide.Registering).
func (s *Server) rewritten(r *http.Request, ref nomadjob.Ref, registers bool) *record {
	var settle func(index uint64) error
	return &record{
		before: func() (err error) {
			if registers {
				settle, err = decide.Registering(r.Context(), s.stops, s.writes, ref, s.clock.Now())
			} else {
				settle, err = decide.Rewrite(r.Context(), s.writes, ref, s.clock.Now())
			}
			return err
		},
		accepted: func(index uint64) { s.settled(settle(index)) },
		refused:  func() { s.settled(settle(0)) },
	}
}

// settle runs the part of rec (nil: none) for Nomad's answer.
func (rec *record) settle(accepted bool, index uint64) {
	switch {
	case rec == nil:
	case accepted && rec.accepted != nil:
		rec.accepted(index)
	case !accepted && rec.refused != nil:
		rec.refused()
	}
}

// stampedGrant is what a job's admission covers (decide.Check), and
// whether it is the broker's admission at all.
func (s *Server) stampedGrant(r *http.Request, job *api.Job) (nomadjob.ScaleGrant, bool) {
	a, _ := decide.Check(r.Context(), s.stamper, decide.Records{Grants: s.scales, Stops: s.stops, Registrations: s.writes}, job)
	return a.Grant, a.OK
}

// spawn gates dispatch and periodic force: each registers a new child job
// with the parent's task groups.
func (s *Server) spawn(w http.ResponseWriter, r *http.Request, c call, jc jobCall, jobID string) error {
	body := jc.body
	if c == callDispatch {
		var req api.JobDispatchRequest
		doc, err := s.parseCall(r, jc, &req)
		if err != nil {
			return err
		}
		if req.JobID != "" && req.JobID != jobID {
			return front.Fail(front.ErrBadRequest, "the job ID %q in the body does not match %q in the path", req.JobID, jobID)
		}
		body = doc.Bytes()
	} else if err := s.checkRegion(r, jc.region, jobID, body); err != nil {
		return err
	}
	ns := jc.namespace
	parent, err := s.callers.As(r).CurrentJob(ns, jobID)
	if err != nil {
		return lookupFailed(err, c.String(), jobID)
	}
	if c == callDispatch && jc.idempotencyToken != "" {
		child, err := s.dispatchedWith(r, ns, jobID, jc.idempotencyToken)
		if err != nil {
			return lookupFailed(err, "dispatch", jobID)
		}
		if child != "" {
			// Nomad answers a retry with the child it made: nothing new runs.
			s.log.Info("dispatch: a retry of one already made, passed through", "job", jobID, "namespace", ns, "child", child)
			s.passThrough(w, r, body)
			return nil
		}
	}
	child := *parent
	child.ID = new(string)
	*child.ID = jobID + "/" + c.String() + "-" + s.newID() // its own key: nothing of it is counted yet
	// As Nomad launches it: a run of its own, not periodic.
	child.Periodic = nil
	id, err := s.checkThenForward(w, r, body, &child, nil, derefInt(child.Priority), ns, jobID, c.String(), nil)
	if id != "" && c == callDispatch {
		s.recordChild(r, nomadjob.Ref{Region: jc.region, Namespace: ns, ID: id}, jobID, parent)
	}
	return err
}

// dispatchedWith is the child of parent that Nomad still has and that was
// dispatched with idempotency token, or "": Nomad answers a dispatch with
// that token with it, creating nothing. Read with the caller's token.
func (s *Server) dispatchedWith(r *http.Request, ns, parent, token string) (string, error) {
	var stubs []api.JobListStub
	if err := s.callers.As(r).Get("/v1/jobs?prefix="+url.QueryEscape(parent+"/dispatch-"), ns, &stubs); err != nil {
		return "", err
	}
	for _, stub := range stubs {
		if stub.ParentID != parent {
			continue
		}
		child, err := s.callers.As(r).CurrentJob(ns, stub.ID)
		if errors.Is(err, front.ErrNoJob) {
			continue // collected meanwhile
		}
		if err != nil {
			return "", err
		}
		if derefString(child.DispatchIdempotencyToken) == token {
			return stub.ID, nil
		}
	}
	return "", nil
}

// recordChild records a child dispatched through the broker as admitted:
// it carries its parent's stamp, which was made for the parent's id, so the
// stamp alone would not verify it (and a child dispatched straight in Nomad
// must not verify). Nomad has the child already: a record that cannot be
// written is logged, and the reclaim rule unadmitted will see the child so.
func (s *Server) recordChild(r *http.Request, child nomadjob.Ref, parentID string, parent *api.Job) {
	before, admitted := s.stampedGrant(r, parent)
	if !admitted || s.scales == nil {
		return
	}
	g := nomadjob.ScaleGrant{Stamp: parent.Meta[nomadjob.MetaAdmission], Stamped: before.Stamped, Admitted: nomadjob.GPUGroupCounts(parent), Parent: parentID}
	if err := s.scales.Put(r.Context(), child, g); err != nil {
		s.log.Error("dispatch: the child's admission is not recorded; the reclaim rule unadmitted will count it as unadmitted",
			"job", child.ID, "namespace", child.Namespace, "error", err)
	}
}

func (s *Server) revert(w http.ResponseWriter, r *http.Request, jc jobCall, jobID string) error {
	var req api.JobRevertRequest
	doc, err := s.parseJobCall(r, jc, &req, jobID, func() string { return req.JobID })
	if err != nil {
		return err
	}
	return s.revertTo(w, r, doc.Bytes(), nomadjob.Ref{Region: jc.region, Namespace: jc.namespace, ID: jobID}, "revert", func(v *api.Job) bool {
		return *v.Version == req.JobVersion
	}) // no such version: Nomad says so
}

// revertTo decides a call that makes Nomad register an earlier version of
// job ref again (the newest that target picks) as an update of the one it
// runs, then forwards body; with no such version it passes body on.
func (s *Server) revertTo(w http.ResponseWriter, r *http.Request, body []byte, ref nomadjob.Ref, what string, target func(*api.Job) bool) error {
	ns, jobID := ref.Namespace, ref.ID
	defer s.cluster.LockJob(ns, jobID)()
	current, err := s.callers.As(r).CurrentJob(ns, jobID)
	if err != nil {
		return lookupFailed(err, what, jobID)
	}
	versions, err := s.callers.As(r).Versions(ns, jobID)
	if err != nil {
		return lookupFailed(err, what, jobID)
	}
	for _, v := range versions {
		if v == nil || v.Version == nil || !target(v) {
			continue
		}
		_, err := s.checkThenForward(w, r, body, v, current, derefInt(v.Priority), ns, jobID, "revert", s.rewritten(r, ref, true))
		return err
	}
	s.passThrough(w, r, body)
	return nil
}

// stable marks a job version stable or not. Nomad writes the version named
// back as the job's current one (with no evaluation and no event). On any
// version but the current one that is a revert the broker cannot follow, so
// it is refused, naming the revert that does the same in the open.
// Un-marking during a deployment that auto-reverts would leave that
// deployment nothing to revert to: refused too. Otherwise it changes no GPU demand.
func (s *Server) stable(w http.ResponseWriter, r *http.Request, jc jobCall, jobID string) error {
	var req api.JobStabilityRequest
	doc, err := s.parseJobCall(r, jc, &req, jobID, func() string { return req.JobID })
	if err != nil {
		return err
	}
	defer s.cluster.LockJob(jc.namespace, jobID)()
	current, err := s.callers.As(r).CurrentJob(jc.namespace, jobID)
	if err != nil {
		return lookupFailed(err, "stable", jobID)
	}
	if current.Version != nil && *current.Version != req.JobVersion {
		return front.Fail(front.ErrForbidden, "marking version %d of %q stable or not refused: Nomad would make that version the job's "+
			"current one again, past admission (the job is at version %d); revert to it instead (nomad job revert %s %d), which the broker decides",
			req.JobVersion, jobID, *current.Version, jobID, req.JobVersion)
	}
	if !req.Stable {
		var d api.Deployment // Nomad answers null for none
		if err := s.callers.As(r).Get("/v1/job/"+url.PathEscape(jobID)+"/deployment", jc.namespace, &d); err != nil {
			return lookupFailed(err, "stable", jobID)
		}
		if autoReverts(&d) && activeDeployment(d.Status) {
			return front.Fail(front.ErrForbidden, "un-marking version %d of %q refused: its deployment %s reverts on failure, "+
				"and Nomad would have no stable version to revert to; wait until the deployment ends", req.JobVersion, jobID, d.ID)
		}
	}
	s.passThrough(w, r, doc.Bytes())
	return nil
}

// evaluate decides an evaluation of a job on what Nomad may place after it
// (Job.Evaluate in v1.6.3's nomad/job_endpoint.go). The evaluation is a
// registration's, which places whatever the job's count misses, and with
// ForceReschedule every failed allocation is replaced. So one of a dead job
// (its allocations failed or ended: charged nothing), or one that forces
// rescheduling, is decided on the job's whole demand, as a revert to the
// version Nomad has is. One of a running or pending job places no more than
// it is charged for. A stopped, periodic or parameterized job's places
// nothing (Nomad refuses the last two).
func (s *Server) evaluate(w http.ResponseWriter, r *http.Request, jc jobCall, jobID string) error {
	var req api.JobEvaluateRequest
	body := jc.body
	if len(body) > 0 || r.ContentLength != 0 { // Nomad reads a body unless ContentLength is 0
		doc, err := s.parseJobCall(r, jc, &req, jobID, func() string { return req.JobID })
		if err != nil {
			return err
		}
		body = doc.Bytes()
	} else if err := s.checkRegion(r, jc.region, "", body); err != nil {
		return err
	}
	defer s.cluster.LockJob(jc.namespace, jobID)()
	job, err := s.callers.As(r).CurrentJob(jc.namespace, jobID)
	if err != nil {
		return lookupFailed(err, "evaluate", jobID)
	}
	// Running or pending, the job is charged its whole demand already.
	charged := job.Status != nil && *job.Status != "dead" && !req.EvalOptions.ForceReschedule
	if charged || job.Stop != nil && *job.Stop || job.IsPeriodic() || job.IsParameterized() {
		s.passThrough(w, r, body)
		return nil
	}
	_, err = s.checkThenForward(w, r, body, job, job, derefInt(job.Priority), jc.namespace, jobID, "evaluate", s.revived(r, nomadjob.Ref{Region: jc.region, Namespace: jc.namespace, ID: jobID}))
	return err
}

// activeDeployment reports whether a deployment of status may still fail.
func activeDeployment(status string) bool {
	switch status {
	case api.DeploymentStatusRunning, api.DeploymentStatusPaused, api.DeploymentStatusPending,
		api.DeploymentStatusBlocked, api.DeploymentStatusUnblocking, "initializing":
		return true
	}
	return false
}

// autoReverts reports whether a group of deployment d reverts on failure.
func autoReverts(d *api.Deployment) bool {
	for _, g := range d.TaskGroups {
		if g != nil && g.AutoRevert {
			return true
		}
	}
	return false
}

// deploymentWrite passes a deployment write on, but for one that can make
// Nomad revert the job: a fail, or allocations marked unhealthy, in a
// deployment with auto_revert. That is decided as the revert it leads to,
// to the job's latest stable version, and refused when the tenant could
// not hold it.
func (s *Server) deploymentWrite(w http.ResponseWriter, r *http.Request, jc jobCall, path, id string) error {
	reverts := strings.HasPrefix(path, "/v1/deployment/fail/")
	if strings.HasPrefix(path, "/v1/deployment/allocation-health/") {
		var req struct{ UnhealthyAllocationIDs []string }
		if _, err := jsondoc.Parse(jc.body, &req); err == nil && len(req.UnhealthyAllocationIDs) > 0 {
			reverts = true
		}
	}
	if !reverts {
		s.passThrough(w, r, jc.body)
		return nil
	}
	var d api.Deployment
	if err := s.callers.As(r).Get("/v1/deployment/"+url.PathEscape(id), jc.namespace, &d); err != nil {
		return lookupFailed(err, "deployment write", id)
	}
	if !autoReverts(&d) {
		s.passThrough(w, r, jc.body)
		return nil
	}
	return s.revertTo(w, r, jc.body, nomadjob.Ref{Region: jc.region, Namespace: d.Namespace, ID: d.JobID}, "deployment write", func(v *api.Job) bool {
		return *v.Version != d.JobVersion && v.Stable != nil && *v.Stable
	}) // no stable version: Nomad reverts nothing
}

// parseCall reads a call's body into out, refusing what Nomad could read
// differently (a field given twice) and calls for another region.
func (s *Server) parseCall(r *http.Request, jc jobCall, out any) (*jsondoc.Doc, error) {
	doc, err := jsondoc.Parse(jc.body, out)
	if err != nil {
		return nil, front.Fail(front.ErrBadRequest, "%v", err)
	}
	return doc, s.checkRegion(r, jc.region, "", doc.Bytes())
}

// parseJobCall is parseCall of a call whose body names its job
// (bodyJobID, read once parsed): one naming another job than the path is
// handed to Nomad, for Nomad to refuse ("Job ID does not match").
func (s *Server) parseJobCall(r *http.Request, jc jobCall, out any, jobID string, bodyJobID func() string) (*jsondoc.Doc, error) {
	doc, err := s.parseCall(r, jc, out)
	if err == nil && bodyJobID() != jobID {
		return nil, s.toNomad(r, doc.Bytes())
	}
	return doc, err
}

// checkThenForward decides on job as it will be after the call (current:
// the version Nomad runs, for a revert's canaries), which cannot change the
// priority it was admitted at; it returns the id of the child a dispatch
// created.
func (s *Server) checkThenForward(w http.ResponseWriter, r *http.Request, body []byte, job, current *api.Job, priority int, ns, jobID, what string, rec *record) (string, error) {
	a, err := s.seq.Existing(job, current, ns)
	if err != nil {
		return "", front.Fail(front.ErrBadRequest, "%s of %q: %v", what, jobID, err)
	}
	if len(a.Groups) == 0 {
		s.passThrough(w, r, body)
		return "", nil
	}
	if err := s.admitsHere(r, body); err != nil {
		return "", err
	}
	return s.decideThenForward(w, r, body, a, jobID, priority, what, rec)
}

// decideThenForward admits the demand the call on jobID leads to (a, a
// dispatch's child), or refuses it. Anything but an admission at the
// priority the job was admitted at is refused, since the call cannot change
// the priority. rec (nil: nothing) records the call once admitted, before it
// is forwarded, and settles once Nomad answered. It returns the id of the
// child a dispatch it admitted created ("" for none).
func (s *Server) decideThenForward(w http.ResponseWriter, r *http.Request, body []byte, a admission.Job, jobID string, current int, what string, rec *record) (string, error) {
	ns := a.Namespace
	d, res := s.seq.Decide(s.policies.Current(), a, decide.Reserve)
	who := s.callers.As(r).Identity()
	s.log.Info("admission", "call", what, "job", jobID, "namespace", ns, "outcome", d.Outcome, "priority", d.Priority,
		"gpus", d.Demand.Total(), "rule", d.Rule, "by", who)
	s.metrics.Admission(metrics.Submit, d)
	event := audit.Event{Who: who, What: audit.Admission, Namespace: ns, Job: jobID, Tenant: d.Tenant, Queue: d.Queue, Rule: d.Rule,
		Result: what + ": " + string(d.Outcome) + ": " + d.Reason}
	switch {
	case d.Outcome == admission.Queue:
		event.Result = what + ": refused, nothing queued: " + d.Cause
	case d.Outcome != admission.Reject && d.Priority != current:
		event.Result = fmt.Sprintf("%s: refused: it would run at priority %d but the job runs at %d", what, d.Priority, current)
	}
	if err := front.Audited(s.audit, event); err != nil {
		res.Release()
		return "", err
	}
	switch {
	case d.Outcome == admission.Reject:
		return "", front.Fail(front.ErrForbidden, "%s of %q rejected by rule %s: %s", what, jobID, d.Rule, d.Reason)
	case d.Outcome == admission.Queue:
		return "", front.Fail(front.ErrForbidden, "%s of %q refused: %s. Nothing was queued: a %s is answered at once, so try again once GPUs are free%s",
			what, jobID, d.Cause, what, waitInstead[what])
	case d.Priority != current:
		res.Release()
		return "", front.Fail(front.ErrForbidden, "%s of %q refused: the result would run at priority %d (%s) but the job runs at %d; register it again instead",
			what, jobID, d.Priority, d.Reason, current)
	default:
		if err := rec.run(); err != nil {
			res.Release()
			return "", front.Fail(front.ErrUnavailable, "%s of %q not forwarded: %v", what, jobID, err)
		}
		resp, err := s.forward(r, body, ns)
		if err != nil {
			res.Release()
			rec.settle(false, 0)
			return "", front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err)
		}
		took := s.relayRegistered(w, resp, res, admittedWarning(d))
		rec.settle(took.accepted, took.index)
		return took.child, nil
	}
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// waitInstead is, per call that cannot wait, how to wait in the queue instead.
var waitInstead = map[string]string{
	"scale":    ", or register the job with the new count to wait in the queue",
	"revert":   ", or register that version again to wait in the queue",
	"evaluate": ", or register the job again to wait in the queue",
}

// lookupFailed is the refusal of a call the broker could not decide on.
// Its status is Nomad's refusal's, 404 for no such job, else 502.
func lookupFailed(err error, what, jobID string) error {
	return fmt.Errorf("%s of %q refused: the broker cannot read the job it acts on (%w)", what, jobID, err)
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
