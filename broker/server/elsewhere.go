package server

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// Headers marking a GPU request one broker sent on to another: a follower to
// its leader, or a broker to another region's; none is sent on twice.
const (
	forwardedHeader       = "X-Nomad-Gpu-Forwarded"
	regionForwardedHeader = "X-Nomad-Gpu-Region-Forwarded"
)

// admitsHere is nil when this broker decides on a GPU request. A follower
// hands it to the leader (body as received), whose answer it relays; a
// request sent on by another broker to one that is no longer leader is
// refused rather than sent on again.
func (s *Server) admitsHere(r *http.Request, body []byte) error {
	if s.leader == nil || s.leader.IsLeader() {
		return nil
	}
	if r.Header.Get(forwardedHeader) != "" {
		return front.Fail(front.ErrUnavailable, "the broker leader changed while deciding; try again")
	}
	addr, err := s.leader.LeaderAddress(r.Context())
	if err != nil {
		return front.Fail(front.ErrUnavailable, "GPU jobs are admitted by the broker leader, and there is none: %v", err)
	}
	return s.sendOn(r, addr, body, "the broker leader", forwardedHeader)
}

// sendOn hands the request (with body as given) to another broker at addr,
// whose answer is relayed, marked with header so that it is not sent on
// again.
func (s *Server) sendOn(r *http.Request, addr string, body []byte, who, header string) error {
	return &handedOff{to: who, serve: func(w http.ResponseWriter) { s.relayFrom(w, r, addr, body, who, header) }}
}

// relayFrom sends the request to the broker at addr and relays its answer.
func (s *Server) relayFrom(w http.ResponseWriter, r *http.Request, addr string, body []byte, who, header string) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(addr, "/")+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		front.WriteError(w, front.Fail(front.ErrInternal, "address of %s %q: %v", who, addr, err))
		return
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	req.Header.Set(header, "1")
	resp, err := s.leaderClient.Do(req)
	if err != nil {
		front.WriteError(w, front.Fail(front.ErrUnavailable, "%s at %s is unreachable: %v", who, addr, err))
		return
	}
	s.relay(w, resp)
}

// checkRegion passes a call for a region the broker governs (its own, or
// one of broker.hcl's region blocks). One for another region goes to that
// region's broker when policy names it (that broker decides with that
// region's usage), and is refused otherwise.
func (s *Server) checkRegion(r *http.Request, region, jobID string, body []byte) error {
	if region == "" || region == s.region || region == api.GlobalRegion || (s.regions != nil && s.regions.Governs(region)) {
		return nil
	}
	if other, ok := s.policies.Current().Regions[region]; ok && r.Header.Get(regionForwardedHeader) == "" {
		return s.sendOn(r, other.Broker, body, "region "+region+"'s broker", regionForwardedHeader)
	}
	return front.Fail(front.ErrForbidden, "job %q is for region %q, but this broker admits GPU jobs for region %q only, "+
		"and policy names no broker for region %s (region %q { broker = \"...\" })", jobID, region, s.region, region, region)
}
