// Package server is the broker's HTTP front: Nomad's API passed through, except
// the calls that create or grow GPU demand, which go through admission first;
// and the broker's own API under /v1/gpu/.
package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/broker/webui"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// Cluster is what the gate decides against (decide.Cluster).
type Cluster interface {
	decide.Cluster
	// UsageWithout is the usage without job namespace/jobID ("": all).
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	// LockJob holds off other decisions on one job (the queue's too).
	LockJob(namespace, id string) (unlock func())
	// CgroupBoundGPUNodes are region's GPU nodes where exec and raw_exec
	// tasks cannot open their GPUs, and how many GPU nodes it has.
	CgroupBoundGPUNodes(region string) (bound []string, of int)
}

// Regions are the Nomad regions the broker governs (cluster.Regions).
type Regions interface {
	// Governs reports whether region, as a request names it, is one.
	Governs(region string) bool
	// RegionOf is the one other region than the broker's own that has a
	// live job of namespace with id (or, with prefix, an id starting with
	// it); "" if none.
	RegionOf(namespace, id string, prefix bool) string
	// Names are the regions governed, the broker's own first.
	Names() []string
}

// Profiles are the leader's right-sizing profiles of jobs.
type Profiles interface {
	Get(namespace, job string) (usage.Profile, bool)
}

// Leader tells whether this broker takes GPU admissions, and where the one that
// does is.
type Leader interface {
	IsLeader() bool
	LeaderAddress(ctx context.Context) (string, error)
}

// Server handles the broker's HTTP traffic.
type Server struct {
	log      hclog.Logger
	upstream *url.URL
	proxy    *httputil.ReverseProxy
	client   *http.Client
	// leaderClient reaches the other brokers.
	leaderClient  *http.Client
	policies      policy.Source
	cluster       Cluster
	queue         front.Queue
	maxQueueBytes int64
	scales        decide.GrantRecords
	stops         decide.StopRecords
	writes        decide.RegistrationRecords
	profiles      Profiles
	metrics       *metrics.Metrics
	fairShare     front.FairShare
	audit         *audit.Log
	approvalStore front.Approvals
	preemptions   admission.Preemptions
	synced        func() bool
	forecast      *queue.Forecast
	ui            http.Handler // the web UI at /gpu/
	api           http.Handler // the broker's own API at /v1/gpu/ (gpuapi)
	// metricsHandler serves /metrics (nil: none).
	metricsHandler http.Handler
	stamper        nomadjob.Stamper
	region         string
	regions        Regions // nil: the own region alone
	acls           bool
	exclusive      bool
	token          func() string
	leader         Leader
	clock          clock.Clock
	newID          func() string

	large           bodySlots
	bodyReadTimeout time.Duration

	// seq is the admission sequence every call that grows GPU demand goes
	// through; callers reads Nomad as the caller.
	seq     *decide.Sequence
	callers *front.Callers
	// desk and access are the queue as callers see it, and what each may
	// do, as the API sees them too.
	desk   *front.Desk
	access *front.Access
}

// Options are what a Server is built from; Clock and NewID default to the real ones.
type Options struct {
	Log      hclog.Logger
	Nomad    string // upstream address
	Client   *http.Client
	Policies policy.Source
	Cluster  Cluster
	Queue    front.Queue
	// MaxQueueBytes bounds the requests all queued jobs keep together
	// (config max_queue_bytes; 0: no bound).
	MaxQueueBytes int64
	// Scales keeps what the broker admitted for scaled jobs (nil: nothing kept).
	Scales decide.GrantRecords
	// Stops are the jobs the broker admitted that Nomad stopped since (nil:
	// none kept): a registration through the broker revives one.
	Stops decide.StopRecords
	// Writes record the JobModifyIndex of each version of a job the broker
	// makes (nil: none kept).
	Writes decide.RegistrationRecords
	// Profiles (the leader's) warn a job submitted again that it asks for
	// far more GPUs than it kept busy (nil: no warning).
	Profiles  Profiles
	Metrics   *metrics.Metrics // nil: no /metrics
	FairShare front.FairShare  // nil: the queue is shown by current share
	Audit     *audit.Log       // nil: no audit trail
	Approvals front.Approvals  // nil: no approvals
	// Preemptions are jobs' preemptions while borrowed, for their re-borrow
	// backoff (nil: none kept).
	Preemptions admission.Preemptions
	// Synced reports whether the cluster view has listed Nomad once (nil:
	// taken as listed, for a view built by hand). Until then usage reads
	// as none: nothing is decided, and the queue's order is not shown.
	Synced   func() bool
	Forecast *queue.Forecast // running jobs' ends, for queue estimates (nil: none)
	Stamper  nomadjob.Stamper
	Region   string // the broker's own Nomad region ("" or "global": Nomad's default)
	// Regions are the regions it governs, its own and those of broker.hcl's
	// region blocks (nil: its own alone).
	Regions Regions
	Leader  Leader // nil: this broker takes every admission itself
	ACLs    bool   // Nomad enforces ACLs: what the caller may do is Nomad's to say
	// Exclusive enforcement: the broker writes jobs in tenant namespaces with
	// Token, its own (read at each call: the operator may replace it), for
	// the tenants' submitters.
	Exclusive bool
	Token     func() string
	// Peers reaches the other brokers (TLS as they serve it); nil: a plain client.
	Peers *http.Client
	// BodyReadTimeout bounds how long a request body may take to arrive
	// (0: DefaultBodyReadTimeout).
	BodyReadTimeout time.Duration
	Clock           clock.Clock // nil: clock.Real
	NewID           func() string
	// API serves the broker's own API, /v1/gpu/ (gpuapi; nil: not served).
	API http.Handler
}

// New returns a server forwarding to o.Nomad.
func New(o Options) (*Server, error) {
	u, err := url.Parse(o.Nomad)
	if err != nil {
		return nil, fmt.Errorf("nomad address %q: %w", o.Nomad, err)
	}
	s := &Server{log: o.Log, upstream: u, client: o.Client, policies: o.Policies, cluster: o.Cluster,
		queue: o.Queue, maxQueueBytes: o.MaxQueueBytes, scales: o.Scales, stops: o.Stops, writes: o.Writes, profiles: o.Profiles, metrics: o.Metrics, fairShare: o.FairShare, audit: o.Audit, approvalStore: o.Approvals, preemptions: o.Preemptions, synced: o.Synced, forecast: o.Forecast, stamper: o.Stamper, region: o.Region, regions: o.Regions, acls: o.ACLs, exclusive: o.Exclusive, token: o.Token, leader: o.Leader, clock: o.Clock, newID: o.NewID, ui: webui.Handler(), api: o.API}
	if s.client == nil {
		s.client = &http.Client{}
	}
	if o.Metrics != nil {
		s.metricsHandler = promhttp.HandlerFor(o.Metrics.Registry, promhttp.HandlerOpts{})
	}
	s.leaderClient = o.Peers
	if s.leaderClient == nil {
		s.leaderClient = &http.Client{}
	}
	s.bodyReadTimeout = o.BodyReadTimeout
	if s.bodyReadTimeout <= 0 {
		s.bodyReadTimeout = DefaultBodyReadTimeout
	}
	if s.region == "" || s.region == api.GlobalRegion {
		s.region = api.GlobalRegion
	}
	if s.clock == nil {
		s.clock = clock.Real
	}
	if s.newID == nil {
		s.newID = queue.NewID
	}
	s.callers = front.NewCallers(u, s.client, s.clock)
	s.desk = &front.Desk{Queue: s.queue, Policies: s.policies, Usage: s.cluster, Forecast: s.forecast, FairShare: s.fairShare,
		Clock: s.clock, Log: s.log, Audit: s.audit, Metrics: s.metrics, Synced: s.synced}
	s.access = &front.Access{ACLs: s.acls, Exclusive: s.exclusive, Policies: s.policies, Callers: s.callers}
	s.seq = &decide.Sequence{Cluster: s.cluster, Enricher: enrich.Enricher{Preemptions: s.preemptions, Clock: s.clock, Approvals: func() []approval.Approval { return front.InForce(s.approvalStore) }}}
	s.proxy = httputil.NewSingleHostReverseProxy(u)
	s.proxy.FlushInterval = -1 // blocking queries, logs and event streams flow as they come
	s.proxy.Transport = s.client.Transport
	s.proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() != nil {
			return // the caller went away: no one reads an answer
		}
		s.log.Warn("Nomad did not answer a call passed through", "method", r.Method, "path", r.URL.Path, "error", err)
		front.WriteError(w, front.Fail(front.ErrNomadUnreach, "Nomad did not answer %s %s: %v", r.Method, r.URL.Path, err))
	}
	return s, nil
}

// Handler routes a request: the broker's own paths, the gate's calls, or
// Nomad.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.metrics != nil {
			start := s.clock.Now()
			defer func() { s.metrics.Request(requestClass(r), s.clock.Now().Sub(start)) }()
		}
		r = withWriteAuth(r)
		p := r.URL.Path
		if clean := cleanPath(p); clean != p {
			// As Nomad's router does: a call is only ever acted on at its clean path.
			u := *r.URL
			u.Path = clean
			http.Redirect(w, r, u.String(), http.StatusMovedPermanently)
			return
		}
		if s.serveOwn(w, r) {
			return
		}
		rt := route(r.Method, p)
		switch rt.class {
		case unknown:
			if err := s.unclassified(r, rt); err != nil {
				answer(w, err)
				return
			}
		case refused:
			front.WriteError(w, front.Fail(front.ErrForbidden, "%s %s refused: %s", r.Method, rt.pattern, rt.why))
			return
		}
		if err := s.desk.Listed(); rt.call != callNone && err != nil {
			front.WriteError(w, err)
			return
		}
		if rt.call != callNone && (r.ContentLength > LargeBody || r.ContentLength < 0) {
			release, err := s.large.take(clientOf(r))
			if err != nil {
				answer(w, unreadBody{err})
				return
			}
			defer release()
		}
		s.gate(w, r, rt.call, rt.id)
	})
}

// unclassified lets a write through that the route table does not know (a
// newer Nomad's route, or a method Nomad does not write with there), or
// refuses it. With exclusive enforcement it is refused: it may create GPU
// demand past the gate. Otherwise it is passed through, logged and counted
// by its route's pattern.
func (s *Server) unclassified(r *http.Request, rt routed) error {
	if s.exclusive {
		return front.Fail(front.ErrForbidden, "%s on route %s refused: the broker does not know this write of Nomad's API to be GPU-neutral, "+
			"and with exclusive enforcement only writes it knows pass", r.Method, rt.pattern)
	}
	s.log.Warn("passed through a write the broker does not know to be GPU-neutral", "method", r.Method, "path", r.URL.Path, "route", rt.pattern)
	s.metrics.UnclassifiedWrite(rt.pattern)
	return nil
}

// serveOwn serves the broker's own paths (its API, the web UI, /metrics)
// and reports whether r was one.
func (s *Server) serveOwn(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/v1/gpu/"):
		if s.api == nil {
			front.WriteError(w, front.Fail(front.ErrNotFound, "no such endpoint %s %s", r.Method, r.URL.Path))
			return true
		}
		s.api.ServeHTTP(w, r)
	case p == strings.TrimSuffix(webui.Prefix, "/"):
		http.Redirect(w, r, webui.Prefix, http.StatusMovedPermanently)
	case strings.HasPrefix(p, webui.Prefix):
		s.ui.ServeHTTP(w, r)
	case p == "/metrics" && s.metricsHandler != nil:
		// Nomad has no /metrics (its own are at /v1/metrics, passed through).
		s.metricsHandler.ServeHTTP(w, r)
	default:
		return false
	}
	return true
}

// gate sends a call of Nomad's API to its handler: c (callNone: any other
// call, passed through) on job jobID. A handler relays Nomad's answer
// itself; what it returns instead, a refusal or a hand-off, is answered.
func (s *Server) gate(w http.ResponseWriter, r *http.Request, c call, jobID string) {
	answer(w, s.gateCall(w, r, c, jobID))
}

func (s *Server) gateCall(w http.ResponseWriter, r *http.Request, c call, jobID string) error {
	var jc jobCall
	switch c {
	case callScale, callDispatch, callPeriodicForce, callRevert, callStable, callEvaluate, callJobWrite, callDeploymentWrite:
		var err error
		if jc, err = s.readJobCall(w, r, c); err != nil {
			return err
		}
		if c == callDeploymentWrite {
			err = s.authorizeDeployment(r, jc.namespace, jobID)
		} else {
			err = s.authorize(r, c.String(), jc.namespace)
		}
		if err != nil {
			return err
		}
	}
	switch c {
	case callRegister:
		return s.register(w, r, jobID)
	case callPlan:
		return s.annotate(w, r, nomadjob.Plan, jobID)
	case callValidate:
		return s.annotate(w, r, nomadjob.Validate, "")
	case callScale:
		return s.scale(w, r, jc, jobID)
	case callDispatch, callPeriodicForce:
		return s.spawn(w, r, c, jc, jobID)
	case callRevert:
		return s.revert(w, r, jc, jobID)
	case callStable:
		return s.stable(w, r, jc, jobID)
	case callEvaluate:
		return s.evaluate(w, r, jc, jobID)
	case callDeploymentWrite:
		return s.deploymentWrite(w, r, jc, r.URL.Path, jobID)
	case callJobWrite:
		if r.Method == http.MethodDelete {
			return s.stop(w, r, jc, jobID)
		}
		s.passThrough(w, r, jc.body)
	default:
		switch {
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/evaluation/"):
			s.evaluation(w, r)
		case r.Method == http.MethodGet && byID(r.URL.Path):
			s.readAnyRegion(w, r)
		default:
			if r.Method == http.MethodGet {
				s.toJobsRegion(r)
			}
			s.proxy.ServeHTTP(w, r)
		}
	}
	return nil
}

// toJobsRegion sends a read of a job to the region the broker dispatched
// the job to, when the read names no region other than the broker's own and
// that region alone has the job. The read is GET /v1/job/<id>[/…], or the
// jobs listing by prefix that `nomad job status <id>` starts with. So a job
// that left its region to the broker is found without -region.
func (s *Server) toJobsRegion(r *http.Request) {
	q := r.URL.Query()
	if s.regions == nil || q.Get("namespace") == "*" {
		return
	}
	if region := q.Get("region"); region != "" && region != s.region && region != api.GlobalRegion {
		return
	}
	namespace := nomadjob.ResolveNamespace(q.Get("namespace"), "", "")
	found := ""
	switch rest, ok := strings.CutPrefix(r.URL.Path, "/v1/job/"); {
	case ok && rest != "":
		// The id, or the id and one of Nomad's sub-paths (allocations,
		// summary, …): a parameterized job's child has a "/" in its id.
		if found = s.regions.RegionOf(namespace, rest, false); found == "" {
			if i := strings.LastIndex(rest, "/"); i > 0 {
				found = s.regions.RegionOf(namespace, rest[:i], false)
			}
		}
	case r.URL.Path == "/v1/jobs" && q.Get("prefix") != "":
		found = s.regions.RegionOf(namespace, q.Get("prefix"), true)
	}
	if found != "" {
		q.Set("region", found)
		r.URL.RawQuery = q.Encode()
	}
}

// byID reports whether path reads an evaluation, allocation or deployment
// by its id (or something of it).
func byID(path string) bool {
	for _, p := range []string{"/v1/evaluation/", "/v1/allocation/", "/v1/deployment/"} {
		if rest, ok := strings.CutPrefix(path, p); ok && rest != "" {
			return true
		}
	}
	return false
}

// readAnyRegion answers a read by id (byID) that names no other region than
// the broker's own from its own region. Where that has no such object
// (404), the first other region governed that has answers. So the
// evaluation, allocations and deployment of a job the broker dispatched to
// another region are found by their ids, as `nomad job run` follows them.
func (s *Server) readAnyRegion(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	region := q.Get("region")
	if s.regions == nil || len(s.regions.Names()) < 2 || region != "" && region != s.region && region != api.GlobalRegion {
		s.proxy.ServeHTTP(w, r)
		return
	}
	resp, err := s.forward(r, nil, "")
	for _, name := range s.regions.Names()[1:] {
		if err != nil || resp.StatusCode != http.StatusNotFound {
			break
		}
		resp.Body.Close()
		q.Set("region", name)
		again := r.Clone(r.Context())
		again.URL.RawQuery = q.Encode()
		resp, err = s.forward(again, nil, "")
	}
	if err != nil {
		front.WriteError(w, front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err))
		return
	}
	s.relay(w, resp)
}

// forward sends body to Nomad at the request's path and query with the caller's
// headers (its token included), and returns Nomad's answer. A namespace, when
// given, replaces the query's: the one the broker resolved and decided on.
func (s *Server) forward(r *http.Request, body []byte, namespace string) (*http.Response, error) {
	u := *s.upstream
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	if namespace != "" {
		q := r.URL.Query()
		q.Set("namespace", namespace)
		u.RawQuery = q.Encode()
	}
	// A write is not cancelled when its caller leaves: Nomad may have taken
	// it already, and what the broker records of it (a grant, a stop
	// record, a reservation) follows Nomad's answer, not the caller's
	// patience. A read (a blocking query among them) ends with its caller.
	ctx := r.Context()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		ctx = context.WithoutCancel(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	s.setWriter(r, req)
	// The broker reads these answers: let the transport negotiate compression.
	req.Header.Del("Accept-Encoding")
	return s.client.Do(req)
}

// relay copies Nomad's answer to the caller, adding warnings to a JSON object
// answer's Warnings field.
func (s *Server) relay(w http.ResponseWriter, resp *http.Response, warnings ...string) {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	s.relayBody(w, resp, body, err, warnings...)
}

// relayBody is relay of an answer already read.
func (s *Server) relayBody(w http.ResponseWriter, resp *http.Response, body []byte, err error, warnings ...string) {
	if err != nil {
		front.WriteError(w, front.Fail(front.ErrNomadUnreach, "reading Nomad's answer: %v", err))
		return
	}
	if resp.StatusCode == http.StatusOK && joinWarnings(warnings...) != "" {
		body = withWarnings(body, warnings)
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

// requestClass names the class of a request for the latency metric.
func requestClass(r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/v1/gpu/") {
		return "gpu-api"
	}
	if rt := route(r.Method, r.URL.Path); rt.call != callNone {
		return rt.call.String()
	}
	return "read"
}

// withWarnings is a JSON object answer with warnings added to its Warnings
// field; the rest stays as Nomad wrote it. Any other answer is left as it is.
func withWarnings(body []byte, warnings []string) []byte {
	var w struct{ Warnings any }
	doc, err := jsondoc.Parse(body, &w)
	if err != nil || !doc.Root().IsObject() {
		return body
	}
	prev, _ := w.Warnings.(string)
	return addWarnings(doc, prev, warnings)
}

// addWarnings is the answer doc, whose Warnings were prev, with warnings added.
func addWarnings(doc *jsondoc.Doc, prev string, warnings []string) []byte {
	doc.Root().Set("Warnings", joinWarnings(append([]string{prev}, warnings...)...))
	return doc.Bytes()
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

// toNomad hands the request to Nomad, with body as given (passThrough).
func (s *Server) toNomad(r *http.Request, body []byte, warnings ...string) error {
	return &handedOff{to: "Nomad", serve: func(w http.ResponseWriter) { s.passThrough(w, r, body, warnings...) }}
}

func (s *Server) passThrough(w http.ResponseWriter, r *http.Request, body []byte, warnings ...string) {
	resp, err := s.forward(r, body, "")
	if err != nil {
		front.WriteError(w, front.Fail(front.ErrNomadUnreach, "Nomad is unreachable: %v", err))
		return
	}
	s.relay(w, resp, warnings...)
}
