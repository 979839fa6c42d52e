package server

import (
	"fmt"
	"net/http"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

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
	position, estimate, estimated := s.desk.Place(r.Context(), entries, e, at)
	return fmt.Sprintf(" It would be position %d in queue %s.%s", position, d.Queue, startsText(estimate, estimated))
}

// annotate forwards a plan or validation with a warning saying what admission
// would decide; nothing is queued, stored or reserved. A plan of an admitted
// job shows the priority and meta the broker would set.
func (s *Server) annotate(w http.ResponseWriter, r *http.Request, kind nomadjob.Kind, pathJobID string) error {
	rj, err := s.readGPUJob(w, r, kind, pathJobID)
	if err != nil {
		return err
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
			if pinned := rj.Admit(d, s.stamper); pinned != "" {
				note += "; would be " + pinned[len("nomad-gpu: "):]
			}
		}
	}
	resp, err := s.forward(r, rj.Body(), rj.Namespace)
	if err != nil {
		return front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err)
	}
	dispatch := ""
	if rj.Dispatch != "" {
		dispatch = "nomad-gpu: would be dispatched to " + rj.Dispatch
	}
	s.relay(w, resp, note, dispatch, rj.warning)
	return nil
}
