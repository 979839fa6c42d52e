package gpuapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// serveGPU serves the broker's own API, /v1/gpu/, to a caller with a valid
// token when ACLs are on.
func (s *API) serveGPU(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/gpu/health" && r.Method == http.MethodGet {
		front.Respond(s.log, s.health)(w, r) // for health checks, which hold no token
		return
	}
	who, _, err := s.callers.As(r).Resolve()
	if s.acls && (err != nil || front.Token(r) == "") {
		if err == nil {
			err = errors.New("no token given")
		}
		front.WriteError(w, front.Fail(front.ErrForbidden, "the broker's API needs a valid Nomad ACL token: %v", err))
		return
	}
	s.api.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, who)))
}

// health answers 200 while the broker can do its work, else 503 with why:
// Nomad refuses its own token (the leader admits nothing from the queue).
// It says nothing of any tenant or job.
func (s *API) health(http.ResponseWriter, *http.Request) (any, error) {
	if s.healthy != nil {
		if why := s.healthy(); why != "" {
			return nil, front.Fail(front.ErrUnavailable, "unhealthy: %s", why)
		}
	}
	return map[string]string{"status": "ok"}, nil
}

// callerKey holds the caller's identity in a request to the broker's API.
type callerKey struct{}

// apiCaller is who calls the broker's API.
func apiCaller(r *http.Request) string { s, _ := r.Context().Value(callerKey{}).(string); return s }

// gpuAPI routes /v1/gpu/: the broker's own paths, so Go's ServeMux patterns
// read them (Nomad's paths keep Nomad's reading, in route). A path it serves
// answers other methods 405, one it does not serve 404, both in its words;
// an endpoint whose store this broker lacks is not served.
func (s *API) gpuAPI() http.Handler {
	mux := http.NewServeMux()
	fallback := map[string]bool{}
	for _, e := range s.gpuRoutes() {
		for _, m := range strings.Fields(e.methods) {
			mux.HandleFunc(m+" "+e.path, front.Respond(s.log, func(w http.ResponseWriter, r *http.Request) (any, error) {
				if !e.served() {
					return nil, noEndpoint(r)
				}
				return e.h(w, r)
			}))
		}
		if fallback[e.path] {
			continue
		}
		fallback[e.path] = true
		// Any other method on the path: 405, in the broker's words.
		mux.HandleFunc(e.path, front.Respond(s.log, func(_ http.ResponseWriter, r *http.Request) (any, error) {
			if !e.served() {
				return nil, noEndpoint(r)
			}
			return nil, notAllowed(r)
		}))
	}
	mux.HandleFunc("/v1/gpu/", front.Respond(s.log, func(_ http.ResponseWriter, r *http.Request) (any, error) { return nil, noEndpoint(r) }))
	return mux
}

// gpuRoute is one of the broker's own endpoints: its methods, its path as a
// ServeMux pattern, whether this broker serves it (has its store).
type gpuRoute struct {
	methods, path string
	served        func() bool
	h             front.Handler
}

func (s *API) gpuRoutes() []gpuRoute {
	always := func() bool { return true }
	approvals := func() bool { return s.approvalStore != nil }
	stored := func() bool { return s.stored != nil }
	decisions := func() bool { return s.decisions != nil }
	setAside := func() bool { return s.setAside != nil }
	policyStatus := func() bool { return s.policyStatus != nil }
	regions := func() bool { return s.regions != nil }
	drains := func() bool { return s.regions != nil && s.drains != nil }
	return []gpuRoute{
		{"GET", "/v1/gpu/usage", always, func(w http.ResponseWriter, r *http.Request) (any, error) {
			if r.URL.Query().Has("from") {
				return s.usageReport(r)
			}
			return s.usage(r)
		}},
		{"GET", "/v1/gpu/nodes", always, s.gpuMap},
		{"GET", "/v1/gpu/queue", always, s.queueList},
		{"GET DELETE", "/v1/gpu/queue/{id}", always, func(_ http.ResponseWriter, r *http.Request) (any, error) {
			return s.queueEntry(r, r.PathValue("id"), apiCaller(r))
		}},
		{"GET", "/v1/gpu/approvals", approvals, s.approvalList},
		{"POST PUT", "/v1/gpu/approvals", approvals, func(_ http.ResponseWriter, r *http.Request) (any, error) {
			return s.requestApproval(r, apiCaller(r))
		}},
		{"GET", "/v1/gpu/approvals/{id}", approvals, func(_ http.ResponseWriter, r *http.Request) (any, error) {
			return s.readApproval(r, r.PathValue("id"))
		}},
		{"POST PUT", "/v1/gpu/approvals/{id}/{verb}", approvals, oneOf("grant", "deny", "id", s.decideApproval)},
		{"GET", "/v1/gpu/regions", regions, func(http.ResponseWriter, *http.Request) (any, error) { return s.regions.Status(), nil }},
		{"POST PUT", "/v1/gpu/regions/{name}/{verb}", drains, oneOf("drain", "resume", "name", s.drain)},
		{"GET", "/v1/gpu/audit", always, s.auditTrail},
		{"GET", "/v1/gpu/trace", stored, s.trace},
		{"GET", "/v1/gpu/rightsizing", stored, s.rightSizing},
		{"GET", "/v1/gpu/reclaim", decisions, s.reclaimList},
		{"GET", "/v1/gpu/quarantine", setAside, s.setAsideList},
		{"GET", "/v1/gpu/policy", policyStatus, func(http.ResponseWriter, *http.Request) (any, error) { return s.policyStatus(), nil }},
		{"GET DELETE", "/v1/gpu/reclaim/{id}", decisions, func(_ http.ResponseWriter, r *http.Request) (any, error) {
			return s.reclaimDecision(r, r.PathValue("id"), apiCaller(r))
		}},
	}
}

// oneOf serves a path ending in /{verb}, verb one or other: f gets the path's
// key, whether the verb was one, and the caller; another verb is 404.
func oneOf(one, other, key string, f func(r *http.Request, id string, isOne bool, who string) (any, error)) front.Handler {
	return func(_ http.ResponseWriter, r *http.Request) (any, error) {
		switch verb := r.PathValue("verb"); verb {
		case one, other:
			return f(r, r.PathValue(key), verb == one, apiCaller(r))
		default:
			return nil, noEndpoint(r)
		}
	}
}

// noEndpoint is the 404 of a path the broker's API does not serve.
func noEndpoint(r *http.Request) error {
	return front.Fail(front.ErrNotFound, "no such endpoint %s %s", r.Method, r.URL.Path)
}

// notAllowed is the 405 of a method a path of the broker's API does not serve.
func notAllowed(r *http.Request) error {
	return front.Fail(front.ErrNotAllowed, "%s not allowed on %s", r.Method, r.URL.Path)
}

// queueList serves the queue in admission order, as far as the caller may
// read it, without the requests (each its submitter's alone). As Nomad's
// lists: ?per_page=N pages it (X-Nomad-NextToken names where the next page
// starts, for ?next_token=), and ?index=N&wait= blocks until the queue
// changes (X-Nomad-Index is the queue's Consul index). X-Nomad-Gpu-Queued
// is how many the caller may read in all.
func (s *API) queueList(w http.ResponseWriter, r *http.Request) (any, error) {
	if err := blockingQuery(r, s.queue.Index); err != nil {
		return nil, err
	}
	perPage, err := atLeastOne(r, "per_page", 0, "a count of at least 1")
	if err != nil {
		return nil, err
	}
	from, err := atLeastOne(r, "next_token", 1, "one this broker gave (X-Nomad-NextToken)")
	if err != nil {
		return nil, err
	}
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(s.queue.Index(), 10))
	entries, err := s.desk.Ordered(r)
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	out := []QueuedJob{}
	readable := map[string]bool{}
	estimates := s.desk.Estimates(entries)
	visible := 0
	for i, e := range entries {
		if !s.access.MayRead(r, e.Namespace, readable) {
			continue
		}
		visible++
		switch {
		case visible < from:
		case perPage > 0 && len(out) == perPage:
			if w.Header().Get("X-Nomad-NextToken") == "" {
				w.Header().Set("X-Nomad-NextToken", strconv.Itoa(visible))
			}
		default:
			e.Request = nil
			out = append(out, QueuedJob{Position: i + 1, Entry: e, Estimate: front.EstimateIn(estimates, e.ID), Backoff: s.backoff(e.Namespace, e.JobID)})
		}
	}
	w.Header().Set("X-Nomad-Gpu-Queued", strconv.Itoa(visible))
	return out, nil
}

// atLeastOne reads query parameter name, a whole number of at least 1
// (absent: def); an error says it is not what, as a 400.
func atLeastOne(r *http.Request, name string, def int, what string) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, front.Fail(front.ErrBadRequest, "%s=%q is not %s", name, v, what)
	}
	return n, nil
}
