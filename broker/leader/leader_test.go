package leader

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Only a refused connection counts toward ending a leader's session: one
// that is answered, or an address that cannot be read, starts the count
// again.
func TestOnlyARefusedConnectionCounts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listening := "http://" + l.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + closed.Addr().String()
	closed.Close()
	defer l.Close()
	ctx := context.Background()
	for _, c := range []struct {
		address string
		want    int
	}{
		{gone, 3},
		{listening, 0},
		{"::not a url", 0},
		{"", 0},
	} {
		if got := refusals(ctx, c.address, 2); got != c.want {
			t.Errorf("refusals(%q, 2) = %d, want %d", c.address, got, c.want)
		}
	}
}

// A leader is dead once its address refused deadRefusals connections in a
// row, but not while this broker's own address refuses them too: then the
// advertised addresses are wrong, and ending sessions would pass the lock
// round the brokers. That is logged once.
func TestALeaderIsDeadOnlyWhileThisBrokersAddressAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + closed.Addr().String()
	closed.Close()
	ctx := context.Background()

	var logged strings.Builder
	e := &Elector{Address: "http://" + l.Addr().String(), Log: hclog.New(&hclog.LoggerOptions{Output: &logged}), Clock: clock.Real}
	warned, n, dead := false, 0, false
	for i := 1; i <= deadRefusals; i++ {
		if n, dead = e.leaderDead(ctx, gone, n, &warned); dead != (i == deadRefusals) {
			t.Fatalf("after %d refusals: dead %v", i, dead)
		}
	}
	if n != 0 {
		t.Errorf("the count after a verdict is %d, want 0", n)
	}

	e.Address = gone
	for i := 0; i < 2*deadRefusals; i++ {
		if n, dead = e.leaderDead(ctx, gone, n, &warned); dead {
			t.Fatalf("dead after %d refusals while this broker's own address refuses too", i+1)
		}
	}
	if got := strings.Count(logged.String(), "advertise address refuses connections"); got != 1 {
		t.Errorf("logged %d times, want once:\n%s", got, logged.String())
	}
}

// A session counts as ended only when a consistent read of the key shows
// it no longer holds it: a Consul server just elected answers a destroy
// with success before it has replayed the session into its state, doing
// nothing. The stand-in answers as such a server does, then as one caught up.
func TestASessionEndsOnlyOnceItNoLongerHoldsTheKey(t *testing.T) {
	var destroys, reads atomic.Int32
	caughtUp := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/session/destroy/s1"):
			destroys.Add(1)
			_, _ = w.Write([]byte("true"))
		case r.URL.Path == "/v1/kv/leader" && r.Method == http.MethodGet:
			reads.Add(1)
			if _, ok := r.URL.Query()["consistent"]; !ok {
				t.Errorf("the key is read back without ?consistent: %s", r.URL)
			}
			holder := "s1"
			if caughtUp.Load() {
				holder = ""
			}
			_ = json.NewEncoder(w).Encode([]map[string]any{{"Key": "leader", "Session": holder}})
		case r.URL.Path == "/v1/kv/leader": // the release
			_, _ = w.Write([]byte("false"))
		default:
			t.Errorf("unexpected request %s %s", r.Method, r.URL)
		}
	}))
	defer srv.Close()
	client, err := consul.NewClient(&consul.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	e := &Elector{Client: client, Key: "leader", Address: "http://127.0.0.1:1", Log: hclog.NewNullLogger(), Clock: clock.Real}
	ctx := context.Background()

	if err := e.endSession(ctx, "s1"); err == nil || !strings.Contains(err.Error(), "still holds the leader key") {
		t.Errorf("a destroy that left the key held counts as the session's end: %v", err)
	}
	caughtUp.Store(true)
	if err := e.endSession(ctx, "s1"); err != nil {
		t.Errorf("the session's end once the key is free: %v", err)
	}
	if destroys.Load() != 2 || reads.Load() != 2 {
		t.Errorf("%d destroys and %d reads back, want 2 of each", destroys.Load(), reads.Load())
	}
}
