package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

func TestTheBrokersAPIIsRoutedByMethodAndPath(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	for _, c := range []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/v1/gpu/queue", http.StatusOK, "["},
		{"POST", "/v1/gpu/queue", http.StatusMethodNotAllowed, "nomad-gpu: POST not allowed on /v1/gpu/queue"},
		{"GET", "/v1/gpu/queue/not-an-id", http.StatusBadRequest, `"not-an-id" is not a queue id`},
		{"GET", "/v1/gpu/queue/" + testQueueID, http.StatusNotFound, "no queued job"},
		{"PATCH", "/v1/gpu/queue/" + testQueueID, http.StatusMethodNotAllowed, "PATCH not allowed"},
		{"GET", "/v1/gpu/queue/a/b", http.StatusNotFound, "no such endpoint GET /v1/gpu/queue/a/b"},
		{"GET", "/v1/gpu/usage", http.StatusOK, "{"},
		{"DELETE", "/v1/gpu/usage", http.StatusMethodNotAllowed, "DELETE not allowed"},
		{"GET", "/v1/gpu/nothing", http.StatusNotFound, "nomad-gpu: no such endpoint GET /v1/gpu/nothing"},
		// This broker keeps no approvals, decisions or profiles: not served.
		{"GET", "/v1/gpu/approvals", http.StatusNotFound, "no such endpoint"},
		{"POST", "/v1/gpu/approvals/" + testQueueID + "/grant", http.StatusNotFound, "no such endpoint"},
		{"GET", "/v1/gpu/reclaim", http.StatusNotFound, "no such endpoint"},
		{"GET", "/v1/gpu/trace", http.StatusNotFound, "no such endpoint"},
	} {
		rec := do(s, c.method, c.path, "")
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("%s %s: %d %q, want %d with %q", c.method, c.path, rec.Code, rec.Body, c.code, c.body)
		}
	}
}

// GET /v1/gpu/queue pages as Nomad's lists do (per_page, next_token,
// X-Nomad-NextToken), keeps each entry's place in the whole queue, and
// blocks on the queue's index until it changes.
func TestTheQueueListPagesAndBlocks(t *testing.T) {
	s, _, q, _ := newTestServer(t)
	now := time.Now()
	for i := range 5 {
		q.Put(t.Context(), queue.Entry{ID: fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i), JobID: fmt.Sprintf("j%d", i),
			Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1, SubmittedAt: now.Add(time.Duration(i) * time.Second)})
	}
	page := func(query string) ([]gpuapi.QueuedJob, http.Header) {
		t.Helper()
		rec := do(s, http.MethodGet, "/v1/gpu/queue"+query, "")
		var out []gpuapi.QueuedJob
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
			t.Fatalf("%s: %d %s", query, rec.Code, rec.Body)
		}
		return out, rec.Header()
	}
	var seen []string
	next, pages := "", 0
	for {
		jobs, h := page("?per_page=2&next_token=" + next)
		pages++
		for _, j := range jobs {
			seen = append(seen, fmt.Sprintf("%d:%s", j.Position, j.JobID))
		}
		if h.Get("X-Nomad-Gpu-Queued") != "5" {
			t.Errorf("X-Nomad-Gpu-Queued %q", h.Get("X-Nomad-Gpu-Queued"))
		}
		if next = h.Get("X-Nomad-NextToken"); next == "" {
			break
		}
	}
	if got := strings.Join(seen, " "); got != "1:j0 2:j1 3:j2 4:j3 5:j4" || pages != 3 {
		t.Errorf("%d pages: %s", pages, got)
	}
	for _, bad := range []string{"?per_page=0", "?per_page=x", "?next_token=-1", "?index=x", "?index=1&wait=soon"} {
		if rec := do(s, http.MethodGet, "/v1/gpu/queue"+bad, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, rec.Code, rec.Body)
		}
	}
	// Blocking: an index the queue has not passed waits for a change.
	_, h := page("")
	index := h.Get("X-Nomad-Index")
	start := time.Now()
	if _, h := page("?index=" + index + "&wait=300ms"); h.Get("X-Nomad-Index") != index || time.Since(start) < 300*time.Millisecond {
		t.Errorf("no change: answered after %s with index %s", time.Since(start), h.Get("X-Nomad-Index"))
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		q.Put(context.Background(), queue.Entry{ID: "00000000-0000-4000-8000-000000000009", JobID: "j9", Namespace: "vision", Tenant: "vision",
			Queue: "training", Demand: 1, SubmittedAt: now.Add(time.Minute)})
	}()
	start = time.Now()
	jobs, h := page("?index=" + index + "&wait=10s")
	if took := time.Since(start); took > 5*time.Second || len(jobs) != 6 || h.Get("X-Nomad-Index") == index {
		t.Errorf("a change: answered after %s with %d jobs, index %s (was %s)", took, len(jobs), h.Get("X-Nomad-Index"), index)
	}
}
