package server

import (
	"net/http"
	"slices"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
)

// drain drains a governed region (no new work goes there; its running work
// finishes there) or resumes it, for every broker, with the caller's name
// and the time recorded and audited. With ACLs on it needs a management
// token, as Nomad's own operator calls do.
func (s *Server) drain(w http.ResponseWriter, r *http.Request, region string, drain bool, who string) {
	if !slices.Contains(s.regions.Names(), region) {
		writeError(w, fail(errNotFound, "region %q is not one this broker governs (gpu-broker region list)", region))
		return
	}
	if s.acls {
		g, err := s.as(r).grants()
		if err != nil || !g.Management {
			writeError(w, fail(errForbidden, "draining or resuming a region needs a management token: %v", err))
			return
		}
	}
	by, what := "", audit.RegionResume
	if drain {
		by, what = "by "+who+" at "+s.clock.Now().UTC().Format(time.RFC3339), audit.RegionDrain
	}
	if !s.audited(w, audit.Event{Who: who, What: what, Result: "region " + region}) {
		return
	}
	drained, err := s.drains.Set(r.Context(), region, by)
	if err != nil {
		writeError(w, fail(errUnavailable, "%v", err))
		return
	}
	s.regions.SetDrained(drained) // at once here; the other brokers follow the key
	writeJSON(w, http.StatusOK, s.regions.Status())
}
