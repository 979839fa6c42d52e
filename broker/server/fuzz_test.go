package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// FuzzHandler: whatever request arrives, the broker answers without a panic
// and never with a 5xx of its own making, and no job with GPUs reaches Nomad
// without the broker's admission: its priority, its stamp, within the limit.
func FuzzHandler(f *testing.F) {
	job := testbuild.Job("vision", "j").Group("g", 1, 2, "nvidia/gpu").Register()
	for _, seed := range []struct{ method, path, body string }{
		{"PUT", "/v1/jobs", job},
		{"POST", "/v1/job/j", job},
		{"PUT", "/v1/job/", strings.ToLower(job)},
		{"PUT", "/v1/job/j/plan", job},
		{"PUT", "/v1/validate/job", job},
		{"PUT", "/v1/job/j/scale?namespace=vision", `{"Count":5,"Target":{"Group":"g"}}`},
		{"PUT", "/v1/job/j/dispatch", `{"Payload":"eA=="}`},
		{"PUT", "/v1/job/j/revert", `{"JobID":"j","JobVersion":0}`},
		{"PUT", "/v1/job/j/periodic/force", ``},
		{"PUT", "/v1/jobs?namespace=vision&region=eu", job},
		{"PUT", "/v1/job/a/../../jobs", job},
		{"DELETE", "/v1/gpu/queue/../../x", ``},
		{"GET", "/v1/gpu/queue", ``},
	} {
		f.Add(seed.method, seed.path, []byte(seed.body))
	}
	s, up, _, _ := newTestServer(f)
	up.jobs["j"] = testbuild.Job("vision", "j").Priority(60).Group("g", 1, 1, "gpu").Build()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") {
			return // not a request line an HTTP server would accept
		}
		req, err := http.NewRequest(method, "http://broker"+path, strings.NewReader(string(body)))
		if err != nil {
			return
		}
		up.mu.Lock()
		up.raw, up.writes = nil, nil
		up.mu.Unlock()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusBadGateway && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		if route(method, req.URL.Path).call != callRegister || len(up.writes) == 0 {
			return // plans and validations change nothing in Nomad
		}
		var reg api.JobRegisterRequest
		if json.Unmarshal(up.raw, &reg) != nil || reg.Job == nil {
			return // not a job body: a scale, dispatch or the like, decided on its own
		}
		groups, err := nomadjob.Groups(reg.Job, nomadjob.Placement{})
		if err != nil || len(groups) == 0 || nomadjob.IsParent(reg.Job) {
			return
		}
		gpus := 0
		for _, g := range groups {
			gpus += g.Count * g.GPUsPerAlloc
		}
		if gpus == 0 {
			return
		}
		verified := s.o.Stamper.Verify(reg.Job)
		if reg.Job.Priority == nil || *reg.Job.Priority != 60 || !verified || gpus > 2 {
			t.Fatalf("a GPU job reached Nomad unadmitted: priority %v stamp ok %v, %d GPUs\n%s %s\n%s", reg.Job.Priority, verified, gpus, method, path, up.raw)
		}
	})
}
