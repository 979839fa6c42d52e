package gpuapi

import (
	"errors"
	"net/http"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// QueuedJob is an entry of GET /v1/gpu/queue, with its place in admission order.
type QueuedJob struct {
	Position int `json:"position"`
	// Estimate is when it is expected to start (the leader's estimate;
	// absent on another broker).
	Estimate *queue.Estimate `json:"estimate,omitempty"`
	// Backoff, while it runs, holds the job back from borrowing.
	Backoff *admission.Backoff `json:"backoff,omitempty"`
	queue.Entry
}

// backoff is job namespace/id's re-borrow backoff now (nil: none running).
func (s *API) backoff(namespace, id string) *admission.Backoff {
	return s.preemptions.Backoff(s.policies.Current().Borrowing, namespace, id, s.clock.Now())
}

func (s *API) queueEntry(r *http.Request, id, who string) (any, error) {
	if !queue.ValidID(id) {
		return nil, front.Fail(front.ErrBadRequest, "%q is not a queue id (a UUID, as `gpu-broker queue list` shows)", id)
	}
	e, err := s.queue.Get(r.Context(), id)
	if errors.Is(err, queue.ErrNotFound) || (err == nil && !s.access.MayRead(r, e.Namespace, map[string]bool{})) {
		return nil, front.Fail(front.ErrNotFound, "no queued job %q (admitted, cancelled or never queued)", id)
	}
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	switch r.Method {
	case http.MethodGet:
		if s.acls && who != e.SubmittedBy {
			e.Request = nil
		} else if e.Request, err = e.Body(); err != nil {
			return nil, front.Fail(front.ErrUnavailable, "%v", err)
		}
		entries, err := s.desk.Ordered(r)
		if err != nil {
			return nil, front.Fail(front.ErrUnavailable, "%v", err)
		}
		return QueuedJob{Position: front.PositionOf(entries, id), Entry: e, Estimate: front.EstimatePtr(s.desk.EstimateOf(entries, id)),
			Backoff: s.backoff(e.Namespace, e.JobID)}, nil
	case http.MethodDelete:
		if !s.access.MayCancel(r, e, who) {
			return nil, front.Fail(front.ErrForbidden, "only its submitter, or a token that may submit job %q in namespace %q, may cancel queued job %s",
				e.JobID, e.Namespace, id)
		}
		if err := s.desk.Dequeue(r, e, who, "cancelled"); err != nil {
			return nil, err
		}
		return e, nil
	default:
		return nil, notAllowed(r)
	}
}
