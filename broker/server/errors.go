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

// handedOff is a request a guard hands on instead of deciding it: to Nomad
// as it is (no GPU in it), or to another broker (the leader, another
// region's). It is not the caller's error: answer serves it, by serve.
type handedOff struct {
	to    string
	serve func(w http.ResponseWriter)
}

func (h *handedOff) Error() string { return "handed off to " + h.to }

// unreadBody marks a refusal of a request whose body was not read to its
// end: its answer closes the connection after, else Go's server would first
// read what is left of the body, waiting on a client that may never send it.
type unreadBody struct{ error }

func (u unreadBody) Unwrap() error { return u.error }

// answer writes what a guard or a gate call returned: a hand-off served,
// or an error (nil: the call answered itself).
func answer(w http.ResponseWriter, err error) {
	var h *handedOff
	switch {
	case err == nil:
	case errors.As(err, &h):
		h.serve(w)
	default:
		if errors.As(err, new(unreadBody)) {
			w.Header().Set("Connection", "close")
		}
		writeError(w, err)
	}
}

// writeError answers err as text, with the broker's prefix, at statusOf(err):
// in Nomad's style, so that the nomad CLI prints the body after the code.
func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(statusOf(err))
	fmt.Fprint(w, "nomad-gpu: "+err.Error())
}
