package testcluster

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Consul is a Consul agent on loopback.
type Consul struct {
	*process
	Addr string // host:port of the HTTP API
	t    testing.TB
	dir  string
	args []string
	runs int
}

// StartConsul starts a Consul dev agent (in-memory) and waits for its leader.
func StartConsul(t testing.TB) *Consul {
	t.Helper()
	return startConsul(t, false)
}

// StartDurableConsul starts a single Consul server that keeps its state on
// disk, so that Restart brings back the same KV store: for fault tests.
func StartDurableConsul(t testing.TB) *Consul {
	t.Helper()
	return startConsul(t, true)
}

func startConsul(t testing.TB, durable bool) *Consul {
	t.Helper()
	dir := t.TempDir()
	p := FreePorts(t, 4)
	c := &Consul{Addr: fmt.Sprintf("127.0.0.1:%d", p[0]), t: t, dir: dir}
	mode := []string{"-dev"}
	if durable {
		mode = []string{"-server", "-bootstrap-expect", "1", "-data-dir", filepath.Join(dir, "data"), "-node", "consul-test"}
	}
	c.args = append(append([]string{"agent"}, mode...),
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(p[0]), "-server-port", strconv.Itoa(p[1]),
		"-serf-lan-port", strconv.Itoa(p[2]), "-serf-wan-port", strconv.Itoa(p[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-hcl", "disable_update_check = true")
	c.Start()
	t.Cleanup(func() {
		dumpOnFailure(t, c.process)
		c.stop()
	})
	return c
}

// Start (re)starts the agent and waits for its leader.
func (c *Consul) Start() {
	c.t.Helper()
	c.runs++
	c.process = start(c.t, fmt.Sprintf("consul-%d", c.runs), c.dir, Binary(c.t, "consul"), c.args...)
	WaitFor(c.t, 60*time.Second, "consul leader", func() error {
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
}

// Stop ends the agent; Start brings it back.
func (c *Consul) Stop() { c.stop() }
