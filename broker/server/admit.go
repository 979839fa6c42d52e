package server

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// gpuRequest reads a job request and decides on it. It answers the request
// itself, and returns false, when the body is bad or the job asks for no GPU
// (which Nomad gets byte for byte).
func (s *Server) gpuRequest(w http.ResponseWriter, r *http.Request) (*requestJob, admission.Decision, bool) {
	rj, err := readJobRequest(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nomad-gpu: %v", err)
		return nil, admission.Decision{}, false
	}
	d := s.decide(rj)
	if d.Demand.Total() == 0 {
		s.passThrough(w, r, rj.request)
		return nil, d, false
	}
	return rj, d, true
}

// decide runs admission for a job request against usage without the job's
// current version (an update replaces it).
func (s *Server) decide(rj *requestJob) admission.Decision {
	p := s.policies.Current()
	return admission.Decide(p, nomadjob.Admission(rj.job, rj.ns), s.cluster.UsageWithout(p, rj.ns, rj.jobID))
}

// register admits, queues or rejects a job registration.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	rj, d, ok := s.gpuRequest(w, r)
	if !ok {
		return
	}
	who := s.identity(r)
	s.log.Info("admission", "job", rj.jobID, "namespace", rj.ns, "outcome", d.Outcome, "tenant", d.Tenant,
		"queue", d.Queue, "priority", d.Priority, "gpus", d.Demand.Total(), "rule", d.Rule, "reason", d.Reason, "by", who)
	switch d.Outcome {
	case admission.Reject:
		writeError(w, http.StatusForbidden, "nomad-gpu: job %q rejected by rule %s: %s", rj.jobID, d.Rule, d.Reason)
	case admission.Queue:
		s.enqueue(w, r, rj, d, who)
	default:
		body := s.apply(rj, d)
		resp, err := s.forward(r, body)
		if err != nil {
			writeError(w, http.StatusBadGateway, "nomad-gpu: Nomad is unreachable: %v", err)
			return
		}
		if resp.StatusCode == http.StatusOK {
			s.cluster.ObserveJob(rj.job) // counted before Nomad's event arrives
		}
		s.relay(w, resp, admittedWarning(d))
	}
}

// apply stamps the decision into the job and returns the request body to send.
func (s *Server) apply(rj *requestJob, d admission.Decision) []byte {
	nomadjob.Apply(rj.jobRaw, d, s.stamper.Stamp(rj.ns, rj.jobID, d, s.now()))
	rj.job.Priority = &d.Priority
	if rj.job.Meta == nil {
		rj.job.Meta = map[string]string{}
	}
	rj.job.Meta[nomadjob.MetaBorrowed] = strconv.FormatBool(d.Outcome == admission.AdmitBorrowed)
	if rj.job.Namespace == nil {
		rj.job.Namespace = &rj.ns
	}
	body, _ := json.Marshal(rj.raw)
	return body
}

func admittedWarning(d admission.Decision) string {
	borrowed := "no"
	if d.Outcome == admission.AdmitBorrowed {
		borrowed = "yes, preemptible when the owners need their GPUs"
	}
	return fmt.Sprintf("nomad-gpu: admitted: tenant %s, queue %s, priority %d, %d GPUs, borrowed: %s (%s)",
		d.Tenant, d.Queue, d.Priority, d.Demand.Total(), borrowed, d.Reason)
}

// enqueue stores the job and answers as Nomad would for a registration, with an
// evaluation id the broker itself serves, so that `nomad job run` (attached or
// -detach) prints the message and exits 0.
func (s *Server) enqueue(w http.ResponseWriter, r *http.Request, rj *requestJob, d admission.Decision, who string) {
	e := queue.Entry{ID: s.newID(), JobID: rj.jobID, Namespace: rj.ns, Tenant: d.Tenant, Queue: d.Queue,
		Demand: d.Demand.Total(), Reason: d.Reason, SubmittedBy: who, SubmittedAt: s.now().UTC(), Request: rj.request}
	if err := s.queue.Put(r.Context(), e); err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: job %q could not be queued: %v", rj.jobID, err)
		return
	}
	position := s.position(r, e.ID)
	writeJSON(w, http.StatusOK, api.JobRegisterResponse{EvalID: e.ID, Warnings: fmt.Sprintf(
		"nomad-gpu: queued as %s, position %d in queue %s: %s. It is registered with Nomad as soon as GPUs free up; "+
			"`gpu-broker queue show %s` follows it.", e.ID, position, d.Queue, d.Reason, e.ID)})
}

// position is the entry's 1-based place in admission order.
func (s *Server) position(r *http.Request, id string) int {
	entries, err := s.ordered(r)
	if err != nil {
		return 0
	}
	for i, e := range entries {
		if e.ID == id {
			return i + 1
		}
	}
	return 0
}

// annotate forwards a plan or validation with a warning saying what admission
// would decide; nothing is queued or stored. A plan of an admitted job shows the
// priority and meta the broker would set.
func (s *Server) annotate(w http.ResponseWriter, r *http.Request, plan bool) {
	rj, d, ok := s.gpuRequest(w, r)
	if !ok {
		return
	}
	body, note := rj.request, ""
	switch d.Outcome {
	case admission.Reject:
		note = fmt.Sprintf("nomad-gpu: would be rejected by rule %s: %s", d.Rule, d.Reason)
	case admission.Queue:
		note = fmt.Sprintf("nomad-gpu: would be queued in queue %s: %s", d.Queue, d.Reason)
	default:
		note = "nomad-gpu: would be " + admittedWarning(d)[len("nomad-gpu: "):]
		if plan {
			body = s.apply(rj, d)
		}
	}
	resp, err := s.forward(r, body)
	if err != nil {
		writeError(w, http.StatusBadGateway, "nomad-gpu: Nomad is unreachable: %v", err)
		return
	}
	s.relay(w, resp, note)
}

// evaluation serves the evaluation ids of queued jobs; any other goes to Nomad.
func (s *Server) evaluation(w http.ResponseWriter, r *http.Request) {
	rest := r.URL.Path[len("/v1/evaluation/"):]
	id, sub, _ := cutSlash(rest)
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

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
