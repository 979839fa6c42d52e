package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// entryRegion is what a queue entry of rj says of its region: the region it
// names, or "auto" where the broker chooses it, when the broker governs
// several.
func (s *Server) entryRegion(rj *gpuJobRequest) string {
	switch {
	case s.regions == nil || len(s.regions.Names()) < 2:
		return ""
	case rj.Dispatch != "":
		return queue.RegionAuto
	case rj.Region != "":
		return rj.Region
	}
	return s.region
}

// enqueue stores the job and answers as Nomad would for a registration, with an
// evaluation id the broker itself serves, so that `nomad job run` (attached or
// -detach) prints the message and exits 0. What is stored is the request as
// the broker read it (namespace and counts pinned), never the raw body.
func (s *Server) enqueue(w http.ResponseWriter, r *http.Request, rj *gpuJobRequest, d admission.Decision, who string, event audit.Event, warnings ...string) error {
	// The leader registers it later with the broker's own token. So first
	// make sure the token resolves, and that the caller may submit this job
	// here now: as a tenant submitter (exclusive), or as Nomad says for a
	// plan with the caller's token (a plan needs submit-job and changes
	// nothing).
	_, accessor, err := s.callers.As(r).Resolve()
	if err != nil {
		return front.Fail(front.ErrForbidden, "job %q not queued: %v", rj.JobID, err)
	}
	var grants string
	if !writesAsBroker(r) {
		if accessor != "" {
			// The leader admits it only while what Nomad checks next is
			// unchanged (read first: a change in between then parks it).
			g, err := s.callers.As(r).Grants()
			if err != nil {
				return front.Fail(front.ErrForbidden, "job %q not queued: reading your token's grants: %v", rj.JobID, err)
			}
			grants = g.Version
		}
		if err := s.mayRegister(r, rj); errors.Is(err, front.ErrBadRequest) || errors.Is(err, front.ErrNomadUnreach) {
			return fmt.Errorf("job %q not queued: %w", rj.JobID, err)
		} else if err != nil {
			return planFailed(rj.JobID, err)
		}
	}
	entries, err := s.queue.View(r.Context()) // read only: a long queue is not copied
	if err != nil {
		return front.Fail(front.ErrUnavailable, "job %q could not be queued: %v", rj.JobID, err)
	}
	e := queue.Entry{ID: s.newID(), JobID: rj.JobID, Namespace: rj.Namespace, Tenant: d.Tenant, Queue: d.Queue, Region: s.entryRegion(rj),
		Demand: d.Demand.Total(), Reason: d.Reason, SubmittedBy: who, Accessor: accessor, Grants: grants, SubmittedAt: s.clock.Now().UTC(), Request: rj.Body()}
	// The job again while it waits: as in Nomad, the new version replaces
	// the old one, which keeps its place in the queue.
	at := waitingEntry(entries, e.Namespace, e.JobID)
	if at >= 0 {
		e.ID, e.SubmittedAt = entries[at].ID, entries[at].SubmittedAt
	}
	if err := s.withinQueueLimits(rj, d.Tenant, entries, at); err != nil {
		event.Result = "not queued: " + err.Error()
		return front.Refused(s.audit, event, front.Fail(front.ErrTooMany, "job %q not queued: %v", rj.JobID, err))
	}
	position, estimate, estimated := s.desk.Place(r.Context(), entries, e, at)
	e.EstimatedStart = estimate.At
	starts := startsText(estimate, estimated)
	event.ID = e.ID
	if err := front.Audited(s.audit, event); err != nil {
		return err
	}
	if err := s.queue.Put(r.Context(), e); errors.Is(err, queue.ErrTooLarge) {
		return front.Fail(front.ErrTooLarge, "job %q not queued: its request of %d bytes is too large to keep (%v); make the job smaller, "+
			"lower the tenant's max_queued_request_bytes, or raise Consul's limits { kv_max_value_size }", rj.JobID, len(e.Request), err)
	} else if err != nil {
		return front.Fail(front.ErrUnavailable, "job %q could not be queued: %v", rj.JobID, err)
	}
	front.WriteJSON(w, http.StatusOK, api.JobRegisterResponse{EvalID: e.ID, Warnings: joinWarnings(fmt.Sprintf(
		"nomad-gpu: queued as %s, position %d in queue %s: %s.%s It is registered with Nomad as soon as GPUs free up; "+
			"`gpu-broker queue show %s` follows it.", e.ID, position, d.Queue, d.Reason, starts, e.ID),
		joinWarnings(warnings...), s.rightSizingWarning(rj.Namespace, rj.JobID, d))})
	return nil
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

// withinQueueLimits checks the tenant's caps on queued jobs and request
// size, and the broker's on the requests the whole queue keeps; the entry at
// index replaced (-1: none) is the job's own waiting version.
func (s *Server) withinQueueLimits(rj *gpuJobRequest, tenant string, entries []queue.Entry, replaced int) error {
	t := s.policies.Current().Tenants[tenant]
	if size := len(rj.Body()); size > t.MaxQueuedRequestBytes {
		return fmt.Errorf("its request is %d bytes, above tenant %q's max_queued_request_bytes of %d", size, tenant, t.MaxQueuedRequestBytes)
	}
	n, bytes := 0, int64(len(rj.Body()))
	for i := range entries {
		if i == replaced {
			continue
		}
		bytes += int64(entries[i].Size())
		if entries[i].Tenant == tenant {
			n++
		}
	}
	if n >= t.MaxQueued {
		return fmt.Errorf("tenant %q already has %d queued jobs, its max_queued", tenant, n)
	}
	if s.maxQueueBytes > 0 && bytes > s.maxQueueBytes {
		return fmt.Errorf("the queue would keep %d bytes of requests with this one, above the broker's max_queue_bytes of %d "+
			"(jobs queued now: %d; Consul and every broker keep them all)", bytes, s.maxQueueBytes, len(entries))
	}
	return nil
}

// mayRegister asks Nomad to plan the job with the caller's token: a plan needs
// the same submit-job capability as a registration and changes nothing.
func (s *Server) mayRegister(r *http.Request, rj *gpuJobRequest) error {
	job := rj.Doc.Root().Get("Job").Bytes()
	err := s.callers.As(r).Plan(rj.Namespace, rj.JobID, job)
	var le *front.LookupError
	if errors.As(err, &le) && le.Status >= 500 {
		// Nomad answers the plan of an invalid job 500: its validator says
		// what the user has to change (an error of theirs: 400).
		var v api.JobValidateResponse
		body, _ := json.Marshal(map[string]any{"Job": json.RawMessage(job)})
		if s.callers.As(r).Do(http.MethodPut, "/v1/validate/job", rj.Namespace, body, &v) == nil && len(v.ValidationErrors) > 0 {
			return front.Fail(front.ErrBadRequest, "the job is invalid: %s", strings.Join(v.ValidationErrors, "; "))
		}
	}
	return err
}

// planFailed is the answer to a submission Nomad's plan of which failed: its
// refusal of the caller's token or the job (4xx, answered as is), or a
// failure of Nomad's own (5xx: 502, the user may send it again).
func planFailed(jobID string, err error) error {
	var le *front.LookupError
	if errors.As(err, &le) && le.Status < 500 {
		return fmt.Errorf("job %q not queued: Nomad refused to plan it with your token (%w)", jobID, err)
	}
	return front.Fail(front.ErrNomadUnreach, "job %q not queued: Nomad could not plan it (%v); nothing was queued, send it again", jobID, err)
}

// evaluation serves the evaluation ids of queued jobs; any other goes to Nomad.
func (s *Server) evaluation(w http.ResponseWriter, r *http.Request) {
	rest := r.URL.Path[len("/v1/evaluation/"):]
	id, sub, _ := cutSlash(rest)
	if !queue.ValidID(id) {
		s.readAnyRegion(w, r)
		return
	}
	e, err := s.queue.Get(r.Context(), id)
	if err != nil {
		s.readAnyRegion(w, r)
		return
	}
	switch sub {
	case "":
		front.WriteJSON(w, http.StatusOK, api.Evaluation{ID: e.ID, Namespace: e.Namespace, JobID: e.JobID,
			Status: api.EvalStatusComplete, TriggeredBy: "job-register", Type: "batch", Priority: 0,
			StatusDescription: "queued by nomad-gpu: " + e.Reason})
	case "allocations":
		front.WriteJSON(w, http.StatusOK, []*api.AllocationListStub{})
	default:
		s.readAnyRegion(w, r)
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
