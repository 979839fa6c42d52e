package front

import (
	"net/http"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
)

// Handler serves an endpoint of the broker's own API: it returns the
// answer, or the error that says why there is none (StatusOf maps it), and
// writes nothing but headers; Respond writes either.
type Handler func(w http.ResponseWriter, r *http.Request) (any, error)

// SelfWritten is an answer that is not JSON: it writes its own body.
type SelfWritten interface {
	WriteAnswer(w http.ResponseWriter) error
}

// Respond serves h: its answer as JSON (200), or its error; log tells of
// an answer that could not be written.
func Respond(log hclog.Logger, h Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		out, err := h(w, r)
		if err != nil {
			WriteError(w, err)
			return
		}
		switch o := out.(type) {
		case nil:
		case SelfWritten:
			if err := o.WriteAnswer(w); err != nil {
				log.Warn("writing the answer failed", "path", r.URL.Path, "error", err)
			}
		default:
			WriteJSON(w, http.StatusOK, out)
		}
	}
}

// Audited writes e to the audit trail before anything is acknowledged or
// done; when it cannot, the caller is answered 503 and nothing is done.
func Audited(trail *audit.Log, e audit.Event) error {
	if err := trail.Write(e); err != nil {
		return Fail(ErrUnavailable, "the audit trail cannot be written, so nothing was done: %v", err)
	}
	return nil
}

// Refused is refusal err, audited as e: the audit trail's own error if it
// cannot be written.
func Refused(trail *audit.Log, e audit.Event, err error) error {
	if aerr := Audited(trail, e); aerr != nil {
		return aerr
	}
	return err
}
