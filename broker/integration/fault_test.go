package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/testcluster"
)

const faultPolicy = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "search" {
  namespaces = ["search"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
borrowing {
  enabled = false
}
`

// TestConsulOutage: with Consul down, GPU admissions fail closed with a clear
// 503 while everything else passes through; when Consul is back (with its
// data), the queue resumes, and nothing was lost or done twice.
func TestConsulOutage(t *testing.T) {
	consul := testcluster.StartDurableConsul(t)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "fault", Server: true, Client: true, PluginConfig: `
    backend = "fake"
    fake {
      count     = 4
      id_prefix = "fault"
    }`})
	n.WaitForNodes(t, 1)
	for _, ns := range []string{"vision", "search"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, nomad: n, dir: t.TempDir(), policyDir: t.TempDir()}
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), faultPolicy)
	e.broker = testcluster.StartBroker(t, n, consul, e.policyDir)
	testcluster.WaitFor(t, 60*time.Second, "a leader with a view of 4 GPUs", func() error {
		out, _ := e.run("search", "probe", 1, 5, "", false)
		if !strings.Contains(out, "no node has more than 4") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
	if out, err := e.run("vision", "first", 1, 2, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	queued := e.queued("waits", 2, true)

	consul.Stop()
	var refused string
	for i := 0; refused == ""; i++ {
		if i == 30 {
			t.Fatalf("GPU admissions still answered 30 s after Consul stopped")
		}
		out, err := e.run("search", fmt.Sprintf("during-%d", i), 1, 1, "", true)
		switch {
		case err != nil && strings.Contains(out, "503"):
			refused = out
		case err == nil && strings.Contains(out, "admitted"):
			// Still leader until the broker notices; then it fails closed.
			time.Sleep(time.Second)
		default:
			t.Fatalf("attempt %d: %v\n%s", i, err, out)
		}
	}
	if !strings.Contains(refused, "GPU jobs are admitted by the broker leader, and there is none") {
		t.Errorf("the 503 does not say why:\n%s", refused)
	}
	if out, err := e.run("search", "during-again", 1, 1, "", true); err == nil || !strings.Contains(out, "503") {
		t.Errorf("a GPU admission went through with Consul down: %v\n%s", err, out)
	}
	if out, err := e.run("default", "cpu-during", 1, 0, "", true); err != nil || strings.Contains(out, "nomad-gpu") {
		t.Errorf("a non-GPU job did not pass through with Consul down: %v\n%s", err, out)
	}
	if out, err := e.nomadCLI("job", "stop", "-namespace", "vision", "-detach", "first"); err != nil {
		t.Errorf("stop did not pass through with Consul down: %v\n%s", err, out)
	}

	consul.Start()
	e.waitAdmitted(t, "vision", "waits", 90*time.Second)
	if out := e.brokerCLI("queue", "list"); strings.Contains(out, queued) {
		t.Errorf("admitted, still queued:\n%s", out)
	}
	if out, err := e.run("search", "after", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Errorf("GPU admissions did not come back with Consul: %v\n%s", err, out)
	}
	for _, u := range e.usage() {
		if u.Used > u.Limit {
			t.Errorf("tenant %s uses %d GPUs, its limit is %d", u.Tenant, u.Used, u.Limit)
		}
	}
	if _, _, err := n.API.Jobs().Info("during-again", &api.QueryOptions{Namespace: "search"}); err == nil {
		t.Errorf("Nomad has a job the broker refused")
	}
}
