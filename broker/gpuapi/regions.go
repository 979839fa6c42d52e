package gpuapi

import (
	"net/http"
	"slices"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// drain drains a governed region (no new work goes there; its running work
// finishes there) or resumes it, for every broker, with the caller's name
// and the time recorded and audited. With ACLs on it needs a management
// token, as Nomad's own operator calls do.
func (s *API) drain(r *http.Request, region string, drain bool, who string) (any, error) {
	if !slices.Contains(s.regions.Names(), region) {
		return nil, front.Fail(front.ErrNotFound, "region %q is not one this broker governs (gpu-broker region list)", region)
	}
	if s.acls {
		g, err := s.callers.As(r).Grants()
		if err != nil || !g.Management {
			return nil, front.Fail(front.ErrForbidden, "draining or resuming a region needs a management token: %v", err)
		}
	}
	by, what := "", audit.RegionResume
	if drain {
		by, what = "by "+who+" at "+s.clock.Now().UTC().Format(time.RFC3339), audit.RegionDrain
	}
	if err := front.Audited(s.audit, audit.Event{Who: who, What: what, Result: "region " + region}); err != nil {
		return nil, err
	}
	drained, err := s.drains.Set(r.Context(), region, by)
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	s.regions.SetDrained(drained) // at once here; the other brokers follow the key
	return s.regions.Status(), nil
}
