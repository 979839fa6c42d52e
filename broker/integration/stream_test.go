package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// TestTheEventStreamIsClosedAtEveryResync: following a real Nomad through
// 20 resyncs leaves the connections and goroutines of one stream, not 20.
// A stream that falls silent (a half-open connection: a proxy that stops
// passing bytes) is taken for broken after StreamIdle, not at the next
// resync.
func TestTheEventStreamIsClosedAtEveryResync(t *testing.T) {
	t.Parallel()
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "stream", Server: true})
	p := startFreezingProxy(t, n.Addr)
	c, err := nomadapi.New(p.addr, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.StreamIdle = 2 * time.Second
	var open atomic.Int64
	tr := c.HTTPClient().Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countedConn{Conn: conn, open: &open}, nil
	}

	view := cluster.NewView(nil)
	resync := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The label is inherited by every goroutine the follow starts, so the
	// count below is of this test's streams, not of the other tests' brokers
	// sharing the process.
	go pprof.Do(ctx, pprof.Labels("stream-test", t.Name()), func(ctx context.Context) {
		view.Follow(ctx, c, hclog.NewNullLogger(), resync)
		close(done)
	})
	defer func() { cancel(); <-done }()
	listings := func() uint64 { _, l := view.Followed(); return l }
	testcluster.WaitFor(t, 30*time.Second, "the first listing", func() error {
		if listings() < 1 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) // the first stream open
	// The stream's answer told Nomad's time (the usage ledger's clock): this
	// machine's, here, to the second.
	if at, ok := c.NomadNow(); !ok || time.Until(at).Abs() > 2*time.Second {
		t.Errorf("Nomad's time %s (%v), this machine's %s", at, ok, time.Now())
	}
	conns, streams := open.Load(), streamReaders(t.Name())
	if streams == 0 {
		t.Fatal("no goroutine of this test reads an event stream: the leak check below would prove nothing")
	}
	for i := 0; i < 20; i++ {
		resync <- time.Now()
		want := uint64(i + 2)
		testcluster.WaitFor(t, 10*time.Second, "a listing", func() error {
			if l := listings(); l < want {
				return fmt.Errorf("%d listings", l)
			}
			return nil
		})
	}
	// A closed stream's goroutine and connection go once the transport has
	// seen the cancel, which a loaded machine may take a while to run; a leak
	// stays (20 resyncs leave 20 more).
	testcluster.WaitFor(t, 15*time.Second, "the closed streams to go", func() error {
		if got := open.Load(); got > conns+1 {
			return fmt.Errorf("open connections to Nomad: %d after the first listing, %d after 20 resyncs", conns, got)
		}
		if got := streamReaders(t.Name()); got > streams {
			return fmt.Errorf("goroutines reading an event stream: %d after the first listing, %d after 20 resyncs", streams, got)
		}
		return nil
	})

	// Half-open: nothing more arrives on the stream. Within StreamIdle (and
	// the backoff of 1 s) the view lists again over a new connection.
	before := listings()
	p.freeze()
	start := time.Now()
	testcluster.WaitFor(t, 15*time.Second, "a listing after the stream fell silent", func() error {
		if listings() <= before {
			return fmt.Errorf("still %d listings", listings())
		}
		return nil
	})
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("a silent stream was taken for broken after %s; StreamIdle is 2s", took)
	}
}

// streamReaders counts the goroutines labelled with test that read a
// Nomad event stream. Other tests share the process, and their brokers
// follow Nomad too: counting theirs made this test fail when one started
// its stream during the 20 resyncs.
func streamReaders(test string) int {
	var b strings.Builder
	// debug=1 groups identical stacks as "N @ ..." and prints their labels.
	pprof.Lookup("goroutine").WriteTo(&b, 1)
	label := fmt.Sprintf("%q:%q", "stream-test", test)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if !strings.Contains(g, "nomadapi.(*Client).Events.func") || !strings.Contains(g, label) {
			continue
		}
		var count int
		if _, err := fmt.Sscanf(g, "%d @", &count); err == nil {
			n += count
		}
	}
	return n
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// freezingProxy forwards TCP to a Nomad agent. Once frozen, the event
// streams it carries pass nothing more (as over a half-open connection);
// every other connection, and new ones, are forwarded.
type freezingProxy struct {
	addr    string
	mu      sync.Mutex
	streams []chan struct{}
}

func startFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &freezingProxy{addr: "http://" + ln.Addr().String()}
	host := strings.TrimPrefix(target, "http://")
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", host)
			if err != nil {
				in.Close()
				continue
			}
			stop := make(chan struct{})
			go p.pipe(out, in, stop, true)
			go p.pipe(in, out, stop, false)
		}
	}()
	return p
}

// freeze stops the event streams open now from passing anything more.
func (p *freezingProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, stop := range p.streams {
		close(stop)
	}
	p.streams = nil
}

// pipe copies from src to dst, dropping what arrives once stop is closed
// (neither side is told); requests tells the client's side, whose first
// bytes say whether it is an event stream. It closes both when either ends.
func (p *freezingProxy) pipe(dst, src net.Conn, stop chan struct{}, requests bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	first := requests
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if first && strings.Contains(string(buf[:n]), "/v1/event/stream") {
			p.mu.Lock()
			p.streams = append(p.streams, stop)
			p.mu.Unlock()
		}
		first = false
		select {
		case <-stop:
			continue
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
