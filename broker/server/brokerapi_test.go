package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// memApprovals keeps approvals in memory, versioned as the Consul store does.
type memApprovals struct {
	mu   sync.Mutex
	byID map[string]approval.Approval
}

func (m *memApprovals) Create(_ context.Context, a approval.Approval) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byID[a.ID]; ok {
		return false, nil
	}
	a.ModifyIndex = 1
	m.byID[a.ID] = a
	return true, nil
}

func (m *memApprovals) Update(_ context.Context, a approval.Approval) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID[a.ID].ModifyIndex != a.ModifyIndex {
		return false, nil
	}
	a.ModifyIndex++
	m.byID[a.ID] = a
	return true, nil
}

func (m *memApprovals) Get(_ context.Context, id string) (approval.Approval, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.byID[id]
	if !ok {
		return a, approval.ErrNotFound
	}
	return a, nil
}

func (m *memApprovals) List(context.Context) ([]approval.Approval, error) { return m.Current(), nil }

func (m *memApprovals) Current() []approval.Approval {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []approval.Approval
	for _, a := range m.byID {
		out = append(out, a)
	}
	return out
}

func TestApprovalsAreAskedByReadersAndDecidedByAnotherApprover(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	n := 0
	newID := func() string { n++; return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }
	store := &memApprovals{byID: map[string]approval.Approval{}}
	s.setPolicy(visionPolicy(t, "", `approvers = ["bob"]`))
	s.set(func(o *Options, a *gpuapi.Options) {
		o.ACLs, o.Approvals, o.NewID = true, store, newID
		a.ACLs, a.Approvals, a.NewID = true, store, newID
	})
	up.tokens = map[string]testToken{"ana": {"ana", []string{"vision"}, nil}, "bob": {"bob", []string{"vision"}, nil}, "eve": {"eve", nil, nil},
		"bob-laptop": {"bob", []string{"vision"}, nil}} // bob's second token
	as := func(tok, method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("X-Nomad-Token", tok)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	ask := `{"namespace":"vision","job":"big","reason":"deadline","extra_gpus":2,"for":"1h"}`
	for _, c := range []struct {
		tok, method, path, body string
		code                    int
		says                    string
	}{
		{"ana", "POST", "/v1/gpu/approvals", ask, http.StatusOK, `"state":"pending"`},                                         // id ...1
		{"bob", "POST", "/v1/gpu/approvals", ask, http.StatusOK, `"state":"pending"`},                                         // id ...2
		{"eve", "POST", "/v1/gpu/approvals", ask, http.StatusForbidden, `may not read namespace "vision"`},                    // id ...3, refused
		{"ana", "POST", "/v1/gpu/approvals", `{"namespace":"vision","job":"big"}`, http.StatusBadRequest, "says why"},         // id ...4, refused
		{"ana", "POST", "/v1/gpu/approvals", strings.Replace(ask, "vision", "nobody", 1), http.StatusBadRequest, "no tenant"}, // id ...5
		{"ana", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000002/grant", "", http.StatusForbidden, "ana is not one of the policy's approvers"},
		{"bob", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000002/grant", "", http.StatusForbidden, "nobody grants or denies their own request"},
		{"bob-laptop", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000002/deny", "", http.StatusForbidden, "nobody grants or denies their own request"},
		{"ana", "POST", "/v1/gpu/approvals", strings.Replace(ask, `"extra_gpus":2`, `"extra_gpus":17`, 1), http.StatusBadRequest, // by default at most the limit, 2
			`tenant "vision"'s approvals grant at most 2 GPUs above its limit (approvals { max_extra_gpus }), not 17`}, // id ...6
		{"ana", "POST", "/v1/gpu/approvals", strings.Replace(ask, "1h", "169h", 1), http.StatusBadRequest, "not a duration of at most 168h0m0s"}, // id ...7
		{"bob", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000001/grant", "", http.StatusOK, `"state":"granted"`},
		{"bob", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000001/deny", "", http.StatusConflict, "is granted, not pending"},
		{"bob", "POST", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000001/approve", "", http.StatusNotFound, "no such endpoint"},
		{"eve", "GET", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000001", "", http.StatusNotFound, "no approval"},
		{"ana", "GET", "/v1/gpu/approvals/00000000-0000-4000-8000-000000000001", "", http.StatusOK, `"decided_by":"bob (acc-bob)"`},
		{"eve", "GET", "/v1/gpu/approvals", "", http.StatusOK, "[]"},
		{"ana", "DELETE", "/v1/gpu/approvals", "", http.StatusMethodNotAllowed, "DELETE not allowed"},
	} {
		rec := as(c.tok, c.method, c.path, c.body)
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.says) {
			t.Errorf("%s %s %s: %d %s, want %d with %q", c.tok, c.method, c.path, rec.Code, rec.Body, c.code, c.says)
		}
	}
	if rec := as("ana", "GET", "/v1/gpu/approvals", ""); strings.Count(rec.Body.String(), `"id"`) != 2 {
		t.Errorf("ana's listing: %s", rec.Body)
	}
}

// auditedServer gives s an audit trail of its own, in a temporary file.
func auditedServer(t *testing.T, s *testFront) *audit.Log {
	t.Helper()
	trail, err := audit.Open(filepath.Join(t.TempDir(), "audit.log"), 1<<20, 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { trail.Close() })
	s.set(func(o *Options, a *gpuapi.Options) { o.Audit, a.Audit = trail, trail })
	return trail
}

func TestTheAuditTrailIsServedFilteredAndAsTheCallerMayReadIt(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	trail := auditedServer(t, s)
	if rec := do(s, http.MethodPut, "/v1/jobs", testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").Register()); rec.Code != http.StatusOK {
		t.Fatalf("register: %d %s", rec.Code, rec.Body)
	}
	trail.Write(audit.Event{Who: audit.BrokerAct, What: audit.PolicyReload, Result: "loaded"})
	for _, c := range []struct {
		query string
		has   []string
		lacks []string
	}{
		{"", []string{`"job":"train"`, `"policy-reload"`}, nil},
		{"?job=train", []string{`"job":"train"`}, []string{`"policy-reload"`}},
		{"?tenant=nobody", []string{"[]"}, []string{`"job"`}},
	} {
		rec := do(s, http.MethodGet, "/v1/gpu/audit"+c.query, "")
		for _, want := range c.has {
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
				t.Errorf("audit%s: %d %s, want %s", c.query, rec.Code, rec.Body, want)
			}
		}
		for _, not := range c.lacks {
			if strings.Contains(rec.Body.String(), not) {
				t.Errorf("audit%s: %s has %s", c.query, rec.Body, not)
			}
		}
	}
	if rec := do(s, http.MethodGet, "/v1/gpu/audit?since=soon", ""); rec.Code != http.StatusBadRequest {
		t.Errorf("a bad since: %d %s", rec.Code, rec.Body)
	}
	// With ACLs, a caller sees the events of namespaces it may read, and those of none.
	s.setACLs(true)
	up.tokens = map[string]testToken{"eve": {"eve", nil, nil}}
	req := httptest.NewRequest(http.MethodGet, "/v1/gpu/audit", nil)
	req.Header.Set("X-Nomad-Token", "eve")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if strings.Contains(rec.Body.String(), `"job":"train"`) || !strings.Contains(rec.Body.String(), `"policy-reload"`) {
		t.Errorf("eve's trail: %s", rec.Body)
	}
}

// days are stored rollups, by day.
type days map[string]usage.Rollup

func (d days) Days(_ context.Context, from, to string) ([]usage.Rollup, error) {
	var out []usage.Rollup
	for day, r := range d {
		if day >= from && day <= to {
			out = append(out, r)
		}
	}
	return out, nil
}

func TestTheUsageReportAddsUpTheDaysAsked(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	if rec := do(s, http.MethodGet, "/v1/gpu/usage?from=2026-11-01", ""); rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "keeps no usage history") {
		t.Errorf("no history kept: %d %s", rec.Code, rec.Body)
	}
	row := func(tenant string, hours float64) usage.Row {
		return usage.Row{Key: usage.Key{Tenant: tenant, Queue: "training"}, Seconds: usage.Seconds{Allocated: hours * 3600, Busy: hours * 1800, Idle: hours * 1800}}
	}
	s.set(func(_ *Options, a *gpuapi.Options) {
		a.Rollups = days{
			"2026-11-28": {Day: "2026-11-28", Rows: []usage.Row{row("vision", 10)}},
			"2026-11-29": {Day: "2026-11-29", Rows: []usage.Row{row("vision", 2)}},
			"2026-11-30": {Day: "2026-11-30", Rows: []usage.Row{row("vision", 100)}},
		}
	})
	rec := do(s, http.MethodGet, "/v1/gpu/usage?from=2026-11-28&to=2026-11-30", "")
	var rep gpuapi.UsageReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rec.Code != http.StatusOK || len(rep.Rows) != 1 ||
		rep.Rows[0].AllocatedHours != 12 || rep.Rows[0].IdleShare != 0.5 || rep.By != "tenant" || rep.To != "2026-11-30" {
		t.Fatalf("the 28th and 29th (to is not included): %d %s", rec.Code, rec.Body)
	}
	for _, bad := range []string{"from=yesterday", "from=2026-11-30&to=2026-11-29", "from=2026-11-28&by=color", "from=2026-11-28&to=soon"} {
		if rec := do(s, http.MethodGet, "/v1/gpu/usage?"+bad, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, rec.Code, rec.Body)
		}
	}
}

// The health check needs no token (Consul's checks hold none) and says why
// the broker cannot do its work, naming no tenant or job.
func TestHealthSaysWhyTheBrokerCannotWork(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	s.setACLs(true)
	if rec := do(s, http.MethodGet, "/v1/gpu/health", ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"ok"`) {
		t.Errorf("healthy: %d %s", rec.Code, rec.Body)
	}
	s.set(func(_ *Options, a *gpuapi.Options) {
		a.Unhealthy = func() string { return "Nomad refuses the broker's own token" }
	})
	if rec := do(s, http.MethodGet, "/v1/gpu/health", ""); rec.Code != http.StatusServiceUnavailable ||
		!strings.Contains(rec.Body.String(), "unhealthy: Nomad refuses the broker's own token") {
		t.Errorf("unhealthy: %d %s", rec.Code, rec.Body)
	}
	if rec := do(s, http.MethodGet, "/v1/gpu/usage", ""); rec.Code != http.StatusForbidden {
		t.Errorf("the rest of the API without a token: %d", rec.Code)
	}
}
