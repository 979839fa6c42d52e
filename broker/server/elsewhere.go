package server

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"
)

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

// checkRegion passes a call for a region the broker governs (its own, or
// one of broker.hcl's region blocks). One for another region goes to that
// region's broker when policy names it (that broker decides with that
// region's usage), and is refused otherwise.
func (s *Server) checkRegion(w http.ResponseWriter, r *http.Request, region, jobID string, body []byte) bool {
	if region == "" || region == s.region || region == api.GlobalRegion || (s.regions != nil && s.regions.Governs(region)) {
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
