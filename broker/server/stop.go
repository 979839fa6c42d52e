package server

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// dequeuedHeader names the queue entries a stop took out of the queue.
const dequeuedHeader = "X-Nomad-Gpu-Dequeued"

// stop is a job stop or purge (DELETE /v1/job/<id>). The job's entries in
// the queue are taken out first, so that nothing stopped starts later; then
// Nomad stops what it runs. Nomad answers 200 even for a job it does not
// have, so the answer names the entries taken out in dequeuedHeader. An
// entry the leader is registering (claimed) is waited for, up to
// stopWaitsForAdmission: Nomad has the job then, and the stop reaches it.
func (s *Server) stop(w http.ResponseWriter, r *http.Request, jc jobCall, jobID string) error {
	who := s.callers.As(r).Identity()
	var ids []string
	deadline := s.clock.Now().Add(stopWaitsForAdmission)
	for {
		entries, err := s.queue.List(r.Context())
		if err != nil {
			// Nomad's jobs stop all the same: an outage of the queue's store
			// must not keep a running job from stopping.
			s.log.Warn("stop: the queue cannot be read; a queued entry of the job stays queued", "job", jobID, "namespace", jc.namespace, "error", err)
			break
		}
		waiting := false
		for _, e := range entries {
			if e.Namespace != jc.namespace || e.JobID != jobID {
				continue
			}
			if !writesAsBroker(r) && !s.access.MayCancel(r, e, who) {
				return front.Fail(front.ErrForbidden, "stop of %q refused: it is queued as %s, and only its submitter, or a token that may submit it, may take it out",
					jobID, e.ID)
			}
			if !e.Admitting.IsZero() && s.clock.Now().Sub(e.Admitting) < admissionInFlight {
				waiting = true // being registered: wait until Nomad has it
				continue
			}
			if err := s.desk.Dequeue(r, e, who, "stopped"); errors.Is(err, front.ErrConflict) {
				waiting = true // changed meanwhile: read it again
			} else if err != nil {
				return err
			} else {
				ids = append(ids, e.ID)
			}
		}
		if !waiting {
			break
		}
		if s.clock.Now().After(deadline) {
			return front.Fail(front.ErrConflict, "stop of %q: it is being admitted from the queue; stop it again in a moment", jobID)
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-s.clock.After(100 * time.Millisecond):
		}
	}
	if len(ids) > 0 {
		w.Header().Set(dequeuedHeader, strings.Join(ids, ","))
	}
	s.passThrough(w, r, jc.body)
	return nil
}

// A stop waits up to stopWaitsForAdmission for an entry the leader claimed
// less than admissionInFlight ago (an older claim is a registration that
// failed: the entry is taken out like any other).
const (
	stopWaitsForAdmission = 10 * time.Second
	admissionInFlight     = 30 * time.Second
)
