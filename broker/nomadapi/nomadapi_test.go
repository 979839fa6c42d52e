package nomadapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
)

// fakeNomad answers the paths a test gives, by "METHOD path", and records
// every request it gets (with its query and token).
type fakeNomad struct {
	mu       sync.Mutex
	answers  map[string]func(w http.ResponseWriter, r *http.Request)
	requests []string
	tokens   []string
	bodies   map[string][]byte
}

func (f *fakeNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.mu.Lock()
	key := r.Method + " " + r.URL.Path
	f.requests = append(f.requests, key+"?"+r.URL.RawQuery)
	f.tokens = append(f.tokens, r.Header.Get("X-Nomad-Token"))
	f.bodies[key] = body
	h, ok := f.answers[key]
	f.mu.Unlock()
	if !ok {
		http.Error(w, "no such path in the fake", http.StatusNotFound)
		return
	}
	h(w, r)
}

func newClient(t *testing.T, answers map[string]func(http.ResponseWriter, *http.Request)) (*nomadapi.Client, *fakeNomad) {
	t.Helper()
	f := &fakeNomad{answers: answers, bodies: map[string][]byte{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := nomadapi.New(srv.URL, "broker-secret", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func answer(status int, v any) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Nomad-Index", "42")
		if status != http.StatusOK {
			http.Error(w, fmt.Sprint(v), status)
			return
		}
		json.NewEncoder(w).Encode(v)
	}
}

func TestRegisterSendsTheBodyWithTheBrokersTokenAndTellsRefusalsApart(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"PUT /v1/jobs": func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Query().Get("namespace") {
			case "bad":
				http.Error(w, "job validation failed", http.StatusBadRequest)
			case "down":
				http.Error(w, "no cluster leader", http.StatusInternalServerError)
			default:
				fmt.Fprint(w, `{"EvalID":"e","JobModifyIndex":77}`)
			}
		},
	})
	ctx := context.Background()
	index, err := c.Register(ctx, "team/a", []byte(`{"Job":{"ID":"x"}}`))
	if err != nil || index != 77 {
		t.Fatalf("register: %d %v", index, err)
	}
	if f.requests[0] != "PUT /v1/jobs?namespace=team%2Fa" || f.tokens[0] != "broker-secret" || string(f.bodies["PUT /v1/jobs"]) != `{"Job":{"ID":"x"}}` {
		t.Errorf("sent %v with %v: %s", f.requests, f.tokens, f.bodies["PUT /v1/jobs"])
	}
	// A write of the broker's own on a running job: only over the version
	// it read, the job's fields kept as Nomad sent them.
	if index, err := c.RegisterAt(ctx, "team/a", []byte(`{"ID":"x","Future":[1]}`), 41); err != nil || index != 77 ||
		string(f.bodies["PUT /v1/jobs"]) != `{"Job":{"ID":"x","Future":[1]},"EnforceIndex":true,"JobModifyIndex":41}` {
		t.Errorf("register at 41: %d %v, sent %s", index, err, f.bodies["PUT /v1/jobs"])
	}
	_, err = c.Register(ctx, "bad", nil)
	var re *nomadapi.RegisterError
	if !errors.As(err, &re) || !re.Refused() || !strings.Contains(err.Error(), "job validation failed") {
		t.Errorf("a refusal: %v", err)
	}
	if _, err = c.Register(ctx, "down", nil); !errors.As(err, &re) || re.Refused() {
		t.Errorf("Nomad failing is not a refusal: %v", err)
	}
}

func TestJobIsNilWhenNomadHasNone(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/job/train": answer(http.StatusOK, api.Job{ID: ptr("train"), Namespace: ptr("vision")}),
		"GET /v1/job/gone":  answer(http.StatusNotFound, "job not found"),
		"GET /v1/job/fails": answer(http.StatusInternalServerError, "boom"),
	})
	ctx := context.Background()
	if j, err := c.Job(ctx, "vision", "train"); err != nil || *j.ID != "train" {
		t.Errorf("train: %v %v", j, err)
	}
	if !strings.Contains(f.requests[0], "namespace=vision") {
		t.Errorf("read in %s", f.requests[0])
	}
	if j, err := c.Job(ctx, "vision", "gone"); err != nil || j != nil {
		t.Errorf("gone: %v %v", j, err)
	}
	if _, err := c.Job(ctx, "vision", "fails"); err == nil || !strings.Contains(err.Error(), "vision/fails") {
		t.Errorf("fails: %v", err)
	}
}

func TestGrantsFollowTheTokenItsRolesAndTheirPolicies(t *testing.T) {
	expired := time.Now().Add(-time.Hour)
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/acl/token/alice": answer(http.StatusOK, map[string]any{"AccessorID": "alice", "Type": "client", "Policies": []string{"own"},
			"Roles": []map[string]string{{"ID": "r1", "Name": "trainers"}}, "ModifyIndex": 5}),
		"GET /v1/acl/role/r1":             answer(http.StatusOK, map[string]any{"Name": "trainers", "Policies": []map[string]string{{"Name": "vision-write"}}, "ModifyIndex": 6}),
		"GET /v1/acl/policy/own":          answer(http.StatusOK, map[string]any{"Name": "own", "ModifyIndex": 7}),
		"GET /v1/acl/policy/vision-write": answer(http.StatusOK, map[string]any{"Name": "vision-write", "ModifyIndex": 8}),
		"GET /v1/acl/token/old":           answer(http.StatusOK, map[string]any{"AccessorID": "old", "Type": "client", "ExpirationTime": expired}),
	})
	ctx := context.Background()
	g, exists, err := c.Grants(ctx, "alice")
	if err != nil || !exists || g.Management || len(g.Roles) != 1 || g.Roles[0] != "trainers" || len(g.Policies) != 2 || g.Version == "" {
		t.Fatalf("alice: %+v %v %v", g, exists, err)
	}
	for _, who := range []string{"old", "nobody"} {
		if _, exists, err := c.Grants(ctx, who); exists || err != nil {
			t.Errorf("%s: exists %v, %v", who, exists, err)
		}
	}
}

func TestSetPreemptionChangesOnlyWhatPolicySaysAndOnlyWhenNeeded(t *testing.T) {
	cfg := api.SchedulerConfiguration{SchedulerAlgorithm: "spread", PreemptionConfig: api.PreemptionConfig{SystemSchedulerEnabled: true}}
	var set api.SchedulerConfiguration
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/operator/scheduler/configuration": func(w http.ResponseWriter, _ *http.Request) {
			json.NewEncoder(w).Encode(api.SchedulerConfigurationResponse{SchedulerConfig: &cfg})
		},
		"PUT /v1/operator/scheduler/configuration": func(w http.ResponseWriter, r *http.Request) {
			json.NewDecoder(r.Body).Decode(&set)
			fmt.Fprint(w, `{"Updated":true}`)
		},
	})
	changed, err := c.SetPreemption(context.Background(), true, true)
	if err != nil || !changed {
		t.Fatalf("set: %v %v", changed, err)
	}
	if !set.PreemptionConfig.BatchSchedulerEnabled || !set.PreemptionConfig.ServiceSchedulerEnabled ||
		!set.PreemptionConfig.SystemSchedulerEnabled || set.SchedulerAlgorithm != "spread" {
		t.Errorf("wrote %+v", set)
	}
	cfg = set
	writes := len(f.requests)
	if changed, err := c.SetPreemption(context.Background(), true, true); err != nil || changed || len(f.requests) != writes+1 {
		t.Errorf("as wanted already: changed %v, %v, requests %v", changed, err, f.requests[writes:])
	}
}

func TestReevaluateBlockedEvaluatesEachBlockedJobOnce(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/evaluations": answer(http.StatusOK, []api.Evaluation{{ID: "1", Namespace: "vision", JobID: "a"},
			{ID: "2", Namespace: "vision", JobID: "a"}, {ID: "3", Namespace: "search", JobID: "a"}}),
		"PUT /v1/job/a/evaluate": answer(http.StatusOK, api.JobRegisterResponse{EvalID: "e"}),
	})
	n, err := c.ReevaluateBlocked(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("%d %v", n, err)
	}
	if !strings.Contains(f.requests[0], "filter=Status+%3D%3D+%22blocked%22") || !strings.Contains(f.requests[0], "namespace=%2A") {
		t.Errorf("listed %s", f.requests[0])
	}
}

func TestAgentTellsTheRegionAndWhetherACLsAreOn(t *testing.T) {
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/agent/self": answer(http.StatusOK, map[string]any{"config": map[string]any{"Region": "eu", "ACL": map[string]any{"Enabled": true}}}),
	})
	region, acls, err := c.Agent(context.Background())
	if err != nil || region != "eu" || !acls {
		t.Errorf("%q %v %v", region, acls, err)
	}
}

func TestListIsEveryNodeLiveJobActiveDeploymentAndAllocation(t *testing.T) {
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/nodes":   answer(http.StatusOK, []api.NodeListStub{{ID: "n1"}}),
		"GET /v1/node/n1": answer(http.StatusOK, api.Node{ID: "n1", Name: "gpu-1"}),
		"GET /v1/jobs": answer(http.StatusOK, []api.JobListStub{{ID: "live", Namespace: "vision", Status: "running"},
			{ID: "stopped", Namespace: "vision", Stop: true}, {ID: "dead", Namespace: "vision", Status: "dead", JobModifyIndex: 5, ModifyIndex: 9},
			// Nomad stored the job of a registration, not yet its evaluation.
			{ID: "registering", Namespace: "vision", Status: "dead", JobModifyIndex: 11, ModifyIndex: 11}}),
		"GET /v1/job/live":        answer(http.StatusOK, api.Job{ID: ptr("live"), Namespace: ptr("vision")}),
		"GET /v1/job/registering": answer(http.StatusOK, api.Job{ID: ptr("registering"), Namespace: ptr("vision")}),
		"GET /v1/deployments": answer(http.StatusOK, []api.Deployment{{ID: "d1", Status: api.DeploymentStatusRunning},
			{ID: "d2", Status: api.DeploymentStatusSuccessful}}),
		"GET /v1/allocations": answer(http.StatusOK, []api.AllocationListStub{{ID: "a1", Namespace: "vision", JobID: "live", NodeID: "n1"}}),
	})
	s, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Nodes) != 1 || s.Nodes[0].Name != "gpu-1" || len(s.Jobs) != 2 || *s.Jobs[0].ID != "live" || *s.Jobs[1].ID != "registering" ||
		len(s.Deployments) != 1 || s.Deployments[0].ID != "d1" || len(s.Allocs) != 1 || s.Allocs[0].NodeID != "n1" || s.Index != 42 {
		t.Errorf("snapshot: %+v", s)
	}
}

// The listings are read one after another, and the stream resumes after
// the last: a job registered or updated after the jobs were listed, whose
// allocation is listed, is read again; one stopped since is left out. Only
// allocations changed since the jobs' listing send their job to be read.
func TestAJobChangedBetweenTheListingsIsReadAgain(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/nodes": answer(http.StatusOK, []api.NodeListStub{}),
		"GET /v1/jobs": answer(http.StatusOK, []api.JobListStub{{ID: "updated", Namespace: "vision", Status: "running"},
			{ID: "steady", Namespace: "vision", Status: "running"}, {ID: "stopping", Namespace: "vision", Status: "running"}}),
		"GET /v1/job/updated": answerOnce(api.Job{ID: ptr("updated"), Namespace: ptr("vision"), Version: ptr(uint64(0))},
			api.Job{ID: ptr("updated"), Namespace: ptr("vision"), Version: ptr(uint64(1))}),
		"GET /v1/job/steady": answer(http.StatusOK, api.Job{ID: ptr("steady"), Namespace: ptr("vision"), Version: ptr(uint64(3))}),
		"GET /v1/job/stopping": answerOnce(api.Job{ID: ptr("stopping"), Namespace: ptr("vision"), Version: ptr(uint64(0))},
			api.Job{ID: ptr("stopping"), Namespace: ptr("vision"), Version: ptr(uint64(1)), Stop: ptr(true)}),
		"GET /v1/job/new": answer(http.StatusOK, api.Job{ID: ptr("new"), Namespace: ptr("vision"), Version: ptr(uint64(0))}),
		"GET /v1/job/gone": answer(http.StatusOK, api.Job{ID: ptr("gone"), Namespace: ptr("vision"), Version: ptr(uint64(0)), Stop: ptr(true),
			JobModifyIndex: ptr(uint64(45)), Meta: map[string]string{"nomad-gpu.admission": "v5:sig"}}),
		"GET /v1/deployments": answer(http.StatusOK, []api.Deployment{}),
		"GET /v1/allocations": answer(http.StatusOK, []api.AllocationListStub{
			{ID: "a1", Namespace: "vision", JobID: "updated", JobVersion: 1, ModifyIndex: 50},
			{ID: "a2", Namespace: "vision", JobID: "steady", JobVersion: 3, ModifyIndex: 50},
			{ID: "a3", Namespace: "vision", JobID: "new", ModifyIndex: 50}, {ID: "a4", Namespace: "vision", JobID: "stopping", JobVersion: 1, ModifyIndex: 50},
			// Stopped after the listing, with two allocations: read once, ended once.
			{ID: "a6", Namespace: "vision", JobID: "gone", ModifyIndex: 50}, {ID: "a7", Namespace: "vision", JobID: "gone", ModifyIndex: 51},
			// Unchanged since the jobs were listed (at 42): its job, stopped before, is not read.
			{ID: "a5", Namespace: "vision", JobID: "stopped-before", ModifyIndex: 30}}),
	})
	s, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, j := range s.Jobs {
		got[*j.ID] = *j.Version
	}
	if want := map[string]uint64{"updated": 1, "steady": 3, "new": 0}; !maps.Equal(got, want) {
		t.Errorf("the snapshot's jobs (id: version): %v, want %v", got, want)
	}
	all := strings.Join(f.requests, " ")
	if n := strings.Count(all, "GET /v1/job/steady?"); n != 1 {
		t.Errorf("a job listed at its allocation's version was read %d times, want once", n)
	}
	if strings.Contains(all, "stopped-before") {
		t.Errorf("the job of an allocation unchanged since the jobs were listed was read")
	}
	if n := strings.Count(all, "GET /v1/job/gone?"); n != 1 || len(s.Ended) != 1 || *s.Ended[0].ID != "gone" {
		t.Errorf("a stamped job stopped since, two allocations of it changed: read %d times, ended %d times; want once each", n, len(s.Ended))
	}
}

// A node that changed or joined while the other listings were read is read
// again, one gone is dropped, and deployments are listed after the
// allocations. The stream resumes after the last listing, so such changes
// would come neither as listed nor as events.
func TestNodesAndDeploymentsChangedDuringTheListingsAreReadAsTheyAreNow(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/nodes": answerOnce([]api.NodeListStub{{ID: "n1", ModifyIndex: 10}, {ID: "gone", ModifyIndex: 10}},
			[]api.NodeListStub{{ID: "n1", ModifyIndex: 20}, {ID: "joined", ModifyIndex: 21}}),
		"GET /v1/node/n1":     answerOnce(api.Node{ID: "n1", Status: "ready", ModifyIndex: 10}, api.Node{ID: "n1", Status: "down", ModifyIndex: 20}),
		"GET /v1/node/gone":   answer(http.StatusOK, api.Node{ID: "gone", Status: "ready", ModifyIndex: 10}),
		"GET /v1/node/joined": answer(http.StatusOK, api.Node{ID: "joined", Status: "ready", ModifyIndex: 21}),
		"GET /v1/jobs":        answer(http.StatusOK, []api.JobListStub{}),
		"GET /v1/deployments": answer(http.StatusOK, []api.Deployment{}),
		"GET /v1/allocations": answer(http.StatusOK, []api.AllocationListStub{}),
	})
	s, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range s.Nodes {
		got = append(got, n.ID+":"+n.Status)
	}
	if want := "n1:down joined:ready"; strings.Join(got, " ") != want {
		t.Errorf("the snapshot's nodes: %v, want %s", got, want)
	}
	all := strings.Join(f.requests, " ")
	if a, d := strings.Index(all, "GET /v1/allocations"), strings.Index(all, "GET /v1/deployments"); a < 0 || d < a {
		t.Errorf("deployments listed before the allocations: %s", all)
	}
}

// answerOnce answers first with first, then with then.
func answerOnce(first, then any) func(http.ResponseWriter, *http.Request) {
	var mu sync.Mutex
	n := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v := first
		if n++; n > 1 {
			v = then
		}
		mu.Unlock()
		answer(http.StatusOK, v)(w, r)
	}
}

func TestEventsSkipHeartbeatsAndEndOnABrokenStream(t *testing.T) {
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/event/stream": func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `{}`+"\n"+`{"Index":7,"Events":[{"Topic":"Job","Type":"JobRegistered","Key":"x","Index":7}]}`+"\n"+`{"Index":`)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	frames, err := c.Events(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for fr := range frames {
		if fr.Err != nil {
			got = append(got, "error")
			continue
		}
		got = append(got, fmt.Sprint(fr.Index))
	}
	if strings.Join(got, ",") != "7,error" {
		t.Errorf("frames %v", got)
	}
	for _, want := range []string{"index=5", "namespace=%2A", "topic=Node%3A%2A", "topic=Allocation%3A%2A"} {
		if !strings.Contains(f.requests[0], want) {
			t.Errorf("%s lacks %s", f.requests[0], want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A 403 to a registration is the broker's management token refused, never
// the job: not a refusal that parks the job. Nor are 408 and 429, which say
// Nomad did not take the request now (issue 34 §2: queued jobs parked for a
// 429 stayed parked).
func TestA403ToARegistrationIsTheBrokersToken(t *testing.T) {
	for status, want := range map[int][2]bool{403: {false, true}, 400: {true, false}, 500: {false, false},
		408: {false, false}, 429: {false, false}} {
		e := &nomadapi.RegisterError{Status: status}
		if got := [2]bool{e.Refused(), e.TokenRefused()}; got != want {
			t.Errorf("%d: refused, token refused = %v, want %v", status, got, want)
		}
	}
}

// A 403 to any call the broker makes with its own token says the token is
// refused; SetToken sends a new one from the next call on, and the first
// answer to it says the token is valid again.
func TestTheBrokersTokenRefusedAndReplaced(t *testing.T) {
	valid := "broker-secret"
	withToken := func(v any) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Nomad-Token") != valid {
				http.Error(w, "ACL token not found", http.StatusForbidden)
				return
			}
			answer(http.StatusOK, v)(w, r)
		}
	}
	none := []any{}
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/nodes": withToken(none), "GET /v1/jobs": withToken(none), "GET /v1/deployments": withToken(none),
		"GET /v1/allocations": withToken(none), "GET /v1/event/stream": withToken(none),
		"GET /v1/acl/token/acc": withToken(map[string]string{"AccessorID": "acc", "Type": "client"}),
	})
	ctx := context.Background()
	if _, err := c.List(ctx); err != nil || c.TokenRefused() {
		t.Fatalf("list: %v, refused %v", err, c.TokenRefused())
	}
	valid = "renewed"
	if _, err := c.List(ctx); err == nil || !c.TokenRefused() {
		t.Errorf("a listing refused: %v, refused %v", err, c.TokenRefused())
	}
	if err := c.SetToken("renewed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(ctx); err != nil || c.TokenRefused() || f.tokens[len(f.tokens)-1] != "renewed" {
		t.Errorf("with the new token: %v, refused %v, sent %v", err, c.TokenRefused(), f.tokens)
	}
	c.SetToken("revoked")
	var te *nomadapi.TokenError
	if _, err := c.Events(ctx, 1); !errors.As(err, &te) || !c.TokenRefused() {
		t.Errorf("the event stream refused: %v, refused %v", err, c.TokenRefused())
	}
	c.SetToken("renewed")
	if _, exists, err := c.Grants(ctx, "acc"); err != nil || !exists || c.TokenRefused() {
		t.Errorf("a read with the new token: exists %v, %v, refused %v", exists, err, c.TokenRefused())
	}
	c.SetToken("revoked")
	if _, _, err := c.Grants(ctx, "acc"); !errors.As(err, &te) || !c.TokenRefused() {
		t.Errorf("a read of a token refused: %v, refused %v", err, c.TokenRefused())
	}
}

// NomadNow is Nomad's clock (its Date header), carried on by this
// process's monotonic clock, and unknown before Nomad answered.
func TestNomadNowIsNomadsClock(t *testing.T) {
	ahead := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/acl/token/acc": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", ahead.Format(http.TimeFormat))
			answer(http.StatusOK, map[string]string{"AccessorID": "acc", "Type": "client"})(w, r)
		},
	})
	if _, ok := c.NomadNow(); ok {
		t.Fatal("Nomad's time known before it answered")
	}
	if _, _, err := c.Grants(context.Background(), "acc"); err != nil {
		t.Fatal(err)
	}
	now, ok := c.NomadNow()
	if d := now.Sub(ahead); !ok || d < 0 || d > 2*time.Second {
		t.Errorf("Nomad's time %s (%v), its Date header said %s", now, ok, ahead)
	}
}
