package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestTheGPUMapIsABlockingQueryOnTheViewsIndex(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	view := s.cluster.(*cluster.View)
	view.Reset(cluster.Snapshot{Nodes: []*api.Node{testbuild.Node("n", "H100", 2, 0)},
		Allocs: []*api.Allocation{testbuild.Alloc("a1", "vision", "train", "n", 10, "n-0").Build()}})
	var m gpuapi.GPUMap
	rec := do(s, http.MethodGet, "/v1/gpu/nodes", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if len(m.Nodes) != 1 || len(m.Nodes[0].GPUs) != 2 || m.Nodes[0].GPUs[0].Job != "train" || m.Nodes[0].GPUs[1].State != cluster.GPUFree || m.IdleBelow != 5 {
		t.Fatalf("map %+v", m)
	}

	// Waits for an index above the one given, up to wait.
	start := time.Now()
	rec = do(s, http.MethodGet, "/v1/gpu/nodes?index=0&wait=5s", "")
	if time.Since(start) > 2*time.Second || rec.Code != http.StatusOK {
		t.Errorf("index=0 (as Nomad: no wait) waited %s: %d", time.Since(start), rec.Code)
	}
	start = time.Now()
	rec = do(s, http.MethodGet, "/v1/gpu/nodes?index=99&wait=300ms", "")
	if waited := time.Since(start); waited < 300*time.Millisecond || rec.Code != http.StatusOK {
		t.Errorf("index=99 answered after %s: %d %s", waited, rec.Code, rec.Body)
	}
	for _, q := range []string{"index=x", "index=1&wait=soon", "index=1&wait=-1s"} {
		if rec := do(s, http.MethodGet, "/v1/gpu/nodes?"+q, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", q, rec.Code, rec.Body)
		}
	}
}

// With ACLs the map needs node read, and shows who holds a GPU only in the
// namespaces the caller may read.
func TestTheGPUMapWithACLs(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	s.setACLs(true)
	up.tokens = map[string]testToken{"ana": {"ana", []string{"vision"}, []string{"node-read"}},
		"eve": {"eve", nil, []string{"node-read"}}, "bob": {"bob", []string{"vision"}, nil}}
	s.cluster.(*cluster.View).Reset(cluster.Snapshot{Nodes: []*api.Node{testbuild.Node("n", "H100", 2, 0)},
		Allocs: []*api.Allocation{testbuild.Alloc("a1", "vision", "train", "n", 10, "n-0").Build()}})
	get := func(tok string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/gpu/nodes", nil)
		req.Header.Set("X-Nomad-Token", tok)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := get("ana"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"job":"train"`) {
		t.Errorf("ana: %d %s", rec.Code, rec.Body)
	}
	if rec := get("eve"); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "train") || strings.Contains(rec.Body.String(), "vision") ||
		!strings.Contains(rec.Body.String(), `"state":"held"`) {
		t.Errorf("eve, who may not read vision: %d %s", rec.Code, rec.Body)
	}
	if rec := get("bob"); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "read nodes") {
		t.Errorf("bob, who may not read nodes: %d %s", rec.Code, rec.Body)
	}
}

// The UI is served from the binary under /gpu/, never framed, with the
// broker's API its only destination.
func TestTheWebUIIsServedFromTheBinary(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	if rec := do(s, http.MethodGet, "/gpu", ""); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/gpu/" {
		t.Errorf("/gpu: %d %v", rec.Code, rec.Header())
	}
	rec := do(s, http.MethodGet, "/gpu/", "")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "GPU map") || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("/gpu/: %d %v %.200s", rec.Code, rec.Header(), rec.Body)
	}
	for _, f := range []string{"app.js", "app.css"} {
		if rec := do(s, http.MethodGet, "/gpu/"+f, ""); rec.Code != http.StatusOK || rec.Body.Len() < 1000 {
			t.Errorf("%s: %d, %d bytes", f, rec.Code, rec.Body.Len())
		}
	}
	if rec := do(s, http.MethodPost, "/gpu/", ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /gpu/: %d", rec.Code)
	}
	if len(up.writes) != 0 {
		t.Errorf("the UI reached Nomad: %v", up.writes)
	}
}
