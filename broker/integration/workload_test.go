package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/testcluster"
)

// TestAGangWaitsUntilAllItsAllocationsFit: 2 nodes × 8 GPUs with 5 free on
// each; a training job of 2 × 6 GPUs is queued, not half-placed, and runs
// whole once GPUs free.
func TestAGangWaitsUntilAllItsAllocationsFit(t *testing.T) {
	consul := testcluster.StartConsul(t)
	plugin := func(prefix string) string {
		return fmt.Sprintf(`
    backend = "fake"
    fake {
      count     = 8
      id_prefix = %q
    }`, prefix)
	}
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "gang-1", Server: true, Client: true, PluginConfig: plugin("g1")})
	testcluster.StartNomad(t, testcluster.NomadOptions{Name: "gang-2", Client: true, Join: []string{n.RPCAddr}, PluginConfig: plugin("g2")})
	n.WaitForNodes(t, 2)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		t.Fatal(err)
	}
	e := brokerEnv(t, n, consul, `
queue "training" { priority = 60 }
queue "batch" { priority = 50 }
workload "training" {
  gang = true
}
workload "batch" {}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "batch"]
  guaranteed = 24 # quota is no obstacle here: the nodes are
  limit      = 24
}
`, "vision", 8, testcluster.BrokerOptions{})
	register := func(j *jobBuilder) string {
		req, _ := http.NewRequest(http.MethodPut, e.broker.Addr+"/v1/jobs", strings.NewReader(j.body(nil, canonical)))
		resp, err := e.broker.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out api.JobRegisterResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("register %s: %d %v", *j.j.ID, resp.StatusCode, err)
		}
		return out.Warnings
	}
	// 3 GPUs taken on each node.
	filler := job("vision", "filler", api.JobTypeService).group("g", ptr(2), nil, task(dev("nvidia/gpu", 3)))
	filler.j.Meta = map[string]string{"nomad-gpu.queue": "batch"}
	filler.j.Constraints = []*api.Constraint{{Operand: "distinct_hosts", RTarget: "true"}}
	if w := register(filler); !strings.Contains(w, "admitted") {
		t.Fatalf("filler: %s", w)
	}
	waitAllocsRunning(t, n, "vision", "filler", 2)
	gang := job("vision", "gang", api.JobTypeBatch).group("workers", ptr(2), nil, task(dev("nvidia/gpu", 6)))
	w := register(gang)
	if !strings.Contains(w, "queued as") || !strings.Contains(w, `workload "training" is a gang`) || !strings.Contains(w, "free per node: [5 5]") {
		t.Fatalf("gang of 2 × 6 on 5 + 5 free GPUs:\n%s", w)
	}
	if _, _, err := n.API.Jobs().Info("gang", &api.QueryOptions{Namespace: "vision"}); err == nil {
		t.Fatal("the gang reached Nomad while it cannot be placed whole")
	}
	e.stop("vision", "filler")
	waitAllocsRunning(t, n, "vision", "gang", 2)
	// The jobspecs in git, checked as HCL through this Nomad's parser.
	specs, _ := filepath.Glob("../../jobspecs/*.nomad.hcl")
	out, err := exec.Command(testcluster.BrokerBinary(t), append([]string{"job", "check", "-policy", "../../policies",
		"-max-gpus-per-node", "8", "-address", n.Addr}, specs...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "training.nomad.hcl: warning: the broker writes into it") {
		t.Errorf("gpu-broker job check -address of jobspecs/: %v\n%s", err, out)
	}
}

// TestTheJobspecsRunThroughTheBroker: every jobspec in jobspecs/ validates,
// is admitted by the broker under the example policies, and reaches its
// state on a cluster like the demo's (2 nodes × 8 GPUs); a dispatch of the
// parameterized batch job is admitted on its own and completes.
func TestTheJobspecsRunThroughTheBroker(t *testing.T) {
	consul := testcluster.StartConsul(t)
	plugin := func(prefix string) string {
		return fmt.Sprintf("\n    backend = \"fake\"\n    fake {\n      count     = 8\n      id_prefix = %q\n    }", prefix)
	}
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "specs-1", Server: true, Client: true, PluginConfig: plugin("s1")})
	testcluster.StartNomad(t, testcluster.NomadOptions{Name: "specs-2", Client: true, Join: []string{n.RPCAddr}, PluginConfig: plugin("s2")})
	n.WaitForNodes(t, 2)
	for _, ns := range []string{"vision", "search", "research"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var policies strings.Builder
	files, _ := filepath.Glob("../../policies/*.hcl")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		policies.Write(b)
		policies.WriteString("\n")
	}
	e := brokerEnv(t, n, consul, policies.String(), "vision", 8, testcluster.BrokerOptions{})
	// Training first, as in the demo: submitted after the others, its two
	// 4-GPU workers would find 3 and 6 GPUs free and, a gang, wait.
	specs := []string{"training", "inference", "dev", "batch-inference"}
	if all, _ := filepath.Glob("../../jobspecs/*.nomad.hcl"); len(all) != len(specs) {
		t.Fatalf("jobspecs: %v, this test runs %v", all, specs)
	}
	for _, name := range specs {
		spec := "../../jobspecs/" + name + ".nomad.hcl"
		if out, err := e.nomadCLI("job", "validate", spec); err != nil || !strings.Contains(out, "Job validation successful") {
			t.Errorf("nomad job validate %s: %v\n%s", spec, err, out)
		}
		if out, err := e.nomadCLI("job", "run", "-detach", spec); err != nil || !strings.Contains(out, "nomad-gpu: admitted") {
			t.Fatalf("nomad job run %s through the broker: %v\n%s", spec, err, out)
		}
	}
	e.waitRunning("vision", "train-resnet")
	e.waitRunning("search", "ranker")
	e.waitRunning("vision", "dev-env")
	out, err := e.nomadCLI("job", "dispatch", "-namespace", "research", "-detach", "-meta", "input=part-0001", "batch-infer")
	if err != nil || !strings.Contains(out, "Dispatched Job ID") { // the CLI prints no warnings for a dispatch
		t.Fatalf("dispatch through the broker: %v\n%s", err, out)
	}
	testcluster.WaitFor(t, 60*time.Second, "the dispatched child complete", func() error {
		jobs, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: "research", Prefix: "batch-infer/dispatch-"})
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if j.Namespace == "research" && j.JobSummary != nil && j.JobSummary.Summary["infer"].Complete == 1 {
				return nil
			}
		}
		return fmt.Errorf("children %+v", jobs)
	})
}

// waitAllocsRunning waits until want allocations of a job run.
func waitAllocsRunning(t *testing.T, n *testcluster.Nomad, ns, id string, want int) {
	t.Helper()
	testcluster.WaitFor(t, 90*time.Second, fmt.Sprintf("%d allocations of %s running", want, id), func() error {
		allocs, _, err := n.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: ns})
		running := 0
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning {
				running++
			}
		}
		if err != nil || running != want {
			return fmt.Errorf("%d running (%v)", running, err)
		}
		return nil
	})
}
