package testcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/agent"
	"github.com/nomad-gpu/nomad-gpu/broker/config"
)

// Broker is a running gpu-broker: in the test's own process (broker/agent),
// or, with BrokerOptions.Process, a process of its own that a test can kill.
type Broker struct {
	*process        // nil in-process
	Addr     string // http://127.0.0.1:port
	dir      string
	bin      string
	config   string
	token    string
	// Client reaches the broker (TLS as it serves it).
	Client *http.Client
	t      testing.TB

	// In-process: its log, how to end it, and its end.
	logPath string
	cancel  context.CancelFunc
	done    chan error
	hup     chan os.Signal // SIGHUP, as cmd/gpu-broker passes it on
}

// BrokerOptions are what StartBrokerWith adds to a broker's configuration.
type BrokerOptions struct {
	Token string // the broker's own Nomad token (nomad.token), also used to probe it
	// TokenFile gives Token in a file (nomad.token_file), which ReplaceToken
	// rewrites.
	TokenFile bool
	Config    string // more broker.hcl
	// TLS serves the broker's listener with this certificate, trusted through its CA.
	TLS *Certs
	// ConsulTLS: the broker reaches Consul at its HTTPS address, trusting this CA.
	ConsulTLS *Certs
	// Process runs the race-detector build of gpu-broker as a process of its
	// own, for tests that kill it (SIGKILL) or measure it; otherwise the
	// broker runs in the test's process, through broker/agent.
	Process bool
	// NomadAddress is where the broker reaches Nomad ("": the agent's own
	// address), for a proxy in front of it that injects faults.
	NomadAddress string
}

// StartBroker runs a broker in the test's process in front of nomad, with its
// queue in consul and its policies in policyDir.
func StartBroker(t testing.TB, nomad *Nomad, consul *Consul, policyDir string) *Broker {
	t.Helper()
	return StartBrokerWith(t, nomad, consul, policyDir, BrokerOptions{})
}

// StartBrokerWith is StartBroker with options.
func StartBrokerWith(t testing.TB, nomad *Nomad, consul *Consul, policyDir string, o BrokerOptions) *Broker {
	t.Helper()
	bin := ""
	if o.Process {
		bin = BrokerBinary(t)
	}
	return startBroker(t, bin, nomad, consul, policyDir, o)
}

// StartReleaseBrokerWith is StartBrokerWith with the released build, for benchmarks.
func StartReleaseBrokerWith(t testing.TB, nomad *Nomad, consul *Consul, policyDir string, o BrokerOptions) *Broker {
	t.Helper()
	return startBroker(t, BrokerReleaseBinary(t), nomad, consul, policyDir, o)
}

func startBroker(t testing.TB, bin string, nomad *Nomad, consul *Consul, policyDir string, o BrokerOptions) *Broker {
	t.Helper()
	dir := t.TempDir()
	port := FreePorts(t, 1)[0]
	b := &Broker{Addr: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, t: t, bin: bin,
		config: filepath.Join(dir, "broker.hcl"), token: o.Token, Client: &http.Client{Timeout: 30 * time.Second}}
	consulAddr, consulTLS, nomadTLS, nomadAddr := consul.Addr, "", "", nomad.Addr
	if o.NomadAddress != "" {
		nomadAddr = o.NomadAddress
	}
	if o.ConsulTLS != nil {
		consulAddr, consulTLS = consul.HTTPSAddr, fmt.Sprintf("tls { ca_file = %q }", o.ConsulTLS.CAFile)
	}
	if nomad.tls != nil {
		nomadTLS = fmt.Sprintf("tls { ca_file = %q }", nomad.tls.CAFile)
	}
	token := fmt.Sprintf("token = %q", o.Token)
	if o.TokenFile {
		if err := os.WriteFile(b.tokenFile(), []byte(o.Token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		token = fmt.Sprintf("token_file = %q", b.tokenFile())
	}
	cfg := fmt.Sprintf(`listen     = "127.0.0.1:%d"
policy_dir = %q
nomad  {
  address = %q
  %s
  %s
}
consul {
  address = %q
  %s
}
audit {
  path = %q
}
%s
`, port, policyDir, nomadAddr, token, nomadTLS, consulAddr, consulTLS, filepath.Join(dir, "audit.log"), o.Config)
	if o.TLS != nil {
		b.Addr = fmt.Sprintf("https://127.0.0.1:%d", port)
		b.Client = o.TLS.Client()
		cfg += fmt.Sprintf("tls {\n  ca_file = %q\n  cert_file = %q\n  key_file = %q\n}\n", o.TLS.CAFile, o.TLS.CertFile, o.TLS.KeyFile)
	}
	if err := os.WriteFile(b.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // registered first: a start that fails shows its log too
		if b.process == nil {
			if t.Failed() {
				t.Logf("last lines of gpu-broker:\n%s", lastLines(b.Log(), 80))
			}
			b.Stop()
			return
		}
		dumpOnFailure(t, b.process)
		b.stop()
	})
	b.Start()
	return b
}

// Start (re)starts the broker and waits for its API.
func (b *Broker) Start() {
	b.t.Helper()
	var exited <-chan struct{}
	if b.bin != "" {
		b.process = start(b.t, "gpu-broker", b.dir, b.bin, "serve", "-config", b.config, "-log-level", "debug")
		exited = b.exited
	} else {
		exited = b.startInProcess()
	}
	WaitFor(b.t, 30*time.Second, "gpu-broker", func() error {
		select {
		case <-exited:
			b.t.Fatalf("gpu-broker exited:\n%s", b.Log())
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, b.Addr+"/v1/gpu/usage", nil)
		if b.token != "" {
			req.Header.Set("X-Nomad-Token", b.token)
		}
		resp, err := b.Client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("usage answered %s", resp.Status)
		}
		return nil
	})
}

// startInProcess runs the broker through broker/agent, its log in its
// directory, and returns a channel closed when it ends.
func (b *Broker) startInProcess() <-chan struct{} {
	cfg, err := config.Load(b.config)
	if err != nil {
		b.t.Fatal(err)
	}
	b.logPath = filepath.Join(b.dir, "gpu-broker.log")
	f, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "gpu-broker", Level: hclog.Debug, Output: f})
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel, b.done, b.hup = cancel, make(chan error, 1), make(chan os.Signal, 1)
	exited := make(chan struct{})
	go func() {
		err := agent.New(cfg, log, b.hup).Run(ctx)
		log.Info("broker stopped", "error", err)
		f.Close()
		b.done <- err
		close(exited)
	}()
	return exited
}

// Stop ends an in-process broker as SIGTERM would: its leadership, if any,
// is given up at once.
func (b *Broker) Stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	<-b.done
	b.cancel = nil
}

func (b *Broker) tokenFile() string { return filepath.Join(b.dir, "nomad-token") }

// ReplaceToken writes token to the broker's token file (BrokerOptions.TokenFile)
// and sends it SIGHUP, as an operator replacing a revoked token would.
func (b *Broker) ReplaceToken(token string) {
	b.t.Helper()
	if err := os.WriteFile(b.tokenFile(), []byte(token+"\n"), 0o600); err != nil {
		b.t.Fatal(err)
	}
	b.token = token
	if b.process != nil {
		b.cmd.Process.Signal(syscall.SIGHUP)
		return
	}
	b.hup <- syscall.SIGHUP
}

// Log is what the broker logged.
func (b *Broker) Log() string {
	if b.process != nil {
		return b.process.Log()
	}
	out, _ := os.ReadFile(b.logPath)
	return string(out)
}

// Kill ends a broker process at once, as a crash would.
func (b *Broker) Kill() {
	if b.process == nil {
		b.t.Fatal("an in-process broker cannot be killed: start it with BrokerOptions{Process: true}")
	}
	b.process.Kill()
}

// RSS is the agent process's resident memory in bytes (0 when unknown).
func (p *process) RSS() int64 { return p.status("VmRSS:") }

// AnonRSS is RSS less the pages of files it maps (its binary, a Consul
// server's raft log), which the kernel may drop and read again: the memory
// the process itself holds.
func (p *process) AnonRSS() int64 { return p.status("RssAnon:") }

// status is a size in bytes from the process's /proc status (0 when unknown).
func (p *process) status(field string) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// FDs is how many files (connections included) the broker's process has
// open (0 in-process).
func (b *Broker) FDs() int {
	if b.process == nil {
		return 0
	}
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", b.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	return len(entries)
}

// AuditPath is the broker's audit trail.
func (b *Broker) AuditPath() string { return filepath.Join(b.dir, "audit.log") }

// BareHop is testing/barehop, a bare reverse proxy, running.
type BareHop struct {
	*process
	Addr string // http://127.0.0.1:port
}

// StartBareHop runs testing/barehop in front of nomad in a process of its
// own, as the broker is.
func StartBareHop(t testing.TB, nomad *Nomad) *BareHop {
	t.Helper()
	bin := buildOnce(t, "github.com/nomad-gpu/nomad-gpu/testing/barehop", "barehop", false)
	addr := fmt.Sprintf("127.0.0.1:%d", FreePorts(t, 1)[0])
	p := start(t, "barehop", t.TempDir(), bin, "-listen", addr, "-target", nomad.Addr)
	t.Cleanup(p.stop)
	WaitFor(t, 30*time.Second, "the bare hop", func() error {
		resp, err := http.Get("http://" + addr + "/v1/agent/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	return &BareHop{process: p, Addr: "http://" + addr}
}

// CPUTime is the CPU time (user and system) the agent's process has used (its
// children's not counted). Linux counts it in clock ticks of 10 ms.
func (p *process) CPUTime() time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: utime and stime are the 12th and 13th fields after ")".
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Scrape reads the broker's /metrics: each series, as Prometheus's text
// format prints it (name{label="value",…}, labels sorted), to its value.
func (b *Broker) Scrape() map[string]float64 {
	b.t.Helper()
	return Scrape(b.t, b.Client, b.Addr+"/metrics")
}

// Scrape reads metrics in Prometheus's text format from url.
func Scrape(t testing.TB, client *http.Client, url string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v\n%s", url, resp.StatusCode, err, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape %s: %q: %v", url, line, err)
		}
		out[line[:i]] = v
	}
	return out
}
