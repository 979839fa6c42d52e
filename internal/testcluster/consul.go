package testcluster

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// Consul is a Consul dev agent on loopback.
type Consul struct {
	*process
	Addr string // host:port of the HTTP API
}

// StartConsul starts a Consul dev agent (in-memory) and waits for its leader.
func StartConsul(t testing.TB) *Consul {
	t.Helper()
	bin := Binary(t, "consul")
	dir := t.TempDir()
	p := FreePorts(t, 4)
	c := &Consul{Addr: fmt.Sprintf("127.0.0.1:%d", p[0])}
	c.process = start(t, "consul", dir, bin, "agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(p[0]), "-server-port", strconv.Itoa(p[1]),
		"-serf-lan-port", strconv.Itoa(p[2]), "-serf-wan-port", strconv.Itoa(p[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-hcl", "disable_update_check = true")
	t.Cleanup(func() {
		dumpOnFailure(t, c.process)
		c.stop()
	})
	WaitFor(t, 60*time.Second, "consul leader", func() error {
		resp, err := http.Get("http://" + c.Addr + "/v1/status/leader")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var buf [64]byte
		n, _ := resp.Body.Read(buf[:])
		if resp.StatusCode != 200 || n <= 2 {
			return fmt.Errorf("no leader yet (%d %q)", resp.StatusCode, buf[:n])
		}
		return nil
	})
	return c
}
