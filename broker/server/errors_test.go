package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// What a guard or a gate call returns is answered in one place. A hand-off
// is answered by its own answer, a refusal at its status, and a refusal of
// a body not read to its end with the connection closed after it.
func TestAnswerServesHandOffsAndRefusals(t *testing.T) {
	served := &handedOff{to: "Nomad", serve: func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) }}
	for _, c := range []struct {
		name  string
		err   error
		code  int
		body  string
		close bool
	}{
		{"a hand-off, as the guard returned it", served, http.StatusTeapot, "", false},
		{"a hand-off wrapped with the operation", fmt.Errorf("parse: %w", served), http.StatusTeapot, "", false},
		{"a refusal", front.Fail(front.ErrForbidden, "no"), http.StatusForbidden, "nomad-gpu: no", false},
		{"a body not read", unreadBody{front.Fail(front.ErrTooLarge, "big")}, http.StatusRequestEntityTooLarge, "nomad-gpu: big", true},
	} {
		rec := httptest.NewRecorder()
		answer(rec, c.err)
		if rec.Code != c.code || rec.Body.String() != c.body || (rec.Header().Get("Connection") == "close") != c.close {
			t.Errorf("%s: %d %q, Connection %q", c.name, rec.Code, rec.Body, rec.Header().Get("Connection"))
		}
	}
}
