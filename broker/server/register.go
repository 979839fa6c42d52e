package server

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
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

// readGPUJob reads a register, plan or validate request. Its error refuses
// it (a bad body, another region's call nobody decides here), or hands it
// on: to another broker, or to Nomad byte for byte when the job asks for no
// GPU. The job was read unambiguously, so Nomad reads no GPU in it either.
func (s *Server) readGPUJob(w http.ResponseWriter, r *http.Request, kind nomadjob.Kind, pathJobID string) (*gpuJobRequest, error) {
	body, err := s.readBody(w, r)
	if err != nil {
		return nil, err
	}
	req, err := nomadjob.ReadRequest(kind, body, r.URL.Query())
	if err != nil {
		return nil, front.Fail(front.ErrBadRequest, "%v", err)
	}
	if kind != nomadjob.Validate {
		front.BodyToken(r, req.Token)
	}
	if pathJobID != "" && req.JobID != pathJobID {
		return nil, front.Fail(front.ErrBadRequest, "the job ID %q in the body does not match %q in the path", req.JobID, pathJobID)
	}
	if kind != nomadjob.Validate { // validation only reads: the caller's own token suffices
		if err := s.authorize(r, kindName[kind], req.Namespace); err != nil {
			return nil, err
		}
	}
	warning, err := s.declaredGPUs(r, req)
	if err != nil {
		return nil, err
	}
	if gpus, err := req.AsksForGPUs(); err != nil {
		return nil, front.Fail(front.ErrBadRequest, "job %q: %v", req.JobID, err)
	} else if !gpus {
		return nil, s.toNomad(r, body, warning)
	}
	if err := s.checkRegion(r, req.Region, req.JobID, body); err != nil {
		return nil, err
	}
	// A follower sends a registration on before looking anything up: the
	// leader reads and counts it again anyway.
	if kind == nomadjob.Register {
		if err := s.admitsHere(r, body); err != nil {
			return nil, err
		}
	}
	unlock := func() {}
	if kind == nomadjob.Register {
		unlock = s.cluster.LockJob(req.Namespace, req.JobID)
	}
	p := s.policies.Current()
	prepared, err := s.seq.Prepare(r.Context(), p, req, s.callers.As(r))
	if err != nil {
		unlock()
		if decide.IsJobError(err) {
			return nil, front.Fail(front.ErrBadRequest, "job %q: %v", req.JobID, err)
		}
		return nil, lookupFailed(err, kindName[kind], req.JobID)
	}
	return &gpuJobRequest{Request: prepared, policy: p, unlock: unlock, warning: warning}, nil
}

// declaredGPUs refuses a job that would use GPUs it does not ask for, by
// rule undeclared-gpu-access (audited), or, with the policy's
// undeclared_gpu_access = "warn", returns the warning its answer carries.
func (s *Server) declaredGPUs(r *http.Request, req *nomadjob.Request) (string, error) {
	how := nomadjob.UndeclaredGPUAccess(req.Job)
	if len(how) == 0 {
		return "", nil
	}
	why := strings.Join(how, "; ")
	fix := `ask for GPUs with a device block (device "nvidia/gpu" { count = N }): the device plugin then gives the task ` +
		"the GPUs Nomad assigns it, and its tenant is charged for them"
	if s.policies.Current().UndeclaredGPUAccess == policy.AccessWarn {
		s.log.Warn("admission: undeclared GPU access", "job", req.JobID, "namespace", req.Namespace, "how", why)
		return fmt.Sprintf("nomad-gpu: warning: rule %s: %s; %s", admission.RuleUndeclaredGPUAccess, why, fix), nil
	}
	event := audit.Event{Who: s.callers.As(r).Identity(), What: audit.Admission, Namespace: req.Namespace, Job: req.JobID,
		Rule: admission.RuleUndeclaredGPUAccess, Result: "reject: " + why}
	return "", front.Refused(s.audit, event, front.Fail(front.ErrForbidden, "job %q rejected by rule %s: %s; %s", req.JobID, admission.RuleUndeclaredGPUAccess, why, fix))
}

var kindName = map[nomadjob.Kind]string{nomadjob.Register: "register", nomadjob.Plan: "plan", nomadjob.Validate: "validate"}

// register admits, queues or rejects a job registration.
func (s *Server) register(w http.ResponseWriter, r *http.Request, pathJobID string) error {
	rj, err := s.readGPUJob(w, r, nomadjob.Register, pathJobID)
	if err != nil {
		return err
	}
	defer rj.unlock()
	if rj.Job.IsParameterized() {
		return s.registerParent(w, r, rj)
	}
	d, res := s.seq.Decide(rj.policy, rj.AdmissionJob(), decide.Reserve)
	who := s.callers.As(r).Identity()
	s.metrics.Admission(metrics.Submit, d)
	s.log.Info("admission", "job", rj.JobID, "namespace", rj.Namespace, "outcome", d.Outcome, "tenant", d.Tenant,
		"queue", d.Queue, "priority", d.Priority, "gpus", d.Demand.Total(), "rule", d.Rule, "reason", d.Reason, "by", who)
	event := audit.Event{Who: who, What: audit.Admission, Namespace: rj.Namespace, Job: rj.JobID, Tenant: d.Tenant, Queue: d.Queue,
		Rule: d.Rule, Result: string(d.Outcome) + ": " + d.Reason}
	if rj.Dispatch != "" {
		event.Result += "; dispatched to " + rj.Dispatch
	}
	switch d.Outcome {
	case admission.Reject:
		return front.Refused(s.audit, event, front.Fail(front.ErrForbidden, "job %q rejected by rule %s: %s", rj.JobID, d.Rule, d.Reason))
	case admission.Queue:
		return s.enqueue(w, r, rj, d, who, event, dispatchWarning(rj.Dispatch), workloadWarning(rj.Wrote), rj.warning, s.driverWarning(rj))
	}
	if err := front.Audited(s.audit, event); err != nil {
		res.Release()
		return err
	}
	pinned := rj.Admit(d, s.stamper)
	settle, err := decide.Registering(r.Context(), s.stops, s.writes, nomadjob.RefOf(rj.Job), s.clock.Now())
	if err != nil {
		res.Release()
		return front.Fail(front.ErrUnavailable, "job %q not registered: %v", rj.JobID, err)
	}
	resp, err := s.forward(r, rj.Body(), rj.Namespace)
	if err != nil {
		res.Release()
		s.settled(settle(0))
		event.What, event.Result = audit.AdmissionError, "Nomad is unreachable: "+err.Error()
		s.audit.Write(event)
		return front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err)
	}
	took := s.relayRegistered(w, resp, res, admittedWarning(d), dispatchWarning(rj.Dispatch), pinned, workloadWarning(rj.Wrote),
		s.rightSizingWarning(rj.Namespace, rj.JobID, d), rj.warning, s.driverWarning(rj))
	s.settled(settle(took.index))
	return nil
}

// settled logs a record of the broker's own write that could not be
// settled once Nomad answered (decide.Revive, decide.Rewrite).
func (s *Server) settled(err error) {
	if err != nil {
		s.log.Error("a write through the broker: the job's record of it stays pending", "error", err)
	}
}

// dispatchWarning tells the user which region the broker chose for a job
// that left it to the broker, and why.
func dispatchWarning(note string) string {
	if note == "" {
		return ""
	}
	return "nomad-gpu: dispatched to " + note
}

// workloadWarning tells the user what the job's workload wrote into it.
func workloadWarning(wrote []string) string {
	if len(wrote) == 0 {
		return ""
	}
	return "nomad-gpu: written into the job for its workload: " + strings.Join(wrote, "; ")
}

// driverWarning tells a job whose GPU tasks run under exec or raw_exec on
// which of its region's GPU nodes they cannot open their GPUs (Nomad
// before 1.8 on cgroups v2; docs/device-plugin.md), or is "". Nomad
// places such a task there all the same, and it finds no GPU.
func (s *Server) driverWarning(rj *gpuJobRequest) string {
	tasks := nomadjob.CgroupBoundTasks(rj.Job)
	if len(tasks) == 0 {
		return ""
	}
	bound, of := s.cluster.CgroupBoundGPUNodes(rj.AdmissionJob().Where.Region)
	if len(bound) == 0 {
		return ""
	}
	names := strings.Join(bound[:min(len(bound), 5)], ", ")
	if len(bound) > 5 {
		names += fmt.Sprintf(" and %d more", len(bound)-5)
	}
	return fmt.Sprintf("nomad-gpu: warning: %s cannot open its GPUs on %d of the %d GPU nodes (%s): they run Nomad before 1.8 on cgroups v2, "+
		"which lets exec and raw_exec tasks open only the default devices; run it under docker, upgrade those nodes to Nomad 1.8, "+
		"or for raw_exec set no_cgroups in the client's raw_exec plugin (docs/device-plugin.md)", strings.Join(tasks, ", "), len(bound), of, names)
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

// registerParent registers a parameterized job. It places nothing itself and
// is charged nothing, but it must be allowed to run its children at all. It
// gets its queue's band and stamp, which each dispatch then keeps (every
// dispatch is admitted on its own).
func (s *Server) registerParent(w http.ResponseWriter, r *http.Request, rj *gpuJobRequest) error {
	p := rj.policy
	d, _ := s.seq.Decide(p, rj.AdmissionJob(), decide.Preview)
	if d.Outcome == admission.Reject {
		return front.Fail(front.ErrForbidden, "job %q rejected by rule %s: %s", rj.JobID, d.Rule, d.Reason)
	}
	d.Outcome, d.Priority, d.Demand = admission.Admit, p.Queues[d.Queue].Band, nil
	d.Reason = "a parameterized job places nothing itself; each dispatch is admitted on its own"
	rj.Admit(d, s.stamper)
	resp, err := s.forward(r, rj.Body(), rj.Namespace)
	if err != nil {
		return front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err)
	}
	s.relay(w, resp, admittedWarning(d))
	return nil
}

// taken is what Nomad answered to a call the broker admitted.
type taken struct {
	accepted bool
	child    string // a dispatch's child ("" for none)
	// index is the JobModifyIndex of the version the call made (0: none,
	// or not told).
	index uint64
}

// relayRegistered relays Nomad's answer to a call the broker admitted, and
// settles the reservation: confirmed at the job's new index, or released.
func (s *Server) relayRegistered(w http.ResponseWriter, resp *http.Response, res *cluster.Reservation, warnings ...string) taken {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	var out struct {
		api.JobRegisterResponse
		DispatchedJobID string // a dispatch's child, created at JobCreateIndex
		JobCreateIndex  uint64
		// A deployment failed with auto_revert: Nomad registered the
		// stable version with the deployment's update.
		RevertedJobVersion    *uint64
		DeploymentModifyIndex uint64
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
	t := taken{accepted: doc != nil, child: out.DispatchedJobID}
	switch {
	case doc == nil || out.DispatchedJobID != "":
	case out.RevertedJobVersion != nil:
		t.index = out.DeploymentModifyIndex
	default:
		t.index = out.JobModifyIndex
	}
	return t
}

func admittedWarning(d admission.Decision) string {
	borrowed := "no"
	if d.Outcome == admission.AdmitBorrowed {
		borrowed = "yes, preemptible when the owners need their GPUs"
	}
	return fmt.Sprintf("nomad-gpu: admitted: tenant %s, queue %s, priority %d, %g GPUs, borrowed: %s (%s)",
		d.Tenant, d.Queue, d.Priority, d.Demand.Total(), borrowed, d.Reason)
}
