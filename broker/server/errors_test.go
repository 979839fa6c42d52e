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
