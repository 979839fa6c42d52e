package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim/reclaimtest"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestRouteReadsPathsAsNomadDoes(t *testing.T) {
	cases := []struct {
		method, path string
		class        class
		call         call
		id           string
	}{
		{"PUT", "/v1/jobs", decided, callRegister, ""},
		{"POST", "/v1/job/train", decided, callRegister, "train"},
		{"PUT", "/v1/job/", decided, callRegister, ""},                     // registers the job the body names
		{"PUT", "/v1/job/team/train", decided, callRegister, "team/train"}, // ids may hold "/"
		{"PUT", "/v1/job/a%2Fb", decided, callRegister, "a%2Fb"},           // already unescaped once by Go: never again
		{"PUT", "/v1/job/train/plan", decided, callPlan, "train"},
		{"PUT", "/v1/job/a/b/plan", decided, callPlan, "a/b"},
		{"PUT", "/v1/job/train/scale", decided, callScale, "train"},
		{"GET", "/v1/job/train/scale", read, callNone, ""},
		{"POST", "/v1/job/train/dispatch", decided, callDispatch, "train"},
		{"PUT", "/v1/job/train/revert", decided, callRevert, "train"},
		{"PUT", "/v1/job/nightly/periodic/force", decided, callPeriodicForce, "nightly"},
		{"PUT", "/v1/job/train/evaluate", decided, callEvaluate, "train"},
		{"POST", "/v1/job/train/stable", decided, callStable, "train"},
		{"GET", "/v1/job/train/evaluations", read, callNone, ""},
		{"PUT", "/v1/job/train/evaluations", unknown, callNone, "train"}, // Nomad: 405
		{"PUT", "/v1/job/x/plan/scale", decided, callScale, "x/plan"},    // the last suffix decides
		{"PUT", "/v1/validate/job", decided, callValidate, ""},
		{"DELETE", "/v1/job/train", neutral, callJobWrite, "train"},           // stop
		{"DELETE", "/v1/job/team/train", neutral, callJobWrite, "team/train"}, // stop
		{"DELETE", "/v1/job/train/plan", unknown, callNone, "train"},          // Nomad: 405
		{"DELETE", "/v1/jobs", unknown, callNone, ""},
		{"PUT", "/v1/deployment/promote/d1", decided, callDeploymentWrite, "d1"},
		{"POST", "/v1/deployment/fail/d1", decided, callDeploymentWrite, "d1"},
		{"PUT", "/v1/deployment/allocation-health/d1", decided, callDeploymentWrite, "d1"},
		{"GET", "/v1/deployment/d1", read, callNone, ""},
		{"PUT", "/v1/deployment/d1", unknown, callNone, "d1"},
		{"put", "/v1/jobs", unknown, callNone, ""}, // Nomad compares methods exactly: 405 there
		{"PUT", "/v1/node/n1/drain", neutral, callNone, "n1/drain"},
		{"PUT", "/v1/node/pools", neutral, callNone, ""},
		{"POST", "/v1/operator/snapshot", refused, callNone, ""},
		{"PUT", "/v1/job", unknown, callNone, "v1/job"}, // Nomad: 301 to /v1/job/
		{"PUT", "/v1/brand-new", unknown, callNone, "v1/brand-new"},
		{"PATCH", "/v1/client/allocation/a1/restart", neutral, callNone, "a1/restart"},
		{"HEAD", "/v1/jobs", read, callNone, ""},                      // Nomad: 405; never refused as an unknown write
		{"OPTIONS", "/v1/job/train", read, callNone, ""},              // Nomad: 405
		{"HEAD", "/v1/client/fs/cat/a1", neutral, callNone, "cat/a1"}, // the handler ignores the method
	}
	for _, c := range cases {
		got := route(c.method, c.path)
		if got.class != c.class || got.call != c.call || got.id != c.id && got.class != read {
			t.Errorf("%s %s: got %+v, want class %v %v %q", c.method, c.path, got, c.class, c.call, c.id)
		}
	}
	for _, p := range []string{"/v1/job/a/b/scale", "/v1/job/a/b", "/v1/var/secret/x", "/v1/nonsense/x"} {
		if got := route("PUT", p); strings.Contains(got.pattern, "a/b") || strings.Contains(got.pattern, "secret") || strings.Contains(got.pattern, "nonsense") {
			t.Errorf("PUT %s: pattern %q holds the caller's path", p, got.pattern)
		}
	}
}

func TestEveryWayToRegisterIsGated(t *testing.T) {
	over := testbuild.Job("vision", "big").Group("g", 1, 3, "gpu").Register() // vision's limit is 2
	for _, path := range []string{"/v1/jobs", "/v1/job/big", "/v1/job/"} {
		for _, method := range []string{http.MethodPut, http.MethodPost} {
			s, up, _, _ := newTestServer(t)
			rec := do(s, method, path, over)
			if rec.Code != http.StatusForbidden || len(up.writes) != 0 {
				t.Errorf("%s %s: %d %s, Nomad got %v", method, path, rec.Code, rec.Body, up.writes)
			}
		}
	}
	s, up, _, _ := newTestServer(t)
	slashed := testbuild.Job("vision", "team/big").Group("g", 1, 3, "gpu").Register()
	if rec := do(s, http.MethodPut, "/v1/job/team/big", slashed); rec.Code != http.StatusForbidden || len(up.writes) != 0 {
		t.Errorf("job id with a slash: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/job/other", over); rec.Code != http.StatusBadRequest || len(up.writes) != 0 {
		t.Errorf("path and body ids differ: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/job/x/../../jobs", over); rec.Code != http.StatusMovedPermanently || len(up.writes) != 0 {
		t.Errorf("unclean path: %d %s", rec.Code, rec.Body)
	}
}

func TestNamespaceIsResolvedAndPinned(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	// The job says "default" (no tenant): the query's "vision" is what Nomad uses.
	job := testbuild.Job("default", "train").Group("g", 1, 1, "gpu").Register()
	rec := do(s, http.MethodPut, "/v1/jobs?namespace=vision", job)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "tenant vision") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	forwarded := up.last["Job"].(map[string]any)
	if forwarded["Namespace"] != "vision" || up.last["Namespace"] != "vision" || !strings.Contains(up.writes[0], "namespace=vision") {
		t.Errorf("namespace not pinned: job %v, body %v, %s", forwarded["Namespace"], up.last["Namespace"], up.writes[0])
	}
	// And the body's Namespace wins over the job's.
	s, up, _, _ = newTestServer(t)
	body := strings.Replace(job, `{"Job"`, `{"Namespace":"other","Job"`, 1)
	if rec := do(s, http.MethodPut, "/v1/jobs", body); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `namespace "other"`) || len(up.writes) != 0 {
		t.Errorf("body namespace: %d %s, Nomad got %v", rec.Code, rec.Body, up.writes)
	}
}

func TestOtherRegionsAreRefused(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	job := testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").Register()
	for _, path := range []string{"/v1/jobs?region=eu", "/v1/job/train/scale?region=eu"} {
		body := job
		if strings.Contains(path, "scale") {
			body = `{"Count":1,"Target":{"Group":"g"}}`
		}
		if rec := do(s, http.MethodPut, path, body); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `region "eu"`) {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if len(up.writes) != 0 {
		t.Errorf("Nomad got %v", up.writes)
	}
}

func TestCallsThatCannotBeDecidedFailClosed(t *testing.T) {
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusInternalServerError} {
		s, up, _, _ := newTestServer(t)
		up.lookup = status
		for path, body := range map[string]string{
			"/v1/job/train/scale":          `{"Count":2,"Target":{"Group":"g"}}`,
			"/v1/job/train/dispatch":       `{}`,
			"/v1/job/train/periodic/force": ``,
			"/v1/job/train/revert":         `{"JobID":"train","JobVersion":0}`,
		} {
			rec := do(s, http.MethodPut, path, body)
			if rec.Code < 400 || !strings.Contains(rec.Body.String(), "cannot read the job") {
				t.Errorf("lookup answered %d, %s: %d %s", status, path, rec.Code, rec.Body)
			}
		}
		if len(up.writes) != 0 {
			t.Errorf("lookup answered %d: Nomad got %v", status, up.writes)
		}
	}
}

func TestScaleAndDispatchAreDecidedOnTheResult(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	up.jobs["train"] = testbuild.Job("vision", "train").Priority(60).Group("g", 1, 1, "gpu").Build()
	if rec := do(s, http.MethodPut, "/v1/job/train/scale?namespace=vision", `{"Count":3,"Target":{"Group":"g"}}`); rec.Code != http.StatusForbidden {
		t.Errorf("scale above the limit: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/job/train/scale?namespace=vision", `{"Count":1,"count":3,"Target":{"Group":"g"}}`); rec.Code != http.StatusBadRequest {
		t.Errorf("ambiguous scale: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/job/train/scale?namespace=vision", `{"Count":2,"Target":{"Group":"g"}}`); rec.Code != http.StatusOK {
		t.Errorf("scale within the limit: %d %s", rec.Code, rec.Body)
	}
	// The reservation of the scale to 2 counts until Nomad's event: a dispatch of one more is refused.
	up.jobs["batch"] = testbuild.Job("vision", "batch").Priority(60).Group("g", 1, 1, "gpu").Build()
	if rec := do(s, http.MethodPut, "/v1/job/batch/dispatch?namespace=vision", `{}`); rec.Code != http.StatusForbidden {
		t.Errorf("dispatch beyond the limit: %d %s", rec.Code, rec.Body)
	}
}

func TestQueueingNeedsATokenThatMaySubmit(t *testing.T) {
	s, up, q, _ := newTestServer(t)
	do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "first").Group("g", 1, 2, "gpu").Register())
	up.planStatus = http.StatusForbidden
	rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "second").Group("g", 1, 2, "gpu").Register())
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "not queued") || len(q.IDs()) != 0 {
		t.Errorf("queued with a token Nomad refuses: %d %s, queue %v", rec.Code, rec.Body, q.IDs())
	}
}

func TestTokensAreReadAsNomadReadsThem(t *testing.T) {
	for header, want := range map[string]string{
		"X-Nomad-Token: abc":            "abc",
		"Authorization: Bearer abc":     "abc",
		"Authorization: bearer abc def": "abc",
		"Authorization: Basic abc":      "",
	} {
		name, value, _ := strings.Cut(header, ": ")
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set(name, value)
		if got := front.Token(r); got != want {
			t.Errorf("%s: %q, want %q", header, got, want)
		}
	}
}

func TestQueueIDsAreValidatedBeforeConsul(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	for _, path := range []string{"/v1/gpu/queue/abc", "/v1/gpu/queue/..admission-key", "/v1/gpu/queue/0F8E2A4C-1B2D-4E5F-8A9B-0C1D2E3F4A5B"} {
		if rec := do(s, http.MethodDelete, path, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if rec := do(s, http.MethodGet, "/v1/gpu/queue/..%2F..%2Fadmission-key", ""); rec.Code != http.StatusMovedPermanently {
		t.Errorf("unclean path: %d", rec.Code)
	}
}

func TestFieldsUnknownToTheBrokerReachNomad(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	job := testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").Register()
	// A newer Nomad's job option, unknown to the broker's api module.
	body := strings.Replace(job, `{"Job":{`, `{"Job":{"FutureOption":{"enabled":true,"n":[1,2]},`, 1)
	if rec := do(s, http.MethodPut, "/v1/jobs", body); rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(string(up.raw), `"FutureOption":{"enabled":true,"n":[1,2]}`) {
		t.Errorf("unknown field lost on the way to Nomad:\n%s", up.raw)
	}
}

func TestQueueLimitsPerTenant(t *testing.T) {
	s, _, q, _ := newTestServer(t)
	s.setPolicy(visionPolicy(t, "max_queued = 1\nmax_queued_request_bytes = 3000", ""))
	do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "runs").Group("g", 1, 2, "gpu").Register())
	big := testbuild.Job("vision", "big").Group("g", 1, 2, "gpu").Meta("note", strings.Repeat("x", 4000)).Register()
	if rec := do(s, http.MethodPut, "/v1/jobs", big); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "max_queued_request_bytes") {
		t.Errorf("oversized request queued: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "q1").Group("g", 1, 2, "gpu").Register()); rec.Code != http.StatusOK {
		t.Fatalf("first queued: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "q2").Group("g", 1, 2, "gpu").Register()); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "max_queued") {
		t.Errorf("second queued beyond max_queued 1: %d %s", rec.Code, rec.Body)
	}
	if len(q.IDs()) != 1 {
		t.Errorf("queue holds %v", q.IDs())
	}
}

func TestLargeBodiesAreReadAFewAtATime(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	large := func(from string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPut, "/v1/jobs", strings.NewReader(strings.Repeat(" ", LargeBody+1)+"{}"))
		req.RemoteAddr = from + ":40000"
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	var held []func()
	for _, client := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2"} {
		release, err := s.gate.large.take(client) // large requests in flight
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	if rec := large("10.0.0.1"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "from 10.0.0.1") {
		t.Errorf("a third from one client: %d %s", rec.Code, rec.Body)
	}
	if rec := large("10.0.0.3"); rec.Code != http.StatusBadRequest {
		t.Errorf("another client, with a slot free: %d %s", rec.Code, rec.Body)
	}
	release, _ := s.gate.large.take("10.0.0.3")
	if rec := large("10.0.0.4"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "too many large requests at once") {
		t.Errorf("one more than the slots: %d %s", rec.Code, rec.Body)
	}
	release()
	for _, r := range held {
		r()
	}
	if s.gate.large.inFlight != 0 || len(s.gate.large.byClient) != 0 {
		t.Errorf("slots still held: %d, by client %v", s.gate.large.inFlight, s.gate.large.byClient)
	}
}

// A body that does not arrive in time is answered 408, and its slot freed.
func TestABodyThatStallsIsAnsweredInTime(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	s.set(func(o *Options, _ *gpuapi.Options) { o.BodyReadTimeout = 200 * time.Millisecond })
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	body, w := io.Pipe()
	defer w.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/jobs", body) // chunked: its length unknown
	go w.Write([]byte(`{"Job": {`))                                     // and then nothing
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(out), "did not arrive within 200ms") || time.Since(start) > 5*time.Second {
		t.Errorf("a stalled body: %d %s after %s", resp.StatusCode, out, time.Since(start))
	}
	if s.gate.large.inFlight != 0 {
		t.Errorf("its slot is still held")
	}
	// Refused before its body is read: answered at once all the same.
	for range MaxLargeBodiesPerClient {
		release, _ := s.gate.large.take("127.0.0.1")
		defer release()
	}
	body2, w2 := io.Pipe()
	defer w2.Close()
	go w2.Write([]byte(`{"Job": {`))
	req, _ = http.NewRequest(http.MethodPut, srv.URL+"/v1/jobs", body2)
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a stalled body beyond the client's slots: %d", resp2.StatusCode)
	}
}

func TestARegionsBrokerNamedInPolicyGetsItsRequests(t *testing.T) {
	var got []string
	eu := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get(regionForwardedHeader))
		w.Write([]byte(`{"EvalID":"from-eu"}`))
	}))
	defer eu.Close()
	s, up, _, _ := newTestServer(t)
	s.setPolicy(visionPolicy(t, "", `region "eu" { broker = "`+eu.URL+`" }`))
	job := testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").Register()
	rec := do(s, http.MethodPut, "/v1/jobs?region=eu", job)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "from-eu") || len(got) != 1 || got[0] != "PUT /v1/jobs?region=eu 1" {
		t.Errorf("not sent to eu's broker: %d %s %v", rec.Code, rec.Body, got)
	}
	if rec := do(s, http.MethodPut, "/v1/jobs?region=ap", job); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `names no broker for region ap`) {
		t.Errorf("unknown region: %d %s", rec.Code, rec.Body)
	}
	if len(up.writes) != 0 {
		t.Errorf("this region's Nomad got %v", up.writes)
	}
}

func TestBrokerAPIWithACLs(t *testing.T) {
	s, up, q, _ := newTestServer(t)
	s.setACLs(true)
	up.tokens = map[string]testToken{"ana": {"ana", []string{"vision"}, nil}, "bob": {"bob", []string{"vision"}, nil}, "eve": {"eve", nil, nil}}
	as := func(tok, method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("X-Nomad-Token", tok)
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	as("ana", http.MethodPut, "/v1/jobs", testbuild.Job("vision", "runs").Group("g", 1, 2, "gpu").Register())
	if rec := as("ana", http.MethodPut, "/v1/jobs", testbuild.Job("vision", "waits").Group("g", 1, 2, "gpu").Register()); !strings.Contains(rec.Body.String(), "queued as") {
		t.Fatalf("not queued: %d %s", rec.Code, rec.Body)
	}
	if e, _ := q.Get(t.Context(), testQueueID); e.SubmittedBy != "ana (acc-ana)" || e.Accessor != "acc-ana" {
		t.Errorf("submitter recorded as %q, accessor %q", e.SubmittedBy, e.Accessor)
	}
	for _, tok := range []string{"", "forged"} {
		if rec := as(tok, http.MethodGet, "/v1/gpu/queue", ""); rec.Code != http.StatusForbidden {
			t.Errorf("token %q: %d %s", tok, rec.Code, rec.Body)
		}
		if rec := as(tok, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "w2").Group("g", 1, 2, "gpu").Register()); !strings.Contains(rec.Body.String(), "not queued") {
			t.Errorf("token %q queued a job: %d %s", tok, rec.Code, rec.Body)
		}
	}
	if rec := as("eve", http.MethodGet, "/v1/gpu/queue", ""); strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Errorf("eve sees vision's queue: %s", rec.Body)
	}
	if rec := as("eve", http.MethodGet, "/v1/gpu/queue/"+testQueueID, ""); rec.Code != http.StatusNotFound {
		t.Errorf("eve reads vision's entry: %d", rec.Code)
	}
	if rec := as("bob", http.MethodGet, "/v1/gpu/queue", ""); !strings.Contains(rec.Body.String(), "waits") || strings.Contains(rec.Body.String(), `"request"`) {
		t.Errorf("bob's listing (no request bodies): %s", rec.Body)
	}
	if rec := as("eve", http.MethodDelete, "/v1/gpu/queue/"+testQueueID, ""); rec.Code != http.StatusNotFound || len(q.IDs()) != 1 {
		t.Errorf("eve, who cannot even see it, cancelled: %d %s", rec.Code, rec.Body)
	}
	if rec := as("bob", http.MethodDelete, "/v1/gpu/queue/"+testQueueID, ""); rec.Code != http.StatusOK {
		t.Errorf("bob may submit in vision, so may cancel: %d %s", rec.Code, rec.Body)
	}
}

func TestExclusiveEnforcementWritesForSubmittersOnly(t *testing.T) {
	s, up, q, _ := newTestServer(t)
	brokerToken := "broker-secret"
	s.setPolicy(visionPolicy(t, `submitters = ["policy:vision-write"]`, `tenant "search" {
  namespaces = ["search"]
  queues = ["training"]
}`))
	s.set(func(o *Options, a *gpuapi.Options) {
		o.ACLs, o.Exclusive, o.Token = true, true, func() string { return brokerToken }
		a.ACLs, a.Exclusive = true, true
	})
	up.tokens = map[string]testToken{
		"ana":           {"ana", []string{"vision"}, []string{"vision-write"}},
		"bob":           {"bob", []string{"vision", "default"}, []string{"vision-read"}},
		"broker-secret": {"broker", []string{"vision", "search", "default"}, nil},
	}
	up.deployments = map[string]string{"dep-vision": "vision", "dep-search": "search"}
	as := func(tok, method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("X-Nomad-Token", tok)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	gpu := testbuild.Job("vision", "train").Group("g", 1, 2, "gpu").Register()
	cpu := testbuild.Job("vision", "web").Group("g", 1, 0, "").Register()
	for _, c := range []struct {
		tok, method, path, body string
		status                  int
		writer                  string // the token Nomad got the write with; "" no write
	}{
		{"ana", "PUT", "/v1/jobs", gpu, 200, "broker-secret"},
		{"ana", "PUT", "/v1/jobs", cpu, 200, "broker-secret"}, // any job write in the namespace
		{"ana", "DELETE", "/v1/job/train?namespace=vision", "", 200, "broker-secret"},
		{"ana", "PUT", "/v1/job/train/evaluate?namespace=vision", "{}", 200, "broker-secret"},
		{"ana", "PUT", "/v1/deployment/promote/dep-vision?namespace=vision", "{}", 200, "broker-secret"},
		// another tenant's deployment, named through a namespace the caller may write in
		{"ana", "PUT", "/v1/deployment/fail/dep-search?namespace=vision", "{}", 403, ""},
		{"bob", "PUT", "/v1/jobs", gpu, 403, ""},
		{"bob", "PUT", "/v1/jobs", cpu, 403, ""},
		{"bob", "DELETE", "/v1/job/train?namespace=vision", "", 403, ""},
		{"bob", "POST", "/v1/job/train/scale?namespace=vision", `{"Count":1,"Target":{"Group":"g"}}`, 403, ""},
		// outside the tenants' namespaces Nomad's ACLs decide, on the caller's token
		{"bob", "PUT", "/v1/jobs", testbuild.Job("default", "web").Group("g", 1, 0, "").Register(), 200, "bob"},
		{"bob", "DELETE", "/v1/job/web?namespace=default", "", 200, "bob"},
	} {
		before := len(up.writers)
		rec := as(c.tok, c.method, c.path, c.body)
		var writer string
		if len(up.writers) > before {
			writer = up.writers[len(up.writers)-1]
		}
		if rec.Code != c.status || writer != c.writer {
			t.Errorf("%s %s %s: %d %s, Nomad wrote with %q, want %d with %q", c.tok, c.method, c.path, rec.Code, rec.Body, writer, c.status, c.writer)
		}
		if c.status == 403 && c.tok == "bob" && !strings.Contains(rec.Body.String(), "submitters (policy:vision-write)") {
			t.Errorf("%s %s: the refusal does not name the submitters: %s", c.method, c.path, rec.Body)
		}
	}
	// The operator replaced the broker's token: the next write sends the new one.
	brokerToken = "broker-secret-2"
	up.tokens["broker-secret-2"] = up.tokens["broker-secret"]
	before := len(up.writers)
	if rec := as("ana", "DELETE", "/v1/job/train?namespace=vision", ""); rec.Code != 200 || len(up.writers) == before || up.writers[len(up.writers)-1] != "broker-secret-2" {
		t.Errorf("after the token changed: %d %s, Nomad wrote with %v", rec.Code, rec.Body, up.writers[before:])
	}
	// Queued for a submitter: no plan with the caller's token (it may not
	// submit in Nomad itself); the accessor is recorded for the leader.
	up.writes = nil
	if rec := as("ana", "PUT", "/v1/jobs", testbuild.Job("vision", "waits").Group("g", 1, 2, "gpu").Register()); !strings.Contains(rec.Body.String(), "queued as") {
		t.Fatalf("not queued: %d %s", rec.Code, rec.Body)
	}
	if e, err := q.Get(t.Context(), testQueueID); err != nil || e.Accessor != "acc-ana" || len(up.writes) != 0 {
		t.Errorf("entry %+v (%v), Nomad got %v", e, err, up.writes)
	}
}

func TestReclaimDecisionsAPI(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	mem := reclaimtest.NewMem()
	s.set(func(o *Options, a *gpuapi.Options) { o.ACLs, a.ACLs, a.Decisions = true, true, mem })
	up.tokens = map[string]testToken{"ana": {"ana", []string{"vision"}, nil}, "eve": {"eve", []string{"default"}, nil}}
	nb, ns := "nb", "vision"
	up.jobs["nb"] = &api.Job{ID: &nb, Namespace: &ns}
	id := func(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i, r := range []reclaim.Record{
		{Rule: "idle-dev", State: reclaim.Proposed, Namespace: "vision", Job: "nb"},
		{Rule: "idle-dev", State: reclaim.Executed, Namespace: "vision", Job: "nb"},
		{Rule: "idle-dev", State: reclaim.Proposed, Namespace: "vision", Job: "nb", ActingSince: t0},
		{Rule: "unadmitted", State: reclaim.Proposed, Namespace: "default", Job: "x"},
	} {
		r.ID, r.ProposedAt = id(i+1), t0.Add(time.Duration(i)*time.Minute)
		mem.Create(t.Context(), r)
	}
	as := func(tok, method, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("X-Nomad-Token", tok)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	var list []reclaim.Record
	json.Unmarshal(as("ana", "GET", "/v1/gpu/reclaim").Body.Bytes(), &list)
	if len(list) != 3 || list[0].ID != id(3) {
		t.Errorf("ana sees %d decisions, newest %v; want vision's 3, newest first", len(list), list)
	}
	for _, c := range []struct {
		tok, method, id string
		status          int
		body            string
	}{
		{"eve", "GET", id(1), 404, "no reclaim decision"}, // another namespace's
		{"ana", "GET", "queue", 400, "not a reclaim decision id"},
		{"ana", "DELETE", id(2), 409, "is executed"},
		{"ana", "DELETE", id(3), 409, "being carried out"},
		{"ana", "DELETE", id(1), 200, `"state":"cancelled"`},
		{"ana", "DELETE", id(1), 409, "is cancelled"},
	} {
		if rec := as(c.tok, c.method, "/v1/gpu/reclaim/"+c.id); rec.Code != c.status || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("%s %s %s: %d %s, want %d with %q", c.tok, c.method, c.id, rec.Code, rec.Body, c.status, c.body)
		}
	}
	if r, _ := mem.Get(t.Context(), id(1)); r.State != reclaim.Cancelled || r.Result != "cancelled by ana (acc-ana)" {
		t.Errorf("record after cancel: %+v", r)
	}
}

func TestLookupsReachJobsWhoseIDsNeedEscaping(t *testing.T) {
	for _, id := range []string{"team/train", "train 50%", "a?b"} {
		s, up, _, _ := newTestServer(t)
		up.jobs[id] = testbuild.Job("vision", id).Priority(60).Group("g", 1, 1, "gpu").Build()
		path := "/v1/job/" + url.PathEscape(id) + "/scale?namespace=vision"
		if rec := do(s, http.MethodPut, path, `{"Count":2,"Target":{"Group":"g"}}`); rec.Code != http.StatusOK {
			t.Errorf("scale of %q: %d %s", id, rec.Code, rec.Body)
		}
	}
}

// A job admitted under an approval is scaled under the same approval: scale,
// dispatch and revert decide through the same Server.admit as a registration.
func TestCallsThatGrowAJobDecideUnderItsApprovals(t *testing.T) {
	now := time.Now()
	granted := approval.Approval{ID: "a1", Namespace: "vision", Job: "train", Reason: "deadline", Priority: 90, For: "1h"}
	granted.Grant("ops", now.Add(-time.Minute))
	for name, c := range map[string]struct {
		approvals []approval.Approval
		want      int
	}{
		"granted":     {[]approval.Approval{granted}, http.StatusOK},
		"no approval": {nil, http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			s, up, _, _ := newTestServer(t)
			store := &memApprovals{byID: map[string]approval.Approval{}}
			for _, a := range c.approvals {
				store.byID[a.ID] = a
			}
			s.set(func(o *Options, a *gpuapi.Options) { o.Approvals, a.Approvals = store, store })
			// Admitted at 90 by the approval: without it, its queue's band is 60.
			up.jobs["train"] = testbuild.Job("vision", "train").Priority(90).Group("g", 1, 1, "gpu").Build()
			rec := do(s, http.MethodPut, "/v1/job/train/scale?namespace=vision", `{"Count":2,"Target":{"Group":"g"}}`)
			if rec.Code != c.want {
				t.Errorf("scale within the limit: %d %s", rec.Code, rec.Body)
			}
			if c.want == http.StatusOK && !strings.Contains(rec.Body.String(), "priority 90 by approval") {
				t.Errorf("the answer does not say the approval: %s", rec.Body)
			}
		})
	}
}

// A job that would use GPUs it does not ask for is refused by default, with
// the fix; with undeclared_gpu_access = "warn" it goes to Nomad, warned.
func TestUndeclaredGPUAccessIsRefusedOrWarned(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	job := `{"Job":{"ID":"sneaky","Namespace":"vision","TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Driver":"raw_exec","Env":{"NVIDIA_VISIBLE_DEVICES":"all"}}]}]}}`
	rec := do(s, http.MethodPut, "/v1/jobs", job)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `job "sneaky" rejected by rule undeclared-gpu-access: task "t" of group "g" sets NVIDIA_VISIBLE_DEVICES`) ||
		!strings.Contains(rec.Body.String(), `device "nvidia/gpu"`) || len(up.writes) != 0 {
		t.Errorf("refused: %d %s, Nomad got %v", rec.Code, rec.Body, up.writes)
	}
	s.setPolicy(visionPolicy(t, "", `undeclared_gpu_access = "warn"`))
	rec = do(s, http.MethodPut, "/v1/jobs", job)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "nomad-gpu: warning: rule undeclared-gpu-access") || len(up.writes) != 1 {
		t.Errorf("warned: %d %s, Nomad got %v", rec.Code, rec.Body, up.writes)
	}
}

// A periodic GPU job is refused by the engine's rule, answered as before the
// rule moved there from the gate, and audited now that it is a decision.
func TestAPeriodicGPUJobIsRefused(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	trail := auditedServer(t, s)
	job := `{"Job":{"ID":"nightly","Namespace":"vision","Periodic":{"Enabled":true,"Spec":"0 0 * * *","SpecType":"cron"},
	  "TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]}]}}`
	rec := do(s, http.MethodPut, "/v1/jobs", job)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `job "nightly" rejected by rule periodic-gpu-job: periodic jobs launch GPU work `+
		`on Nomad's schedule without admission; submit each run through the broker, or dispatch a parameterized job`) || len(up.writes) != 0 {
		t.Errorf("%d %s, Nomad got %v", rec.Code, rec.Body, up.writes)
	}
	events, _, _, err := trail.Page(audit.Cursor{}, 10, func(e audit.Event) bool { return e.Job == "nightly" })
	if err != nil || len(events) != 1 || events[0].Rule != admission.RulePeriodicGPU {
		t.Errorf("audited: %+v (%v)", events, err)
	}
}

// A stop waits for an entry the leader is registering (Nomad then has the
// job, and the stop goes there), and takes out one whose claim is stale.
func TestAStopWaitsForAnEntryBeingAdmitted(t *testing.T) {
	s, up, q, _ := newTestServer(t)
	now := time.Now()
	claimed := queue.Entry{ID: testQueueID, JobID: "train", Namespace: "vision", Tenant: "vision", Queue: "training", Admitting: now}
	q.Put(t.Context(), claimed)
	go func() {
		time.Sleep(300 * time.Millisecond) // the leader registers it, then removes it
		q.Remove(context.Background(), claimed)
	}()
	start := time.Now()
	rec := do(s, http.MethodDelete, "/v1/job/train?namespace=vision", "")
	if rec.Code != http.StatusOK || rec.Header().Get(dequeuedHeader) != "" || time.Since(start) < 250*time.Millisecond || len(up.writes) != 1 {
		t.Errorf("stop of a job being admitted: %d %s after %s, dequeued %q, Nomad got %v", rec.Code, rec.Body, time.Since(start),
			rec.Header().Get(dequeuedHeader), up.writes)
	}
	stale := claimed
	stale.Admitting = now.Add(-time.Hour) // a registration that failed long ago
	q.Put(t.Context(), stale)
	if rec := do(s, http.MethodDelete, "/v1/job/train?namespace=vision", ""); rec.Code != http.StatusOK || rec.Header().Get(dequeuedHeader) != testQueueID {
		t.Errorf("stop of a job whose claim is stale: %d %s, dequeued %q", rec.Code, rec.Body, rec.Header().Get(dequeuedHeader))
	}
}

// Failing a deployment with auto_revert is decided as the revert to the
// latest stable version it leads to; other deployment writes pass.
func TestADeploymentFailIsDecidedAsItsRevert(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	version := func(v uint64, gpus int, stable bool) *api.Job {
		j := testbuild.Job("vision", "svc").Priority(60).Group("g", 1, gpus, "nvidia/gpu").Build()
		j.Version, j.Stable = &v, &stable
		return j
	}
	up.jobs["svc"] = version(1, 1, false)
	versions, _ := json.Marshal(map[string]any{"Versions": []*api.Job{version(1, 1, false), version(0, 2, true)}})
	up.answers = map[string]string{
		"/v1/deployment/d1":    `{"ID":"d1","Namespace":"vision","JobID":"svc","JobVersion":1,"TaskGroups":{"g":{"AutoRevert":true}}}`,
		"/v1/job/svc/versions": string(versions),
	}
	view := s.cluster.(*cluster.View)
	view.ObserveJob(testbuild.Job("vision", "other").Group("g", 1, 1, "nvidia/gpu").Build())
	rec := do(s, http.MethodPut, "/v1/deployment/fail/d1", "")
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `revert of "svc" refused: tenant "vision" would hold 3 of its limit of 2 GPUs`) || len(up.writes) != 0 {
		t.Errorf("fail, reverting to 2 GPUs beside 1 more: %d %s, Nomad got %v", rec.Code, rec.Body, up.writes)
	}
	if rec := do(s, http.MethodPut, "/v1/deployment/allocation-health/d1", `{"HealthyAllocationIDs":["a1"]}`); rec.Code != http.StatusOK || len(up.writes) != 1 {
		t.Errorf("allocations marked healthy: %d %s", rec.Code, rec.Body)
	}
	view.ForgetJob("vision", "other")
	if rec := do(s, http.MethodPut, "/v1/deployment/allocation-health/d1", `{"UnhealthyAllocationIDs":["a1"]}`); rec.Code != http.StatusOK || len(up.writes) != 2 ||
		!strings.Contains(rec.Body.String(), "admitted") {
		t.Errorf("an allocation marked unhealthy, the revert within the limit: %d %s", rec.Code, rec.Body)
	}
}

// Nomad gone while a job would be queued: the answer says Nomad is
// unreachable, where, and why, not that Nomad refused the caller's token.
func TestQueueingWithNomadGoneSaysNomadIsUnreachable(t *testing.T) {
	s, _, q, nomad := newTestServer(t)
	do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "first").Group("g", 1, 2, "gpu").Register())
	nomad.Close()
	rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "second").Group("g", 1, 2, "gpu").Register())
	host := strings.TrimPrefix(nomad.URL, "http://")
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `job "second" not queued: Nomad at `+host+` is unreachable`) ||
		!strings.Contains(rec.Body.String(), "connect: connection refused") || len(q.IDs()) != 0 {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

// Nomad failing (500) to plan a job that would be queued is Nomad's fault,
// not a refusal of the caller's token: 502, worded so. A call passed
// through to a Nomad that does not answer gets a 502 that says so too.
func TestNomadFailingIsNeverWordedAsARefusal(t *testing.T) {
	s, up, q, nomad := newTestServer(t)
	do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "first").Group("g", 1, 2, "gpu").Register())
	up.planStatus = http.StatusInternalServerError
	rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "second").Group("g", 1, 2, "gpu").Register())
	if body := rec.Body.String(); rec.Code != http.StatusBadGateway || strings.Contains(body, "refused") ||
		!strings.Contains(body, `job "second" not queued: Nomad could not plan it (Nomad answered 500`) || len(q.IDs()) != 0 {
		t.Errorf("a plan Nomad answered 500: %d %s", rec.Code, body)
	}
	nomad.Close()
	rec = do(s, http.MethodGet, "/v1/jobs", "")
	if body := rec.Body.String(); rec.Code != http.StatusBadGateway || !strings.Contains(body, "nomad-gpu: Nomad did not answer GET /v1/jobs: ") ||
		!strings.Contains(body, "connection refused") {
		t.Errorf("a read with Nomad gone: %d %q", rec.Code, body)
	}
}

// Until the cluster view has listed Nomad, every GPU looks free: GPU calls
// are answered 503 and the queue's order is not shown; reads pass.
func TestNothingIsDecidedBeforeTheViewListed(t *testing.T) {
	s, up, q, _ := newTestServer(t)
	listed := false
	synced := func() bool { return listed }
	s.set(func(o *Options, a *gpuapi.Options) { o.Synced, a.Synced = synced, synced })
	if rec := do(s, http.MethodPut, "/v1/jobs", gpuJob); rec.Code != http.StatusServiceUnavailable ||
		!strings.Contains(rec.Body.String(), "has not read the cluster from Nomad yet") || len(up.writes) != 0 || len(q.IDs()) != 0 {
		t.Errorf("a GPU job: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodGet, "/v1/gpu/queue", ""); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("the queue: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodGet, "/v1/job/train", ""); rec.Code == http.StatusServiceUnavailable {
		t.Errorf("a read, passed through: %d %s", rec.Code, rec.Body)
	}
	listed = true
	if rec := do(s, http.MethodPut, "/v1/jobs", gpuJob); rec.Code != http.StatusOK {
		t.Errorf("once listed: %d %s", rec.Code, rec.Body)
	}
}
