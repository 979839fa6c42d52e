package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// gpuJobRequest is a job request read as Nomad reads it and prepared for
// its decision (decide.Prepare), with the policy it was prepared under.
type gpuJobRequest struct {
	*decide.Request
	policy  *policy.Policy
	unlock  func() // ends the hold on the job (a registration's: jobLocks)
	warning string // what its answer says besides (undeclared GPU access)
}

// readGPUJob reads a register, plan or validate request. It answers the
// request itself, and returns nil, when the body is bad, the call is for
// another region, or the job asks for no GPU (Nomad then gets it byte for byte:
// it was read unambiguously, so Nomad reads no GPU in it either).
func (s *Server) readGPUJob(w http.ResponseWriter, r *http.Request, kind nomadjob.Kind, pathJobID string) *gpuJobRequest {
	body, ok := s.readBody(w, r)
	if !ok {
		return nil
	}
	req, err := nomadjob.ReadRequest(kind, body, r.URL.Query())
	if err != nil {
		writeError(w, fail(errBadRequest, "%v", err))
		return nil
	}
	if pathJobID != "" && req.JobID != pathJobID {
		writeError(w, fail(errBadRequest, "the job ID %q in the body does not match %q in the path", req.JobID, pathJobID))
		return nil
	}
	if kind != nomadjob.Validate && !s.authorize(w, r, kindName[kind], req.Namespace) {
		return nil // validation only reads: the caller's own token suffices
	}
	warning, ok := s.declaredGPUs(w, r, req)
	if !ok {
		return nil
	}
	if gpus, err := req.AsksForGPUs(); err != nil {
		writeError(w, fail(errBadRequest, "job %q: %v", req.JobID, err))
		return nil
	} else if !gpus {
		s.passThrough(w, r, body, warning)
		return nil
	}
	if !s.checkRegion(w, r, req.Region, req.JobID, body) {
		return nil
	}
	// A follower sends a registration on before looking anything up: the
	// leader reads and counts it again anyway.
	if kind == nomadjob.Register && !s.admitsHere(w, r, body) {
		return nil
	}
	unlock := func() {}
	if kind == nomadjob.Register {
		unlock = s.cluster.LockJob(req.Namespace, req.JobID)
	}
	p := s.policies.Current()
	prepared, err := s.seq.Prepare(r.Context(), p, req, s.as(r))
	if err != nil {
		unlock()
		if decide.IsJobError(err) {
			writeError(w, fail(errBadRequest, "job %q: %v", req.JobID, err))
		} else {
			s.lookupFailed(w, err, kindName[kind], req.JobID)
		}
		return nil
	}
	return &gpuJobRequest{Request: prepared, policy: p, unlock: unlock, warning: warning}
}

// declaredGPUs refuses a job that would use GPUs it does not ask for, by
// rule undeclared-gpu-access (audited), or, with the policy's
// undeclared_gpu_access = "warn", returns the warning its answer carries.
func (s *Server) declaredGPUs(w http.ResponseWriter, r *http.Request, req *nomadjob.Request) (string, bool) {
	how := nomadjob.UndeclaredGPUAccess(req.Job)
	if len(how) == 0 {
		return "", true
	}
	why := strings.Join(how, "; ")
	fix := `ask for GPUs with a device block (device "nvidia/gpu" { count = N }): the device plugin then gives the task ` +
		"the GPUs Nomad assigns it, and its tenant is charged for them"
	if s.policies.Current().UndeclaredGPUAccess == policy.AccessWarn {
		s.log.Warn("admission: undeclared GPU access", "job", req.JobID, "namespace", req.Namespace, "how", why)
		return fmt.Sprintf("nomad-gpu: warning: rule %s: %s; %s", admission.RuleUndeclaredGPUAccess, why, fix), true
	}
	event := audit.Event{Who: s.as(r).identity(), What: audit.Admission, Namespace: req.Namespace, Job: req.JobID,
		Rule: admission.RuleUndeclaredGPUAccess, Result: "reject: " + why}
	if s.audited(w, event) {
		writeError(w, fail(errForbidden, "job %q rejected by rule %s: %s; %s", req.JobID, admission.RuleUndeclaredGPUAccess, why, fix))
	}
	return "", false
}

var kindName = map[nomadjob.Kind]string{nomadjob.Register: "register", nomadjob.Plan: "plan", nomadjob.Validate: "validate"}

// register admits, queues or rejects a job registration.
func (s *Server) register(w http.ResponseWriter, r *http.Request, pathJobID string) {
	rj := s.readGPUJob(w, r, nomadjob.Register, pathJobID)
	if rj == nil {
		return
	}
	defer rj.unlock()
	if rj.Job.IsPeriodic() {
		// Nomad launches each run on its own schedule, past the broker.
		writeError(w, fail(errForbidden, "job %q rejected by rule %s: periodic jobs launch GPU work on Nomad's schedule "+
			"without admission; submit each run through the broker, or dispatch a parameterized job", rj.JobID, admission.RulePeriodicGPU))
		return
	}
	if rj.Job.IsParameterized() {
		s.registerParent(w, r, rj)
		return
	}
	d, res := s.seq.Decide(rj.policy, rj.AdmissionJob(), decide.Reserve)
	who := s.as(r).identity()
	s.metrics.Admission(metrics.Submit, d)
	s.log.Info("admission", "job", rj.JobID, "namespace", rj.Namespace, "outcome", d.Outcome, "tenant", d.Tenant,
		"queue", d.Queue, "priority", d.Priority, "gpus", d.Demand.Total(), "rule", d.Rule, "reason", d.Reason, "by", who)
	event := audit.Event{Who: who, What: audit.Admission, Namespace: rj.Namespace, Job: rj.JobID, Tenant: d.Tenant, Queue: d.Queue,
		Rule: d.Rule, Result: string(d.Outcome) + ": " + d.Reason}
	switch d.Outcome {
	case admission.Reject:
		if s.audited(w, event) {
			writeError(w, fail(errForbidden, "job %q rejected by rule %s: %s", rj.JobID, d.Rule, d.Reason))
		}
	case admission.Queue:
		s.enqueue(w, r, rj, d, who, event, workloadWarning(rj.Wrote), rj.warning)
	default:
		if !s.audited(w, event) {
			res.Release()
			return
		}
		rj.Stamp(d, s.stamper.Stamp(rj.Namespace, rj.Job, d))
		resp, err := s.forward(r, rj.Body(), rj.Namespace)
		if err != nil {
			res.Release()
			event.What, event.Result = audit.AdmissionError, "Nomad is unreachable: "+err.Error()
			s.audit.Write(event)
			writeError(w, fail(errNomadUnreach, "Nomad is unreachable: %v", err))
			return
		}
		s.relayRegistered(w, resp, res, admittedWarning(d), workloadWarning(rj.Wrote), s.rightSizingWarning(rj.Namespace, rj.JobID, d), rj.warning)
	}
}

// workloadWarning tells the user what the job's workload wrote into it.
func workloadWarning(wrote []string) string {
	if len(wrote) == 0 {
		return ""
	}
	return "nomad-gpu: written into the job for its workload: " + strings.Join(wrote, "; ")
}

// audited writes e to the audit trail before anything is acknowledged or
// done; when it cannot, the caller is answered 503 and nothing is done.
func (s *Server) audited(w http.ResponseWriter, e audit.Event) bool {
	if err := s.audit.Write(e); err != nil {
		writeError(w, fail(errUnavailable, "the audit trail cannot be written, so nothing was done: %v", err))
		return false
	}
	return true
}

// rightSizingWarning tells a job submitted again that its earlier runs kept
// under half of its GPUs busy, or is "".
func (s *Server) rightSizingWarning(namespace, job string, d admission.Decision) string {
	if s.profiles == nil {
		return ""
	}
	p, ok := s.profiles.Get(namespace, job)
	if !ok {
		return ""
	}
	return p.Warning(int(math.Ceil(d.Demand.Total())))
}

// registerParent registers a parameterized job: it places nothing itself and
// is charged nothing, but it must be allowed to run its children at all, and it
// gets its queue's band and stamp, which each dispatch then keeps (every
// dispatch is admitted on its own).
func (s *Server) registerParent(w http.ResponseWriter, r *http.Request, rj *gpuJobRequest) {
	p := rj.policy
	d, _ := s.seq.Decide(p, rj.AdmissionJob(), decide.Preview)
	if d.Outcome == admission.Reject {
		writeError(w, fail(errForbidden, "job %q rejected by rule %s: %s", rj.JobID, d.Rule, d.Reason))
		return
	}
	d.Outcome, d.Priority, d.Demand = admission.Admit, p.Queues[d.Queue].Band, nil
	d.Reason = "a parameterized job places nothing itself; each dispatch is admitted on its own"
	rj.Stamp(d, s.stamper.Stamp(rj.Namespace, rj.Job, d))
	resp, err := s.forward(r, rj.Body(), rj.Namespace)
	if err != nil {
		writeError(w, fail(errNomadUnreach, "Nomad is unreachable: %v", err))
		return
	}
	s.relay(w, resp, admittedWarning(d))
}

// Headers marking a GPU request one broker sent on to another: a follower to
// its leader, or a broker to another region's; none is sent on twice.
const (
	forwardedHeader       = "X-Nomad-Gpu-Forwarded"
	regionForwardedHeader = "X-Nomad-Gpu-Region-Forwarded"
)

// admitsHere reports whether this broker decides on a GPU request. A follower
// sends it to the leader (body as received) and relays the answer; a request
// sent on by another broker to one that is no longer leader is refused rather
// than sent on again.
func (s *Server) admitsHere(w http.ResponseWriter, r *http.Request, body []byte) bool {
	if s.leader == nil || s.leader.IsLeader() {
		return true
	}
	if r.Header.Get(forwardedHeader) != "" {
		writeError(w, fail(errUnavailable, "the broker leader changed while deciding; try again"))
		return false
	}
	addr, err := s.leader.LeaderAddress(r.Context())
	if err != nil {
		writeError(w, fail(errUnavailable, "GPU jobs are admitted by the broker leader, and there is none: %v", err))
		return false
	}
	s.sendOn(w, r, addr, body, "the broker leader", forwardedHeader)
	return false
}

// sendOn sends the request (with body as given) to another broker at addr and
// relays its answer, marked with header so that it is not sent on again.
func (s *Server) sendOn(w http.ResponseWriter, r *http.Request, addr string, body []byte, who, header string) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(addr, "/")+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		writeError(w, fail(errInternal, "address of %s %q: %v", who, addr, err))
		return
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	req.Header.Set(header, "1")
	resp, err := s.leaderClient.Do(req)
	if err != nil {
		writeError(w, fail(errUnavailable, "%s at %s is unreachable: %v", who, addr, err))
		return
	}
	s.relay(w, resp)
}

// relayRegistered relays Nomad's answer to a call the broker admitted, and
// settles the reservation: confirmed at the job's new index, or released.
// It returns the id of the child a dispatch created ("" for none).
func (s *Server) relayRegistered(w http.ResponseWriter, resp *http.Response, res *cluster.Reservation, warnings ...string) string {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	var out struct {
		api.JobRegisterResponse
		DispatchedJobID string // a dispatch's child, created at JobCreateIndex
		JobCreateIndex  uint64
	}
	var doc *jsondoc.Doc // read once: for the reservation, and to add the warnings to
	if err == nil && resp.StatusCode == http.StatusOK {
		doc, _ = jsondoc.Parse(body, &out)
	}
	switch {
	case doc == nil:
		res.Release()
		out.DispatchedJobID = ""
	case out.DispatchedJobID != "":
		res.ConfirmAs(out.DispatchedJobID, out.JobCreateIndex)
	case out.JobModifyIndex > 0:
		res.Confirm(out.JobModifyIndex)
	default:
		res.Confirm(0) // a periodic force: its child's events name an id Nomad does not answer with
	}
	if doc != nil && doc.Root().IsObject() {
		body, warnings = addWarnings(doc, out.Warnings, warnings), nil
	}
	s.relayBody(w, resp, body, err, warnings...)
	return out.DispatchedJobID
}

func admittedWarning(d admission.Decision) string {
	borrowed := "no"
	if d.Outcome == admission.AdmitBorrowed {
		borrowed = "yes, preemptible when the owners need their GPUs"
	}
	return fmt.Sprintf("nomad-gpu: admitted: tenant %s, queue %s, priority %d, %g GPUs, borrowed: %s (%s)",
		d.Tenant, d.Queue, d.Priority, d.Demand.Total(), borrowed, d.Reason)
}

// enqueue stores the job and answers as Nomad would for a registration, with an
// evaluation id the broker itself serves, so that `nomad job run` (attached or
// -detach) prints the message and exits 0. What is stored is the request as
// the broker read it (namespace and counts pinned), never the raw body.
func (s *Server) enqueue(w http.ResponseWriter, r *http.Request, rj *gpuJobRequest, d admission.Decision, who string, event audit.Event, warnings ...string) {
	// The leader registers it later with the broker's own token: first make
	// sure the token resolves, and that the caller may submit this job here
	// now: as a tenant submitter (exclusive), or as Nomad says for a plan
	// with the caller's token (a plan needs submit-job and changes nothing).
	_, accessor, err := s.as(r).resolve()
	if err != nil {
		writeError(w, fail(errForbidden, "job %q not queued: %v", rj.JobID, err))
		return
	}
	var grants string
	if !writesAsBroker(r) {
		if accessor != "" {
			// The leader admits it only while what Nomad checks next is
			// unchanged (read first: a change in between then parks it).
			g, err := s.as(r).grants()
			if err != nil {
				writeError(w, fail(errForbidden, "job %q not queued: reading your token's grants: %v", rj.JobID, err))
				return
			}
			grants = g.Version
		}
		if err := s.mayRegister(r, rj); errors.Is(err, errBadRequest) || errors.Is(err, errNomadUnreach) {
			writeError(w, fmt.Errorf("job %q not queued: %w", rj.JobID, err))
			return
		} else if err != nil {
			// Nomad's own refusal (its status) or no answer (502).
			writeError(w, fmt.Errorf("job %q not queued: Nomad refused to plan it with your token (%w)", rj.JobID, err))
			return
		}
	}
	entries, err := s.queue.View(r.Context()) // read only: a long queue is not copied
	if err != nil {
		writeError(w, fail(errUnavailable, "job %q could not be queued: %v", rj.JobID, err))
		return
	}
	e := queue.Entry{ID: s.newID(), JobID: rj.JobID, Namespace: rj.Namespace, Tenant: d.Tenant, Queue: d.Queue,
		Demand: d.Demand.Total(), Reason: d.Reason, SubmittedBy: who, Accessor: accessor, Grants: grants, SubmittedAt: s.clock.Now().UTC(), Request: rj.Body()}
	// The job again while it waits: as in Nomad, the new version replaces
	// the old one, which keeps its place in the queue.
	at := waitingEntry(entries, e.Namespace, e.JobID)
	if at >= 0 {
		e.ID, e.SubmittedAt = entries[at].ID, entries[at].SubmittedAt
	}
	if err := s.withinQueueLimits(rj, d.Tenant, entries, at); err != nil {
		event.Result = "not queued: " + err.Error()
		if s.audited(w, event) {
			writeError(w, fail(errTooMany, "job %q not queued: %v", rj.JobID, err))
		}
		return
	}
	position, estimate, estimated := s.place(r.Context(), entries, e, at)
	e.EstimatedStart = estimate.At
	starts := startsText(estimate, estimated)
	event.ID = e.ID
	if !s.audited(w, event) {
		return
	}
	if err := s.queue.Put(r.Context(), e); errors.Is(err, queue.ErrTooLarge) {
		writeError(w, fail(errTooLarge, "job %q not queued: its request of %d bytes is too large to keep (%v); make the job smaller, "+
			"lower the tenant's max_queued_request_bytes, or raise Consul's limits { kv_max_value_size }", rj.JobID, len(e.Request), err))
		return
	} else if err != nil {
		writeError(w, fail(errUnavailable, "job %q could not be queued: %v", rj.JobID, err))
		return
	}
	writeJSON(w, http.StatusOK, api.JobRegisterResponse{EvalID: e.ID, Warnings: joinWarnings(fmt.Sprintf(
		"nomad-gpu: queued as %s, position %d in queue %s: %s.%s It is registered with Nomad as soon as GPUs free up; "+
			"`gpu-broker queue show %s` follows it.", e.ID, position, d.Queue, d.Reason, starts, e.ID),
		joinWarnings(warnings...), s.rightSizingWarning(rj.Namespace, rj.JobID, d))})
}

// startsText is a queued job's estimated start, as a sentence to append
// ("" when there is no estimate).
func startsText(estimate queue.Estimate, estimated bool) string {
	switch {
	case estimated && !estimate.At.IsZero():
		return fmt.Sprintf(" Estimated start: %s (%s).", estimate.At.UTC().Format(time.RFC3339), estimate.Why)
	case estimated:
		return " Estimated start: " + estimate.Why + "."
	}
	return ""
}

// planEstimate is where a job a plan would queue would wait, and when it
// would start: the same estimate a real submission gets ("" when the queue
// cannot be read or there is no estimate).
func (s *Server) planEstimate(r *http.Request, rj *gpuJobRequest, d admission.Decision) string {
	entries, err := s.queue.View(r.Context())
	if err != nil {
		return ""
	}
	e := queue.Entry{ID: "plan", JobID: rj.JobID, Namespace: rj.Namespace, Tenant: d.Tenant, Queue: d.Queue,
		Demand: d.Demand.Total(), SubmittedAt: s.clock.Now().UTC()}
	at := waitingEntry(entries, e.Namespace, e.JobID)
	if at >= 0 {
		e.SubmittedAt = entries[at].SubmittedAt // submitted again, it keeps the place of the version waiting
	}
	position, estimate, estimated := s.place(r.Context(), entries, e, at)
	return fmt.Sprintf(" It would be position %d in queue %s.%s", position, d.Queue, startsText(estimate, estimated))
}

// waitingEntry is the index of the entry of job ns/id that waits (not
// parked) in entries, -1 if none.
func waitingEntry(entries []queue.Entry, ns, id string) int {
	for i := range entries {
		if entries[i].Namespace == ns && entries[i].JobID == id && entries[i].Parked == "" {
			return i
		}
	}
	return -1
}

// withinQueueLimits checks the tenant's caps on queued jobs and request size;
// the entry at index replaced (-1: none) is the job's own waiting version.
func (s *Server) withinQueueLimits(rj *gpuJobRequest, tenant string, entries []queue.Entry, replaced int) error {
	t := s.policies.Current().Tenants[tenant]
	if size := len(rj.Body()); size > t.MaxQueuedRequestBytes {
		return fmt.Errorf("its request is %d bytes, above tenant %q's max_queued_request_bytes of %d", size, tenant, t.MaxQueuedRequestBytes)
	}
	n := 0
	for i := range entries {
		if entries[i].Tenant == tenant && i != replaced {
			n++
		}
	}
	if n >= t.MaxQueued {
		return fmt.Errorf("tenant %q already has %d queued jobs, its max_queued", tenant, n)
	}
	return nil
}

// mayRegister asks Nomad to plan the job with the caller's token: a plan needs
// the same submit-job capability as a registration and changes nothing.
func (s *Server) mayRegister(r *http.Request, rj *gpuJobRequest) error {
	job := rj.Doc.Root().Get("Job").Bytes()
	err := s.as(r).plan(rj.Namespace, rj.JobID, job)
	var le *lookupError
	if errors.As(err, &le) && le.status >= 500 {
		// Nomad answers the plan of an invalid job 500: its validator says
		// what the user has to change (an error of theirs: 400).
		var v api.JobValidateResponse
		body, _ := json.Marshal(map[string]any{"Job": json.RawMessage(job)})
		if s.as(r).do(http.MethodPut, "/v1/validate/job", rj.Namespace, body, &v) == nil && len(v.ValidationErrors) > 0 {
			return fail(errBadRequest, "the job is invalid: %s", strings.Join(v.ValidationErrors, "; "))
		}
	}
	return err
}

// positionOf is an entry's 1-based place in ordered entries, 0 if absent.
func positionOf(entries []queue.Entry, id string) int {
	for i, e := range entries {
		if e.ID == id {
			return i + 1
		}
	}
	return 0
}

// annotate forwards a plan or validation with a warning saying what admission
// would decide; nothing is queued, stored or reserved. A plan of an admitted
// job shows the priority and meta the broker would set.
func (s *Server) annotate(w http.ResponseWriter, r *http.Request, kind nomadjob.Kind, pathJobID string) {
	rj := s.readGPUJob(w, r, kind, pathJobID)
	if rj == nil {
		return
	}
	d, _ := s.seq.Decide(rj.policy, rj.AdmissionJob(), decide.Preview)
	note := ""
	switch d.Outcome {
	case admission.Reject:
		note = fmt.Sprintf("nomad-gpu: would be rejected by rule %s: %s", d.Rule, d.Reason)
	case admission.Queue:
		note = fmt.Sprintf("nomad-gpu: would be queued in queue %s: %s.", d.Queue, d.Reason)
		if kind == nomadjob.Plan {
			note += s.planEstimate(r, rj, d)
		}
	default:
		note = "nomad-gpu: would be " + admittedWarning(d)[len("nomad-gpu: "):]
		if kind == nomadjob.Plan {
			rj.Stamp(d, s.stamper.Stamp(rj.Namespace, rj.Job, d))
		}
	}
	resp, err := s.forward(r, rj.Body(), rj.Namespace)
	if err != nil {
		writeError(w, fail(errNomadUnreach, "Nomad is unreachable: %v", err))
		return
	}
	s.relay(w, resp, note, rj.warning)
}

// checkRegion passes a call for the broker's own region. One for another
// region goes to that region's broker when policy names it (that broker
// decides with that region's usage), and is refused otherwise.
func (s *Server) checkRegion(w http.ResponseWriter, r *http.Request, region, jobID string, body []byte) bool {
	if region == "" || region == s.region || region == api.GlobalRegion {
		return true
	}
	if other, ok := s.policies.Current().Regions[region]; ok && r.Header.Get(regionForwardedHeader) == "" {
		s.sendOn(w, r, other.Broker, body, "region "+region+"'s broker", regionForwardedHeader)
		return false
	}
	writeError(w, fail(errForbidden, "job %q is for region %q, but this broker admits GPU jobs for region %q only, "+
		"and policy names no broker for region %s (region %q { broker = \"...\" })", jobID, region, s.region, region, region))
	return false
}

// evaluation serves the evaluation ids of queued jobs; any other goes to Nomad.
func (s *Server) evaluation(w http.ResponseWriter, r *http.Request) {
	rest := r.URL.Path[len("/v1/evaluation/"):]
	id, sub, _ := cutSlash(rest)
	if !queue.ValidID(id) {
		s.proxy.ServeHTTP(w, r)
		return
	}
	e, err := s.queue.Get(r.Context(), id)
	if err != nil {
		s.proxy.ServeHTTP(w, r)
		return
	}
	switch sub {
	case "":
		writeJSON(w, http.StatusOK, api.Evaluation{ID: e.ID, Namespace: e.Namespace, JobID: e.JobID,
			Status: api.EvalStatusComplete, TriggeredBy: "job-register", Type: "batch", Priority: 0,
			StatusDescription: "queued by nomad-gpu: " + e.Reason})
	case "allocations":
		writeJSON(w, http.StatusOK, []*api.AllocationListStub{})
	default:
		s.proxy.ServeHTTP(w, r)
	}
}

func cutSlash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
