package leader

import (
	"context"
	"net"
	"testing"
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
