package front

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Kinds of answer the broker gives for itself instead of Nomad's. A handler
// says what went wrong and of which kind (fail); StatusOf alone says which
// HTTP status each kind, and each error of the domain, answers with.
var (
	ErrBadRequest   = errors.New("bad request")
	ErrForbidden    = errors.New("forbidden")
	ErrNotFound     = errors.New("not found")
	ErrNotAllowed   = errors.New("method not allowed")
	ErrConflict     = errors.New("conflict")
	ErrTooLarge     = errors.New("request too large")
	ErrTooMany      = errors.New("too many")
	ErrTimeout      = errors.New("request timeout")
	ErrUnavailable  = errors.New("unavailable") // Consul, the audit trail or the broker leader
	ErrNomadUnreach = errors.New("nomad unreachable")
	ErrInternal     = errors.New("internal")
)

// failure is an answer of the broker's own: the sentence the user reads, and
// its kind.
type failure struct {
	kind error
	msg  string
}

func (f *failure) Error() string { return f.msg }
func (f *failure) Unwrap() error { return f.kind }

// Fail is a failure of kind with a message; %w in format keeps the cause
// reachable too (a Nomad answer, a domain error), but the kind decides.
func Fail(kind error, format string, args ...any) error {
	return &failure{kind: kind, msg: fmt.Errorf(format, args...).Error()}
}

// StatusOf is the HTTP status err answers with: its kind's, or, for an error
// that is not a failure, that of the domain error it wraps.
func StatusOf(err error) int {
	var f *failure
	if errors.As(err, &f) {
		err = f.kind
	}
	var le *LookupError
	switch {
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNoJob), errors.Is(err, queue.ErrNotFound),
		errors.Is(err, reclaim.ErrNotFound), errors.Is(err, approval.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrNotAllowed):
		return http.StatusMethodNotAllowed
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrTooMany):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrTimeout):
		return http.StatusRequestTimeout
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrNomadUnreach):
		return http.StatusBadGateway
	case errors.As(err, &le):
		if le.Status >= 400 && le.Status < 500 {
			return le.Status // Nomad refused the caller: so does the broker
		}
		return http.StatusBadGateway
	case errors.Is(err, ErrInternal):
		return http.StatusInternalServerError
	}
	return http.StatusInternalServerError
}

// WriteError answers err as text, with the broker's prefix, at StatusOf(err):
// in Nomad's style, so that the nomad CLI prints the body after the code.
func WriteError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(StatusOf(err))
	fmt.Fprint(w, "nomad-gpu: "+err.Error())
}

// WriteJSON answers v as JSON at status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
