package front

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
		{Fail(ErrBadRequest, "bad"), http.StatusBadRequest},
		{Fail(ErrForbidden, "no"), http.StatusForbidden},
		{Fail(ErrNotFound, "none"), http.StatusNotFound},
		{Fail(ErrNotAllowed, "no"), http.StatusMethodNotAllowed},
		{Fail(ErrConflict, "changed"), http.StatusConflict},
		{Fail(ErrTooLarge, "big"), http.StatusRequestEntityTooLarge},
		{Fail(ErrTooMany, "many"), http.StatusTooManyRequests},
		{Fail(ErrUnavailable, "consul"), http.StatusServiceUnavailable},
		{Fail(ErrNomadUnreach, "nomad"), http.StatusBadGateway},
		// The kind decides, whatever the cause it wraps.
		{Fail(ErrUnavailable, "listing: %w", queue.ErrNotFound), http.StatusServiceUnavailable},
		// Domain errors, wrapped with the operation.
		{fmt.Errorf("read entry: %w", queue.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("read: %w", reclaim.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("read: %w", approval.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("scale: %w", ErrNoJob), http.StatusNotFound},
		// Nomad's answer to the caller's token is the broker's; no answer is a 502.
		{fmt.Errorf("plan: %w", &LookupError{Status: http.StatusForbidden}), http.StatusForbidden},
		{fmt.Errorf("plan: %w", &LookupError{Status: http.StatusInternalServerError}), http.StatusBadGateway},
		{errors.New("anything else"), http.StatusInternalServerError},
	} {
		if got := StatusOf(c.err); got != c.want {
			t.Errorf("%v: %d, want %d", c.err, got, c.want)
		}
	}
	rec := httptest.NewRecorder()
	WriteError(rec, Fail(ErrConflict, "queued job %q changed", "x"))
	if rec.Code != http.StatusConflict || rec.Body.String() != `nomad-gpu: queued job "x" changed` {
		t.Errorf("%d %q", rec.Code, rec.Body)
	}
}
