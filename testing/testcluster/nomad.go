package testcluster

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// CloudFingerprinters would reach cloud metadata addresses; no agent may.
const CloudFingerprinters = "env_aws,env_gce,env_azure,env_digitalocean"

// NomadOptions describe one Nomad agent.
type NomadOptions struct {
	Name   string
	Server bool     // run a server in this agent (single-server cluster)
	Client bool     // run a client in this agent
	Join   []string // RPC addresses of servers, for client-only agents
	// PluginConfig is the body of `plugin "nomad-device-gpu" { config { ... } }`.
	PluginConfig string
	ConsulAddr   string // empty: a closed loopback port, so nothing is reached
	ExtraHCL     string
	ServerHCL    string // more of the server block
	ClientHCL    string // more of the client block
	TelemetryHCL string // more of the telemetry block
	TLS          *Certs // serve the HTTP API over TLS with these
}

// Nomad is a running Nomad agent.
type Nomad struct {
	*process
	Name    string
	Addr    string // http://127.0.0.1:port
	RPCAddr string
	// SerfAddr is a server's gossip address: another region's servers
	// join it (Agent().Join) to federate.
	SerfAddr string
	DataDir  string
	API      *api.Client
	client   bool
	tls      *Certs
	t        testing.TB
	dir      string
	args     []string // the command line, for Restart
	runs     int
}

var agentTemplate = template.Must(template.New("agent").Parse(`
name                 = "{{.Name}}"
data_dir             = "{{.DataDir}}"
plugin_dir           = "{{.PluginDir}}"
bind_addr            = "127.0.0.1"
disable_update_check = true
log_level            = "INFO" # DEBUG logs every HTTP call: CPU the suite needs elsewhere
ports {
  http = {{.HTTP}}
  rpc  = {{.RPC}}
  serf = {{.Serf}}
}
advertise {
  http = "127.0.0.1:{{.HTTP}}"
  rpc  = "127.0.0.1:{{.RPC}}"
  serf = "127.0.0.1:{{.Serf}}"
}
{{- if .Server}}
server {
  enabled          = true
  bootstrap_expect = 1
{{.ServerHCL}}
}
{{- end}}
client {
  enabled       = {{.Client}}
  cgroup_parent = "/nomad-gpu-test-{{.Name}}-{{.HTTP}}"
  {{- if .Join}}
  servers       = [{{.Join}}]
  {{- end}}
  options {
    "fingerprint.denylist" = "{{.Denylist}}"
    # Tests run raw_exec and mock_driver tasks: no other driver is loaded,
    # so none fingerprints (java -version starts a JVM each time).
    "driver.allowlist"     = "raw_exec,mock_driver"
  }
{{.ClientHCL}}
}
consul {
  address             = "{{.ConsulAddr}}"
  auto_advertise      = {{.HasConsul}}
  server_auto_join    = false
  client_auto_join    = false
}
telemetry {
  collection_interval = "1s"
{{.TelemetryHCL}}
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
plugin "nomad-device-gpu" {
  config {
{{.PluginConfig}}
  }
}
{{- if .TLS}}
tls {
  http                = true
  rpc                 = false
  ca_file             = "{{.TLS.CAFile}}"
  cert_file           = "{{.TLS.CertFile}}"
  key_file            = "{{.TLS.KeyFile}}"
  verify_https_client = false
}
{{- end}}
{{.ExtraHCL}}
`))

// StartNomad starts an agent with the device plugin and waits for its API.
func StartNomad(t testing.TB, o NomadOptions) *Nomad {
	t.Helper()
	n := LaunchNomad(t, o)
	n.waitForAPI(t, "nomad agent "+o.Name)
	return n
}

// waitForAPI waits until the agent answers, and fails the test if it exits.
func (n *Nomad) waitForAPI(t testing.TB, what string) {
	t.Helper()
	WaitFor(t, 90*time.Second, what, func() error {
		if n.Exited() {
			t.Fatalf("nomad agent %s exited:\n%s", n.Name, n.Log())
		}
		_, err := n.API.Agent().Self()
		return err
	})
}

// LaunchNomad starts an agent without waiting for it: for tests of start failures.
func LaunchNomad(t testing.TB, o NomadOptions) *Nomad {
	t.Helper()
	bin := tools.Binary(t, "nomad")
	plugin := PluginBinary(t)
	dir := t.TempDir()
	pluginDir := filepath.Join(dir, "plugins")
	dataDir := filepath.Join(dir, "data")
	for _, d := range []string{pluginDir, dataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(plugin, filepath.Join(pluginDir, "nomad-device-gpu")); err != nil {
		t.Fatal(err)
	}
	ports := FreePorts(t, 4)
	consul := o.ConsulAddr
	if consul == "" {
		consul = fmt.Sprintf("127.0.0.1:%d", ports[3])
	}
	var join []string
	for _, s := range o.Join {
		join = append(join, fmt.Sprintf("%q", s))
	}
	var cfg strings.Builder
	err := agentTemplate.Execute(&cfg, map[string]any{
		"Name": o.Name, "DataDir": dataDir, "PluginDir": pluginDir,
		"HTTP": ports[0], "RPC": ports[1], "Serf": ports[2],
		"Server": o.Server, "Client": o.Client, "Join": strings.Join(join, ", "),
		"Denylist": CloudFingerprinters, "ConsulAddr": consul, "HasConsul": o.ConsulAddr != "",
		"PluginConfig": o.PluginConfig, "ExtraHCL": o.ExtraHCL, "ServerHCL": o.ServerHCL, "ClientHCL": o.ClientHCL, "TelemetryHCL": o.TelemetryHCL, "TLS": o.TLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &Nomad{
		Name: o.Name, Addr: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		RPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), SerfAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]), DataDir: dataDir, client: o.Client, tls: o.TLS,
	}
	if o.TLS != nil {
		n.Addr = "https" + strings.TrimPrefix(n.Addr, "http")
	}
	n.launch(t, bin, dir, cfgPath)
	return n
}

// launch starts `nomad agent -config cfgPath` for n, stopped with the test.
func (n *Nomad) launch(t testing.TB, bin, dir, cfgPath string) {
	t.Helper()
	n.t, n.dir, n.args = t, dir, []string{bin, "agent", "-config", cfgPath}
	n.process = start(t, "nomad-"+n.Name, dir, bin, "agent", "-config", cfgPath)
	t.Cleanup(func() {
		dumpOnFailure(t, n.process)
		n.Stop()
	})
	apiCfg := &api.Config{Address: n.Addr}
	if n.tls != nil {
		apiCfg.TLSConfig = &api.TLSConfig{CACert: n.tls.CAFile}
	}
	var err error
	if n.API, err = api.NewClient(apiCfg); err != nil {
		t.Fatal(err)
	}
}

// StartClientFromConfig starts a Nomad client agent from a configuration file
// written by someone else (a Terraform module, say), whose HTTP API is at addr
// and whose data_dir is dataDir, and waits for its API.
func StartClientFromConfig(t testing.TB, name, cfgPath, addr, dataDir string) *Nomad {
	t.Helper()
	n := &Nomad{Name: name, Addr: addr, DataDir: dataDir, client: true}
	n.launch(t, tools.Binary(t, "nomad"), t.TempDir(), cfgPath)
	n.waitForAPI(t, "nomad agent "+name)
	return n
}

// StartDev starts a single-node cluster (server and client in one agent).
func StartDev(t testing.TB, pluginConfig string) *Nomad {
	t.Helper()
	n := StartNomad(t, NomadOptions{Name: "dev", Server: true, Client: true, PluginConfig: pluginConfig})
	n.WaitForNodes(t, 1)
	return n
}

// Stop ends the agent without leaving anything behind: a client first stops the
// jobs it runs (so Nomad itself stops their tasks and cgroups) and collects its
// allocations (releasing their mounts); whatever task survives is killed.
func (n *Nomad) Stop() {
	if n.client && !n.Exited() {
		n.stopLocalJobs()
		req, _ := http.NewRequest(http.MethodPut, n.Addr+"/v1/client/gc", nil)
		if resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req); err == nil {
			resp.Body.Close()
		}
	}
	n.stop()
	killTasksUnder(n.DataDir)
	unmountUnder(n.DataDir)
}

// stopLocalJobs deregisters the jobs with live allocations on this node and waits
// (a bounded time) for those allocations to end.
func (n *Nomad) stopLocalJobs() {
	self, err := n.API.Agent().Self()
	if err != nil {
		return
	}
	nodeID, _ := self.Stats["client"]["node_id"]
	live := func() []*api.Allocation {
		allocs, _, err := n.API.Nodes().Allocations(nodeID, nil)
		if err != nil {
			return nil
		}
		var out []*api.Allocation
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
				out = append(out, a)
			}
		}
		return out
	}
	for _, a := range live() {
		n.API.Jobs().Deregister(a.JobID, true, &api.WriteOptions{Namespace: a.Namespace})
	}
	for deadline := time.Now().Add(15 * time.Second); len(live()) > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitForNodes waits until count nodes are ready and have fingerprinted devices.
func (n *Nomad) WaitForNodes(t testing.TB, count int) []*api.Node {
	t.Helper()
	var nodes []*api.Node
	WaitFor(t, 90*time.Second, fmt.Sprintf("%d ready nodes with devices", count), func() error {
		stubs, _, err := n.API.Nodes().List(nil)
		if err != nil {
			return err
		}
		nodes = nodes[:0]
		for _, s := range stubs {
			if s.Status != api.NodeStatusReady {
				continue
			}
			node, _, err := n.API.Nodes().Info(s.ID, nil)
			if err != nil {
				return err
			}
			if node.NodeResources == nil || len(node.NodeResources.Devices) == 0 {
				return fmt.Errorf("node %s has no devices yet", s.Name)
			}
			nodes = append(nodes, node)
		}
		if len(nodes) != count {
			return fmt.Errorf("%d of %d nodes ready", len(nodes), count)
		}
		return nil
	})
	return nodes
}

// PluginPIDs are the processes of the device plugin this agent launched.
func (n *Nomad) PluginPIDs() []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		stat, err := os.ReadFile(filepath.Join(p, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ")".
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if len(fields) > 1 && fields[1] == strconv.Itoa(n.cmd.Process.Pid) && strings.Contains(string(cmdline), "nomad-device-gpu") {
			pid, _ := strconv.Atoi(filepath.Base(p))
			pids = append(pids, pid)
		}
	}
	return pids
}

// Restart stops the agent (its tasks keep running, as they do on a real
// restart) and starts it again with the same configuration and data.
func (n *Nomad) Restart() {
	n.t.Helper()
	n.Down()
	n.Up()
}

// Down stops the agent, as a site lost would be (see Restart); Up starts
// it again.
func (n *Nomad) Down() { n.stop() }

// Up starts the agent again after Down, with the same configuration and
// data, and waits for its API.
func (n *Nomad) Up() {
	n.t.Helper()
	n.runs++
	n.process = start(n.t, fmt.Sprintf("nomad-%s-%d", n.Name, n.runs), n.dir, n.args[0], n.args[1:]...)
	n.waitForAPI(n.t, "nomad agent "+n.Name+" back")
}
