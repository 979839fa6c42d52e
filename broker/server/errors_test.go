package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

func TestOnePlaceMapsErrorsToStatuses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{fail(errBadRequest, "bad"), http.StatusBadRequest},
		{fail(errForbidden, "no"), http.StatusForbidden},
		{fail(errNotFound, "none"), http.StatusNotFound},
		{fail(errNotAllowed, "no"), http.StatusMethodNotAllowed},
		{fail(errConflict, "changed"), http.StatusConflict},
		{fail(errTooLarge, "big"), http.StatusRequestEntityTooLarge},
		{fail(errTooMany, "many"), http.StatusTooManyRequests},
		{fail(errUnavailable, "consul"), http.StatusServiceUnavailable},
		{fail(errNomadUnreach, "nomad"), http.StatusBadGateway},
		// The kind decides, whatever the cause it wraps.
		{fail(errUnavailable, "listing: %w", queue.ErrNotFound), http.StatusServiceUnavailable},
		// Domain errors, wrapped with the operation.
		{fmt.Errorf("read entry: %w", queue.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("read: %w", reclaim.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("read: %w", approval.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("scale: %w", errNoJob), http.StatusNotFound},
		// Nomad's answer to the caller's token is the broker's; no answer is a 502.
		{fmt.Errorf("plan: %w", &lookupError{status: http.StatusForbidden}), http.StatusForbidden},
		{fmt.Errorf("plan: %w", &lookupError{status: http.StatusInternalServerError}), http.StatusBadGateway},
		{errors.New("anything else"), http.StatusInternalServerError},
	} {
		if got := statusOf(c.err); got != c.want {
			t.Errorf("%v: %d, want %d", c.err, got, c.want)
		}
	}
	rec := httptest.NewRecorder()
	writeError(rec, fail(errConflict, "queued job %q changed", "x"))
	if rec.Code != http.StatusConflict || rec.Body.String() != `nomad-gpu: queued job "x" changed` {
		t.Errorf("%d %q", rec.Code, rec.Body)
	}
}

// What a guard or a gate call returns is answered in one place: a hand-off
// by its own answer, a refusal at its status, and a refusal of a body not
// read to its end with the connection closed after it.
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
		{"a refusal", fail(errForbidden, "no"), http.StatusForbidden, "nomad-gpu: no", false},
		{"a body not read", unreadBody{fail(errTooLarge, "big")}, http.StatusRequestEntityTooLarge, "nomad-gpu: big", true},
	} {
		rec := httptest.NewRecorder()
		answer(rec, c.err)
		if rec.Code != c.code || rec.Body.String() != c.body || (rec.Header().Get("Connection") == "close") != c.close {
			t.Errorf("%s: %d %q, Connection %q", c.name, rec.Code, rec.Body, rec.Header().Get("Connection"))
		}
	}
}
