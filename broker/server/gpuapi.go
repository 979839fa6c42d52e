package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

func (s *Server) serveGPU(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/v1/gpu/")
	who, _, err := s.resolve(r)
	if s.acls && (err != nil || token(r) == "") {
		if err == nil {
			err = errors.New("no token given")
		}
		writeError(w, fail(errForbidden, "the broker's API needs a valid Nomad ACL token: %v", err))
		return
	}
	switch {
	case path == "usage" && r.Method == http.MethodGet && r.URL.Query().Has("from"):
		s.usageReport(w, r)
	case path == "usage" && r.Method == http.MethodGet:
		s.usage(w, r)
	case path == "nodes" && r.Method == http.MethodGet:
		s.gpuMap(w, r)
	case path == "queue" && r.Method == http.MethodGet:
		entries, err := s.ordered(r)
		if err != nil {
			writeError(w, fail(errUnavailable, "%v", err))
			return
		}
		out := []QueuedJob{}
		readable := map[string]bool{}
		estimates := s.estimates(entries)
		for i, e := range entries {
			if s.mayRead(r, e.Namespace, readable) {
				e.Request = nil // the request body is its submitter's alone
				out = append(out, QueuedJob{Position: i + 1, Entry: e, Estimate: estimateOf(estimates, e.ID)})
			}
		}
		writeJSON(w, http.StatusOK, out)
	case strings.HasPrefix(path, "queue/"):
		s.queueEntry(w, r, strings.TrimPrefix(path, "queue/"), who)
	case s.approvalStore != nil && (path == "approvals" || strings.HasPrefix(path, "approvals/")):
		s.approvals(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "approvals"), "/"), who)
	case path == "audit" && r.Method == http.MethodGet:
		s.auditTrail(w, r)
	case s.stored != nil && path == "trace" && r.Method == http.MethodGet:
		s.trace(w, r)
	case s.stored != nil && path == "rightsizing" && r.Method == http.MethodGet:
		s.rightSizing(w, r)
	case s.decisions != nil && path == "reclaim" && r.Method == http.MethodGet:
		s.reclaimList(w, r)
	case s.decisions != nil && strings.HasPrefix(path, "reclaim/"):
		s.reclaimDecision(w, r, strings.TrimPrefix(path, "reclaim/"), who)
	default:
		writeError(w, fail(errNotFound, "no such endpoint %s %s", r.Method, r.URL.Path))
	}
}

// mayRead reports whether the caller may read namespace ns (any capability
// there lets Nomad show the namespace); always with ACLs off.
func (s *Server) mayRead(r *http.Request, ns string, cache map[string]bool) bool {
	if !s.acls {
		return true
	}
	ok, seen := cache[ns]
	if !seen {
		ok = s.get(r, "/v1/namespace/"+url.PathEscape(ns), "", &struct{}{}) == nil
		cache[ns] = ok
	}
	return ok
}

// mayCancel reports whether the caller may cancel a queued job: its
// submitter, or anyone who may write that job in its namespace.
func (s *Server) mayCancel(r *http.Request, e queue.Entry, who string) bool {
	if !s.acls || (who == e.SubmittedBy && who != "anonymous") {
		return true
	}
	var req struct{ Job json.RawMessage }
	return json.Unmarshal(e.Request, &req) == nil && s.mayWrite(r, e.Namespace, e.JobID, req.Job)
}
