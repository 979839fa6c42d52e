// Package server is the broker's HTTP front: Nomad's API passed through, except
// the calls that create or grow GPU demand, which go through admission first;
// and the broker's own API under /v1/gpu/.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// MaxBody is the largest request body the broker reads (Nomad's jobs are far smaller).
const MaxBody = 16 << 20

// Policies gives the policy in force.
type Policies interface {
	Current() *policy.Policy
}

// Cluster is the usage admission decides against.
type Cluster interface {
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	ObserveJob(j *api.Job)
}

// Queue is where jobs wait.
type Queue interface {
	Put(ctx context.Context, e queue.Entry) error
	List(ctx context.Context) ([]queue.Entry, error)
	Get(ctx context.Context, id string) (queue.Entry, error)
	Remove(ctx context.Context, e queue.Entry) (bool, error)
}

// Server handles the broker's HTTP traffic.
type Server struct {
	log      hclog.Logger
	upstream *url.URL
	proxy    *httputil.ReverseProxy
	client   *http.Client
	policies Policies
	cluster  Cluster
	queue    Queue
	stamper  nomadjob.Stamper
	now      func() time.Time
	newID    func() string

	idMu       sync.Mutex
	identities map[string]cachedIdentity
}

// Options are what a Server is built from; Now and NewID default to the real ones.
type Options struct {
	Log      hclog.Logger
	Nomad    string // upstream address
	Client   *http.Client
	Policies Policies
	Cluster  Cluster
	Queue    Queue
	Stamper  nomadjob.Stamper
	Now      func() time.Time
	NewID    func() string
}

// New returns a server forwarding to o.Nomad.
func New(o Options) (*Server, error) {
	u, err := url.Parse(o.Nomad)
	if err != nil {
		return nil, fmt.Errorf("nomad address %q: %w", o.Nomad, err)
	}
	s := &Server{log: o.Log, upstream: u, client: o.Client, policies: o.Policies, cluster: o.Cluster,
		queue: o.Queue, stamper: o.Stamper, now: o.Now, newID: o.NewID, identities: map[string]cachedIdentity{}}
	if s.client == nil {
		s.client = &http.Client{}
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.newID == nil {
		s.newID = newUUID
	}
	s.proxy = httputil.NewSingleHostReverseProxy(u)
	s.proxy.FlushInterval = -1 // blocking queries, logs and event streams flow as they come
	s.proxy.Transport = s.client.Transport
	return s, nil
}

// Handler routes a request: intercepted calls, the broker's API, or Nomad.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		write := r.Method == http.MethodPut || r.Method == http.MethodPost
		switch {
		case strings.HasPrefix(path, "/v1/gpu/"):
			s.serveGPU(w, r)
		case write && (path == "/v1/jobs" || isJobPath(path, "")):
			s.register(w, r)
		case write && isJobPath(path, "plan"):
			s.annotate(w, r, true)
		case write && path == "/v1/validate/job":
			s.annotate(w, r, false)
		case write && isJobPath(path, "scale"):
			s.scale(w, r)
		case write && isJobPath(path, "dispatch"):
			s.dispatch(w, r)
		case write && isJobPath(path, "revert"):
			s.revert(w, r)
		case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/evaluation/"):
			s.evaluation(w, r)
		default:
			s.proxy.ServeHTTP(w, r)
		}
	})
}

// isJobPath matches /v1/job/<id> (suffix "") or /v1/job/<id>/<suffix>.
func isJobPath(path, suffix string) bool {
	rest, ok := strings.CutPrefix(path, "/v1/job/")
	if !ok || rest == "" {
		return false
	}
	id, tail, has := strings.Cut(rest, "/")
	if id == "" {
		return false
	}
	if suffix == "" {
		return !has
	}
	return has && tail == suffix
}

func jobIDFromPath(path string) string {
	rest := strings.TrimPrefix(path, "/v1/job/")
	id, _, _ := strings.Cut(rest, "/")
	if u, err := url.PathUnescape(id); err == nil {
		return u
	}
	return id
}

// requestJob is a job register (or plan, or validate) body: kept as a generic
// map so that what the broker forwards differs only where admission changed it.
type requestJob struct {
	raw     map[string]any
	jobRaw  map[string]any
	job     *api.Job
	ns      string
	jobID   string
	request []byte
}

func readJobRequest(r *http.Request) (*requestJob, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, fmt.Errorf("request body larger than %d bytes", MaxBody)
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	rj := &requestJob{request: body}
	if err := json.Unmarshal(body, &rj.raw); err != nil {
		return nil, fmt.Errorf("malformed JSON in request body: %w", err)
	}
	jobRaw, ok := rj.raw["Job"].(map[string]any)
	if !ok {
		return nil, errors.New(`malformed request: no "Job" object in the body`)
	}
	rj.jobRaw = jobRaw
	jobJSON, _ := json.Marshal(jobRaw)
	if err := json.Unmarshal(jobJSON, &rj.job); err != nil {
		return nil, fmt.Errorf("malformed job: %w", err)
	}
	rj.ns = nomadjob.Namespace(rj.job, r.URL.Query().Get("namespace"))
	if rj.job.ID != nil {
		rj.jobID = *rj.job.ID
	}
	return rj, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError answers in Nomad's style: the CLI prints the body after the code.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, format, args...)
}

// forward sends body to Nomad at the request's path and query with the caller's
// headers (X-Nomad-Token included), and returns Nomad's answer.
func (s *Server) forward(r *http.Request, body []byte) (*http.Response, error) {
	u := *s.upstream
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	req, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	// The broker reads these answers: let the transport negotiate compression.
	req.Header.Del("Accept-Encoding")
	return s.client.Do(req)
}

// relay copies Nomad's answer to the caller, adding warnings to a JSON object
// answer's Warnings field.
func (s *Server) relay(w http.ResponseWriter, resp *http.Response, warnings ...string) {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		writeError(w, http.StatusBadGateway, "nomad-gpu: reading Nomad's answer: %v", err)
		return
	}
	if resp.StatusCode == http.StatusOK && len(warnings) > 0 {
		var obj map[string]any
		if json.Unmarshal(body, &obj) == nil {
			prev, _ := obj["Warnings"].(string)
			obj["Warnings"] = joinWarnings(append([]string{prev}, warnings...)...)
			body, _ = json.Marshal(obj)
		}
	}
	for k, vs := range resp.Header {
		if k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
}

func joinWarnings(ws ...string) string {
	var out []string
	for _, w := range ws {
		if w = strings.TrimSpace(w); w != "" {
			out = append(out, w)
		}
	}
	return strings.Join(out, "\n")
}

func (s *Server) passThrough(w http.ResponseWriter, r *http.Request, body []byte) {
	resp, err := s.forward(r, body)
	if err != nil {
		writeError(w, http.StatusBadGateway, "nomad-gpu: Nomad is unreachable: %v", err)
		return
	}
	s.relay(w, resp)
}
