package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Kinds of answer the broker gives for itself instead of Nomad's. A handler
// says what went wrong and of which kind (fail); statusOf alone says which
// HTTP status each kind, and each error of the domain, answers with.
var (
	errBadRequest   = errors.New("bad request")
	errForbidden    = errors.New("forbidden")
	errNotFound     = errors.New("not found")
	errNotAllowed   = errors.New("method not allowed")
	errConflict     = errors.New("conflict")
	errTooLarge     = errors.New("request too large")
	errTooMany      = errors.New("too many")
	errTimeout      = errors.New("request timeout")
	errUnavailable  = errors.New("unavailable") // Consul, the audit trail or the broker leader
	errNomadUnreach = errors.New("nomad unreachable")
	errInternal     = errors.New("internal")
)

// failure is an answer of the broker's own: the sentence the user reads, and
// its kind.
type failure struct {
	kind error
	msg  string
}

func (f *failure) Error() string { return f.msg }
func (f *failure) Unwrap() error { return f.kind }

// fail is a failure of kind with a message; %w in format keeps the cause
// reachable too (a Nomad answer, a domain error), but the kind decides.
func fail(kind error, format string, args ...any) error {
	return &failure{kind: kind, msg: fmt.Errorf(format, args...).Error()}
}

// statusOf is the HTTP status err answers with: its kind's, or, for an error
// that is not a failure, that of the domain error it wraps.
func statusOf(err error) int {
	var f *failure
	if errors.As(err, &f) {
		err = f.kind
	}
	var le *lookupError
	switch {
	case errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, errForbidden):
		return http.StatusForbidden
	case errors.Is(err, errNotFound), errors.Is(err, errNoJob), errors.Is(err, queue.ErrNotFound),
		errors.Is(err, reclaim.ErrNotFound), errors.Is(err, approval.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errNotAllowed):
		return http.StatusMethodNotAllowed
	case errors.Is(err, errConflict):
		return http.StatusConflict
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errTooMany):
		return http.StatusTooManyRequests
	case errors.Is(err, errTimeout):
		return http.StatusRequestTimeout
	case errors.Is(err, errUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errNomadUnreach):
		return http.StatusBadGateway
	case errors.As(err, &le):
		if le.status >= 400 && le.status < 500 {
			return le.status // Nomad refused the caller: so does the broker
		}
		return http.StatusBadGateway
	case errors.Is(err, errInternal):
		return http.StatusInternalServerError
	}
	return http.StatusInternalServerError
}

// writeError answers err as text, with the broker's prefix, at statusOf(err):
// in Nomad's style, so that the nomad CLI prints the body after the code.
func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(statusOf(err))
	fmt.Fprint(w, "nomad-gpu: "+err.Error())
}
