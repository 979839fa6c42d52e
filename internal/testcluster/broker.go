package testcluster

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Broker is a running gpu-broker.
type Broker struct {
	*process
	Addr   string // http://127.0.0.1:port
	dir    string
	bin    string
	config string
	t      testing.TB
}

// StartBroker runs gpu-broker (race-detector build) in front of nomad with its
// queue in consul and its policies in policyDir.
func StartBroker(t testing.TB, nomad *Nomad, consul *Consul, policyDir string) *Broker {
	t.Helper()
	return startBroker(t, BrokerBinary(t), nomad, consul, policyDir)
}

// StartReleaseBroker is StartBroker with the released build, for benchmarks.
func StartReleaseBroker(t testing.TB, nomad *Nomad, consul *Consul, policyDir string) *Broker {
	t.Helper()
	return startBroker(t, BrokerReleaseBinary(t), nomad, consul, policyDir)
}

func startBroker(t testing.TB, bin string, nomad *Nomad, consul *Consul, policyDir string) *Broker {
	t.Helper()
	dir := t.TempDir()
	port := FreePorts(t, 1)[0]
	b := &Broker{Addr: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, t: t, bin: bin,
		config: filepath.Join(dir, "broker.hcl")}
	cfg := fmt.Sprintf(`listen     = "127.0.0.1:%d"
policy_dir = %q
nomad  { address = %q }
consul { address = %q }
`, port, policyDir, nomad.Addr, consul.Addr)
	if err := os.WriteFile(b.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	b.Start()
	t.Cleanup(func() {
		dumpOnFailure(t, b.process)
		b.stop()
	})
	return b
}

// Start (re)starts the broker process and waits for its API.
func (b *Broker) Start() {
	b.t.Helper()
	b.process = start(b.t, "gpu-broker", b.dir, b.bin, "serve", "-config", b.config, "-log-level", "debug")
	WaitFor(b.t, 30*time.Second, "gpu-broker", func() error {
		select {
		case <-b.exited:
			b.t.Fatalf("gpu-broker exited:\n%s", b.Log())
		default:
		}
		resp, err := http.Get(b.Addr + "/v1/gpu/usage")
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

// Kill ends the broker at once, as a crash would.
func (b *Broker) Kill() {
	syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.exited
}
