package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

var _ front.Queue = (*queuetest.Mem)(nil)

// upstream stands in for Nomad: it records the writes it gets and answers
// reads of jobs from jobs (404 for others; lookup, when set, answers instead).
type upstream struct {
	mu     sync.Mutex
	last   map[string]any
	raw    []byte
	writes []string // "METHOD path?query"
	// writers are the tokens of writes, in order.
	writers []string
	// deployments are deployment ids with their namespaces.
	deployments map[string]string
	jobs        map[string]*api.Job
	// answers are raw JSON answers to reads, by path (before jobs).
	answers map[string]string
	lookup  int // status for every read, when not 0
	// planStatus answers plans, when not 0.
	planStatus int
	// tokens, when set, turns ACLs on: each secret's name and the namespaces
	// where it may do everything; other secrets are refused.
	tokens map[string]testToken
}

type testToken struct {
	name       string
	namespaces []string
	policies   []string
}

// acl answers what Nomad's ACLs would; false when the request may go on.
func (u *upstream) acl(w http.ResponseWriter, r *http.Request) bool {
	if u.tokens == nil {
		if r.URL.Path == "/v1/acl/token/self" {
			http.Error(w, "ACL support disabled", http.StatusBadRequest)
			return true
		}
		return false
	}
	tok, ok := u.tokens[r.Header.Get("X-Nomad-Token")]
	if !ok {
		http.Error(w, "ACL token not found", http.StatusForbidden)
		return true
	}
	if r.URL.Path == "/v1/acl/token/self" {
		// One accessor per token (by its secret): a person may hold several.
		json.NewEncoder(w).Encode(map[string]any{"AccessorID": "acc-" + r.Header.Get("X-Nomad-Token"), "Name": tok.name, "Type": "client", "Policies": tok.policies})
		return true
	}
	if strings.HasPrefix(r.URL.Path, "/v1/acl/policy/") {
		fmt.Fprint(w, `{"ModifyIndex":7}`)
		return true
	}
	if strings.HasPrefix(r.URL.Path, "/v1/node/") {
		if slices.Contains(tok.policies, "node-read") {
			fmt.Fprint(w, `{}`)
		} else {
			http.Error(w, "Permission denied", http.StatusForbidden)
		}
		return true
	}
	ns := r.URL.Query().Get("namespace")
	if ns == "" && r.Body != nil {
		// A registration without one: Nomad takes the job's.
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		var reg struct{ Job struct{ Namespace string } }
		json.Unmarshal(raw, &reg)
		ns = reg.Job.Namespace
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/namespace/"); ok {
		ns = rest
	}
	for _, allowed := range tok.namespaces {
		if allowed == ns {
			if strings.HasPrefix(r.URL.Path, "/v1/namespace/") {
				fmt.Fprint(w, `{}`)
				return true
			}
			return false
		}
	}
	http.Error(w, "Permission denied", http.StatusForbidden)
	return true
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.acl(w, r) {
		return
	}
	if r.Method == http.MethodGet {
		if u.lookup != 0 {
			http.Error(w, "Permission denied", u.lookup)
			return
		}
		if a, ok := u.answers[r.URL.Path]; ok {
			fmt.Fprint(w, a)
			return
		}
		if id, ok := strings.CutPrefix(r.URL.Path, "/v1/deployment/"); ok {
			if ns, ok := u.deployments[id]; ok { // by id, whatever the query's namespace, as Nomad
				json.NewEncoder(w).Encode(map[string]string{"ID": id, "Namespace": ns})
			} else {
				http.Error(w, "deployment not found", http.StatusNotFound)
			}
			return
		}
		job, ok := u.jobs[strings.TrimPrefix(r.URL.Path, "/v1/job/")]
		if !ok {
			http.Error(w, "job not found", http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(job)
		return
	}
	if u.planStatus != 0 && strings.HasSuffix(r.URL.Path, "/plan") {
		http.Error(w, "Permission denied", u.planStatus)
		return
	}
	u.raw, _ = io.ReadAll(r.Body)
	var body map[string]any
	json.Unmarshal(u.raw, &body)
	u.last = body
	u.writes = append(u.writes, r.Method+" "+r.URL.RequestURI())
	u.writers = append(u.writers, r.Header.Get("X-Nomad-Token"))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"EvalID":"e1","EvalCreateIndex":10,"JobModifyIndex":10,"Warnings":"","Index":10,"LastIndex":10}`)
}

// visionPolicy is the servers' policy: tenant vision with 2 GPUs, its block
// extended by tenantExtra, and extra blocks after it.
func visionPolicy(t testing.TB, tenantExtra, extra string) *policy.Policy {
	return testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues = ["training"]
  guaranteed = 2
  limit = 2
`+tenantExtra+`
}
`+extra)
}

// testFront is a test's HTTP front as the agent builds it: the gate with
// the broker's API mounted, from o and a. A test changes them with set,
// which builds both again (the stores in them, the queue's among them, stay).
type testFront struct {
	t       testing.TB
	o       Options
	a       gpuapi.Options
	gate    *Server
	cluster Cluster
}

func newTestServer(t testing.TB) (*testFront, *upstream, *queuetest.Mem, *httptest.Server) {
	p := visionPolicy(t, "", "")
	up := &upstream{jobs: map[string]*api.Job{}}
	nomad := httptest.NewServer(up)
	t.Cleanup(nomad.Close)
	view := cluster.NewView(nil)
	view.ObserveNode(testbuild.Node("n", "H100", 2, 0))
	q := queuetest.NewMem()
	newID := func() string { return testQueueID }
	f := &testFront{t: t,
		o: Options{Log: hclog.NewNullLogger(), Nomad: nomad.URL, Policies: testbuild.Fixed{P: p}, Cluster: view,
			Queue: q, Stamper: nomadjob.Stamper{Key: []byte("k")}, NewID: newID},
		a: gpuapi.Options{Log: hclog.NewNullLogger(), Nomad: nomad.URL, Policies: testbuild.Fixed{P: p}, Cluster: view, Queue: q, NewID: newID}}
	f.build()
	return f, up, q, nomad
}

func (f *testFront) build() {
	f.t.Helper()
	a, err := gpuapi.New(f.a)
	if err != nil {
		f.t.Fatal(err)
	}
	f.o.API = a.Handler()
	if f.gate, err = New(f.o); err != nil {
		f.t.Fatal(err)
	}
	f.cluster = f.o.Cluster
}

// set changes what the front is built from, and builds it again.
func (f *testFront) set(change func(o *Options, a *gpuapi.Options)) {
	f.t.Helper()
	change(&f.o, &f.a)
	f.build()
}

// setACLs turns Nomad's ACLs on, or off, for both.
func (f *testFront) setACLs(on bool) {
	f.set(func(o *Options, a *gpuapi.Options) { o.ACLs, a.ACLs = on, on })
}

// setPolicy puts p in force for both.
func (f *testFront) setPolicy(p *policy.Policy) {
	f.set(func(o *Options, a *gpuapi.Options) {
		o.Policies, a.Policies = testbuild.Fixed{P: p}, testbuild.Fixed{P: p}
	})
}

// Handler is the front as built last: a test's server keeps it across set.
func (f *testFront) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.gate.Handler().ServeHTTP(w, r) })
}

const gpuJob = `{"Job":{"ID":"train","Namespace":"vision","Priority":50,"Meta":{"team":"cv"},"TaskGroups":[{"Name":"g","Count":1,
  "Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":2}]}}]}]}}`

func do(s interface{ Handler() http.Handler }, method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec
}

func TestRegisterAdmitsStampsAndWarns(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	rec := do(s, http.MethodPut, "/v1/jobs", gpuJob)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "nomad-gpu: admitted: tenant vision, queue training, priority 60") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	job := up.last["Job"].(map[string]any)
	meta := job["Meta"].(map[string]any)
	if job["Priority"].(float64) != 60 || meta["team"] != "cv" || meta["nomad-gpu.tenant"] != "vision" {
		t.Errorf("forwarded job: %v", job)
	}
}

func TestRegisterQueuesWithAnEvaluationTheCLICanFollow(t *testing.T) {
	s, _, q, _ := newTestServer(t)
	do(s, http.MethodPut, "/v1/jobs", gpuJob)
	rec := do(s, http.MethodPut, "/v1/jobs", strings.Replace(gpuJob, `"train"`, `"train-2"`, 1))
	var resp api.JobRegisterResponse
	json.Unmarshal(rec.Body.Bytes(), &resp)
	if rec.Code != http.StatusOK || resp.EvalID != testQueueID || !strings.Contains(resp.Warnings, "queued as "+testQueueID+", position 1") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if _, err := q.Get(context.Background(), testQueueID); err != nil {
		t.Fatal("not stored in the queue")
	}
	rec = do(s, http.MethodGet, "/v1/evaluation/"+testQueueID, "")
	var eval api.Evaluation
	json.Unmarshal(rec.Body.Bytes(), &eval)
	if eval.Status != api.EvalStatusComplete || eval.JobID != "train-2" {
		t.Errorf("synthetic evaluation: %s", rec.Body)
	}
	if rec := do(s, http.MethodGet, "/v1/evaluation/"+testQueueID+"/allocations", ""); strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Errorf("allocations of a queued job: %s", rec.Body)
	}
}

func TestAJobSubmittedAgainWhileQueuedReplacesItsEntry(t *testing.T) {
	s, _, q, _ := newTestServer(t)
	ids := 0
	newID := func() string { ids++; return fmt.Sprintf("00000000-0000-4000-8000-%012d", ids) }
	s.set(func(o *Options, a *gpuapi.Options) { o.NewID, a.NewID = newID, newID })
	do(s, http.MethodPut, "/v1/jobs", gpuJob) // takes vision's 2 GPUs
	waits := testbuild.Job("vision", "waits").Group("g", 1, 1, "gpu")
	first := do(s, http.MethodPut, "/v1/jobs", waits.Register())
	do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "other").Group("g", 1, 1, "gpu").Register())
	again := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "waits").Group("g", 1, 2, "gpu").Register())
	entries, _ := q.List(t.Context())
	var got []string
	for _, e := range entries {
		got = append(got, fmt.Sprintf("%s %s %g", e.ID[len(e.ID)-1:], e.JobID, e.Demand))
	}
	sort.Strings(got)
	if fmt.Sprint(got) != "[1 waits 2 2 other 1]" || !strings.Contains(again.Body.String(), "position 1") {
		t.Errorf("entries %v; first %s; again %s", got, first.Body, again.Body)
	}
}

func TestBadRequests(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	for body, want := range map[string]string{
		`{"Job": `:                            "malformed JSON in request body",
		`{"NotAJob": {}}`:                     `no "Job" object`,
		`{"Job": {"ID": 42}}`:                 "malformed request",
		strings.Repeat(" ", MaxBody+1) + "{}": "larger than",
	} {
		rec := do(s, http.MethodPut, "/v1/jobs", body)
		status := http.StatusBadRequest
		if want == "larger than" {
			status = http.StatusRequestEntityTooLarge
		}
		if rec.Code != status || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("want 400 naming %q, got %d %.80s", want, rec.Code, rec.Body)
		}
	}
}

func TestNonGPUJobIsForwardedByteForByte(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	var got []byte
	nomad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		fmt.Fprint(w, `{}`)
	}))
	defer nomad.Close()
	s2, _ := New(Options{Log: hclog.NewNullLogger(), Nomad: nomad.URL, Policies: s.o.Policies, Cluster: s.o.Cluster, Queue: s.o.Queue})
	body := `{"Job":{"ID":"web","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t"}]}]},   "EnforceIndex":true}`
	do(s2, http.MethodPost, "/v1/job/web", body)
	if !bytes.Equal(got, []byte(body)) {
		t.Errorf("body changed:\n%s\n%s", body, got)
	}
}

// BenchmarkRegisterOverhead measures job registration straight to an upstream
// and through the broker, interleaved in one run, and reports both p50 and p99
// and their ratios. The upstream answers at once, so the ratio is the broker's
// own cost (decode, admission, stamp, forward) over a bare HTTP round trip.
func BenchmarkRegisterOverhead(b *testing.B) {
	s, _, _, nomad := newTestServer(b)
	broker := httptest.NewServer(s.Handler())
	defer broker.Close()
	client := &http.Client{}
	body := strings.Replace(gpuJob, `"Count":2`, `"Count":1`, 1)
	send := func(base string) time.Duration {
		start := time.Now()
		resp, err := client.Post(base+"/v1/jobs", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	var direct, brokered []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, send(nomad.URL))
		brokered = append(brokered, send(broker.URL))
	}
	b.StopTimer()
	p := func(ds []time.Duration, q float64) float64 {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[int(q*float64(len(ds)-1))].Microseconds())
	}
	d50, d99, b50, b99 := p(direct, .5), p(direct, .99), p(brokered, .5), p(brokered, .99)
	b.ReportMetric(d50, "direct-p50-µs")
	b.ReportMetric(b50, "broker-p50-µs")
	b.ReportMetric(d99, "direct-p99-µs")
	b.ReportMetric(b99, "broker-p99-µs")
	b.ReportMetric(b50/max(d50, 1), "p50-ratio")
	b.ReportMetric(b99/max(d99, 1), "p99-ratio")
}

const testQueueID = "0f8e2a4c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"

func TestAJobSubmittedAgainIsWarnedWhenItKeptMostOfItsGPUsIdle(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	profiles := usage.NewProfiles()
	s.set(func(o *Options, _ *gpuapi.Options) { o.Profiles = profiles })
	held := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "train", Admitted: true, Tenant: "vision", StartedAt: time.Now(),
		GPUs: []string{"g0", "g1"}}}
	for i := 0; i < usage.MinSamples; i++ {
		profiles.Sample(time.Now(), held, map[string]reclaim.GPU{"g0": {Utilization: 0}, "g1": {Utilization: 0}}, 5)
	}
	rec := do(s, http.MethodPut, "/v1/jobs", gpuJob)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "admitted: tenant vision") ||
		!strings.Contains(rec.Body.String(), "right-sizing: train asks for 2 GPUs, and its earlier runs held 2 but kept at most 0 busy") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// Queued (vision's two GPUs are taken), still warned.
	other := strings.Replace(gpuJob, `"train"`, `"train-2"`, 1)
	profiles.Sample(time.Now(), []reclaim.Alloc{{ID: "b", Namespace: "vision", JobID: "train-2", Admitted: true, StartedAt: time.Now(),
		GPUs: []string{"g0", "g1"}}}, nil, 5)
	if rec := do(s, http.MethodPut, "/v1/jobs", other); !strings.Contains(rec.Body.String(), "queued as") || strings.Contains(rec.Body.String(), "right-sizing") {
		t.Fatalf("one sample is not enough to judge: %s", rec.Body)
	}
	for i := 0; i < usage.MinSamples; i++ {
		profiles.Sample(time.Now(), []reclaim.Alloc{{ID: "b", Namespace: "vision", JobID: "train-2", Admitted: true, StartedAt: time.Now(),
			GPUs: []string{"g0", "g1"}}}, map[string]reclaim.GPU{"g0": {Utilization: 90}, "g1": {Utilization: 0}}, 5)
	}
	if rec := do(s, http.MethodPut, "/v1/jobs", other); !strings.Contains(rec.Body.String(), "queued as") || strings.Contains(rec.Body.String(), "right-sizing") {
		t.Fatalf("a job keeping half its GPUs busy was warned: %s", rec.Body)
	}
}

func TestNothingIsDoneWhenTheAuditTrailCannotBeWritten(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	trail, err := audit.Open(path, 1<<20, 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	s.set(func(o *Options, a *gpuapi.Options) { o.Audit, a.Audit = trail, trail })
	// The file replaced by a directory: no line can be written.
	trail.Close()
	os.Remove(path)
	os.Mkdir(path, 0o700)
	rec := do(s, http.MethodPut, "/v1/jobs", gpuJob)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "audit trail cannot be written") || up.last != nil {
		t.Fatalf("%d %s; forwarded %v", rec.Code, rec.Body, up.last)
	}
	// Writable again: decided, written, then forwarded; the GPUs it did not
	// take before are free for it.
	os.Remove(path)
	rec = do(s, http.MethodPut, "/v1/jobs", gpuJob)
	events, _, _, _ := trail.Page(audit.Cursor{}, audit.MaxPage, nil)
	if rec.Code != http.StatusOK || up.last == nil || len(events) != 1 || events[0].What != audit.Admission || events[0].Job != "train" ||
		!strings.HasPrefix(events[0].Result, "admit:") {
		t.Fatalf("%d %s; audit %+v", rec.Code, rec.Body, events)
	}
}
