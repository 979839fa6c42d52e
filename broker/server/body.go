package server

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// MaxBody is the largest request body the broker reads (Nomad's jobs are far smaller).
const MaxBody = 16 << 20

// Bodies above LargeBody (or of unknown length) are read by at most
// MaxLargeBodies calls at once, and MaxLargeBodiesPerClient from one client
// address. So a burst of huge requests cannot take the broker's memory, and
// one client's cannot take every slot. A client that holds a slot never
// takes the last free one, which is kept for a client holding none. One
// more is answered 503 at once. (Behind a proxy, every client has the
// proxy's address.)
const (
	LargeBody               = 1 << 20
	MaxLargeBodies          = 4
	MaxLargeBodiesPerClient = 2
)

// DefaultBodyReadTimeout is how long a request body may take to arrive.
const DefaultBodyReadTimeout = 30 * time.Second

// After BodyAllowance a body must keep arriving at MinBodyRate (bytes a
// second, on average since its start), else it is refused with 408. A
// client that trickles its uploads holds a slot for seconds, not for the
// whole body read timeout, and cannot keep every slot taken.
const (
	BodyAllowance = 2 * time.Second
	MinBodyRate   = 64 << 10
)

// bodySlots count the large bodies being read, in all and by client.
type bodySlots struct {
	mu       sync.Mutex
	inFlight int
	byClient map[string]int
}

// take holds a slot for a large body from client until release.
func (b *bodySlots) take(client string) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.inFlight >= MaxLargeBodies:
		return nil, front.Fail(front.ErrUnavailable, "too many large requests at once; try again")
	case b.byClient[client] >= MaxLargeBodiesPerClient:
		return nil, front.Fail(front.ErrUnavailable, "too many large requests from %s at once; send them one after another", client)
	case b.byClient[client] > 0 && b.inFlight == MaxLargeBodies-1:
		return nil, front.Fail(front.ErrUnavailable, "too many large requests at once, and the last free slot is kept for another client; "+
			"send yours from %s one after another", client)
	}
	if b.byClient == nil {
		b.byClient = map[string]int{}
	}
	b.inFlight++
	b.byClient[client]++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.inFlight--
		if b.byClient[client]--; b.byClient[client] == 0 {
			delete(b.byClient, client)
		}
	}, nil
}

// clientOf is the address a request came from, without its port.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// readBody reads a size-limited body; its error says why it could not:
// 413 above MaxBody, 408 when it does not arrive within the body read
// timeout (a client that stalls holds its slot no longer), 400 otherwise.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	// The machine's clock, not s.clock: a socket's read deadline is one.
	p := &paced{r: http.MaxBytesReader(nil, r.Body, MaxBody), rc: rc, start: time.Now(), limit: s.bodyReadTimeout}
	rc.SetReadDeadline(p.deadline()) // not supported by test recorders: no deadline there
	body, err := io.ReadAll(p)
	// The deadline ends with the body: past it, Go's server would cancel
	// the call's context while the broker still works on it.
	rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, unreadBody{front.Fail(front.ErrTooLarge, "request body larger than %d bytes", MaxBody)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, unreadBody{front.Fail(front.ErrTimeout, "the request body did not arrive within %s, or arrived slower than %d KiB/s after its first %s",
				s.bodyReadTimeout, MinBodyRate>>10, BodyAllowance)}
		default:
			return nil, unreadBody{front.Fail(front.ErrBadRequest, "read request body: %v", err)}
		}
	}
	return body, nil
}

// paced reads a body whose read deadline moves with what arrived: its start
// plus BodyAllowance plus what arrived at MinBodyRate, within limit.
type paced struct {
	r     io.Reader
	rc    *http.ResponseController
	start time.Time
	limit time.Duration
	n     int64
}

func (p *paced) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if p.n += int64(n); n > 0 {
		p.rc.SetReadDeadline(p.deadline())
	}
	return n, err
}

func (p *paced) deadline() time.Time {
	return p.start.Add(min(p.limit, BodyAllowance+time.Duration(p.n)*time.Second/MinBodyRate))
}
