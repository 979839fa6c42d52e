package leader

import (
	"context"
	"net"
	"strings"
	"testing"

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
