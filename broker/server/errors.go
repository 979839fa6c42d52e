package server

import (
	"errors"
	"net/http"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// handedOff is a request a guard hands on instead of deciding it: to Nomad
// as it is (no GPU in it), or to another broker (the leader, another
// region's). It is not the caller's error: answer serves it, by serve.
type handedOff struct {
	to    string
	serve func(w http.ResponseWriter)
}

func (h *handedOff) Error() string { return "handed off to " + h.to }

// unreadBody marks a refusal of a request whose body was not read to its
// end: its answer closes the connection after. Else Go's server would first
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
		front.WriteError(w, err)
	}
}
