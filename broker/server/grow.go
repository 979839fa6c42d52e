package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Scale, dispatch and revert change GPU demand without a registration. They
// cannot wait in the queue (Nomad answers them at once), so what admission would
// not admit now is refused with the reason, and the user may try again later.

func (s *Server) scale(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req api.ScalingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "nomad-gpu: malformed JSON in scaling request: %v", err)
		return
	}
	job, ns, err := s.currentJob(r)
	if err != nil || req.Count == nil {
		s.passThrough(w, r, body) // let Nomad give its own answer
		return
	}
	for _, tg := range job.TaskGroups {
		if tg.Name != nil && *tg.Name == req.Target["Group"] {
			n := int(*req.Count)
			tg.Count = &n
		}
	}
	s.checkThenForward(w, r, body, job, ns, "scale")
}

func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	parent, ns, err := s.currentJob(r)
	if err != nil {
		s.passThrough(w, r, body)
		return
	}
	child := *parent
	child.ID = nil // a new job: nothing of it is counted yet
	s.checkThenForward(w, r, body, &child, ns, "dispatch")
}

func (s *Server) revert(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req api.JobRevertRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "nomad-gpu: malformed JSON in revert request: %v", err)
		return
	}
	versions, err := s.versions(r, r.URL.Query().Get("namespace"))
	if err != nil {
		s.passThrough(w, r, body)
		return
	}
	for _, v := range versions {
		if v.Version != nil && *v.Version == req.JobVersion {
			s.checkThenForward(w, r, body, v, nomadjob.Namespace(v, r.URL.Query().Get("namespace")), "revert")
			return
		}
	}
	s.passThrough(w, r, body)
}

// readBody reads a size-limited body, answering 400 itself when it cannot.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "nomad-gpu: read request body: %v", err)
		return nil, false
	}
	return body, true
}

// checkThenForward decides on job as it would be after the call; anything but an
// admission at the job's current priority is refused.
func (s *Server) checkThenForward(w http.ResponseWriter, r *http.Request, body []byte, job *api.Job, ns, what string) {
	p := s.policies.Current()
	id := ""
	if job.ID != nil {
		id = *job.ID
	}
	d := admission.Decide(p, nomadjob.Admission(job, ns), s.cluster.UsageWithout(p, ns, id))
	if d.Demand.Total() == 0 {
		s.passThrough(w, r, body)
		return
	}
	current := 0
	if job.Priority != nil {
		current = *job.Priority
	}
	switch {
	case d.Outcome == admission.Reject:
		writeError(w, http.StatusForbidden, "nomad-gpu: %s of %q rejected by rule %s: %s", what, jobIDFromPath(r.URL.Path), d.Rule, d.Reason)
	case d.Outcome == admission.Queue:
		writeError(w, http.StatusForbidden, "nomad-gpu: %s of %q refused for now: %s", what, jobIDFromPath(r.URL.Path), d.Reason)
	case d.Priority != current:
		writeError(w, http.StatusForbidden, "nomad-gpu: %s of %q refused: the result would run at priority %d (%s) but the job runs at %d; register it again instead",
			what, jobIDFromPath(r.URL.Path), d.Priority, d.Reason, current)
	default:
		s.passThrough(w, r, body)
	}
}

// currentJob reads the job named in the path with the caller's token.
func (s *Server) currentJob(r *http.Request) (*api.Job, string, error) {
	var job api.Job
	ns := r.URL.Query().Get("namespace")
	if err := s.get(r, "/v1/job/"+url.PathEscape(jobIDFromPath(r.URL.Path)), ns, &job); err != nil {
		return nil, "", err
	}
	return &job, nomadjob.Namespace(&job, ns), nil
}

func (s *Server) versions(r *http.Request, ns string) ([]*api.Job, error) {
	var resp struct{ Versions []*api.Job }
	err := s.get(r, "/v1/job/"+url.PathEscape(jobIDFromPath(r.URL.Path))+"/versions", ns, &resp)
	return resp.Versions, err
}

func (s *Server) get(r *http.Request, path, ns string, out any) error {
	u := *s.upstream
	u.Path = path
	if ns != "" {
		u.RawQuery = "namespace=" + url.QueryEscape(ns)
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if tok := r.Header.Get("X-Nomad-Token"); tok != "" {
		req.Header.Set("X-Nomad-Token", tok)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
