package testcluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/testing/tools"
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
	c.args = agentArgs(mode, p)
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

// agentArgs is a Consul agent's command line in mode on loopback, its HTTP,
// server, serf LAN and serf WAN ports the first four of ports.
func agentArgs(mode []string, ports []int) []string {
	return append(append([]string{"agent"}, mode...),
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(ports[0]), "-server-port", strconv.Itoa(ports[1]),
		"-serf-lan-port", strconv.Itoa(ports[2]), "-serf-wan-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-hcl", "disable_update_check = true")
}

// Start (re)starts the agent and waits for its leader.
func (c *Consul) Start() {
	c.t.Helper()
	c.runs++
	c.process = start(c.t, fmt.Sprintf("consul-%d", c.runs), c.dir, tools.Binary(c.t, "consul"), c.args...)
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

// ConsulCluster is servers Consul servers that keep their state on disk, and
// a client agent joined to them, where the broker talks to Consul as in
// production (a server killed is not the broker's own agent).
type ConsulCluster struct {
	Client  *Consul
	Servers []*Consul
}

// StartConsulCluster starts servers Consul servers (raft_multiplier 1, as
// Consul recommends for production) and a client agent, and waits for a
// leader.
func StartConsulCluster(t testing.TB, servers int) *ConsulCluster {
	t.Helper()
	c := &ConsulCluster{}
	p := FreePorts(t, 4*(servers+1))
	var join []string
	for i := range servers + 1 {
		join = append(join, "-retry-join", fmt.Sprintf("127.0.0.1:%d", p[4*i+2]))
	}
	for i := range servers + 1 {
		dir := t.TempDir()
		a := &Consul{Addr: fmt.Sprintf("127.0.0.1:%d", p[4*i]), t: t, dir: dir}
		mode := []string{"-server", "-bootstrap-expect", strconv.Itoa(servers), "-node", fmt.Sprintf("consul-server-%d", i)}
		if i == servers {
			mode = []string{"-node", "consul-client"}
		}
		a.args = append(agentArgs(append(mode, "-data-dir", filepath.Join(dir, "data")), p[4*i:]),
			"-hcl", "performance { raft_multiplier = 1 }")
		a.args = append(a.args, join...)
		t.Cleanup(func() {
			if a.process != nil {
				dumpOnFailure(t, a.process)
				a.stop()
			}
		})
		// Started together: no server elects a leader before the others are up.
		a.runs++
		a.process = start(t, fmt.Sprintf("consul-%d", a.runs), dir, tools.Binary(t, "consul"), a.args...)
		if i == servers {
			c.Client = a
		} else {
			c.Servers = append(c.Servers, a)
		}
	}
	c.Leader()
	return c
}

// Leader waits until the servers have a leader, seen through the client
// agent, and returns it.
func (c *ConsulCluster) Leader() *Consul {
	c.Client.t.Helper()
	var leader *Consul
	WaitFor(c.Client.t, 60*time.Second, "a consul leader", func() error {
		resp, err := http.Get("http://" + c.Client.Addr + "/v1/status/leader")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var addr string
		if err := json.NewDecoder(resp.Body).Decode(&addr); err != nil || addr == "" {
			return fmt.Errorf("no leader yet (%v)", err)
		}
		for _, s := range c.Servers {
			if strings.HasSuffix(addr, ":"+s.args[slices.Index(s.args, "-server-port")+1]) && !s.Exited() {
				leader = s
				return nil
			}
		}
		return fmt.Errorf("leader %s is not a running server", addr)
	})
	return leader
}
