package server

import (
	"net/http"
	"strings"
	"testing"
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
