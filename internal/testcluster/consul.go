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
	// HTTPSAddr is https://host:port of the HTTPS API, when it serves one.
	HTTPSAddr string
	t         testing.TB
	dir       string
	args      []string
	runs      int
}

// StartConsul starts a Consul dev agent (in-memory) and waits for its leader.
func StartConsul(t testing.TB) *Consul {
	t.Helper()
	return startConsul(t, false, nil)
}

// StartTLSConsul is StartConsul serving HTTPS too, with certs.
func StartTLSConsul(t testing.TB, certs *Certs) *Consul {
	t.Helper()
	return startConsul(t, false, certs)
}

// StartDurableConsul starts a single Consul server that keeps its state on
// disk, so that Restart brings back the same KV store: for fault tests.
func StartDurableConsul(t testing.TB) *Consul {
	t.Helper()
	return startConsul(t, true, nil)
}

func startConsul(t testing.TB, durable bool, certs *Certs) *Consul {
	t.Helper()
	dir := t.TempDir()
	p := FreePorts(t, 5)
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
	if certs != nil {
		c.HTTPSAddr = fmt.Sprintf("https://127.0.0.1:%d", p[4])
		c.args = append(c.args, "-hcl", fmt.Sprintf("ports { https = %d }", p[4]), "-hcl", fmt.Sprintf(
			`tls { defaults { ca_file = %q  cert_file = %q  key_file = %q  verify_incoming = false } }`,
			certs.CAFile, certs.CertFile, certs.KeyFile))
	}
	t.Cleanup(func() { // registered first: a start that fails shows its log too
		if c.process != nil {
			dumpOnFailure(t, c.process)
			c.stop()
		}
	})
	c.Start()
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
