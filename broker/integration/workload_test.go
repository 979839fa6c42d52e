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

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// TestAGangWaitsUntilAllItsAllocationsFit: 2 nodes × 8 GPUs with 5 free on
// each; a training job of 2 × 6 GPUs is queued, not half-placed, and runs
// whole once GPUs free.
func TestAGangWaitsUntilAllItsAllocationsFit(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUCluster(t, "gang", 2, 8, "vision")
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
	if !strings.Contains(w, "queued as") || !strings.Contains(w, `workload "training" is a gang`) || !strings.Contains(w, "the most free GPUs on one node: 5 ") {
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
// state on a cluster like the demo's (2 nodes × 8 GPUs). A dispatch of the
// parameterized batch job is admitted on its own and completes.
func TestTheJobspecsRunThroughTheBroker(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	plugin := func(prefix string) string {
		return fmt.Sprintf("\n    backend = \"fake\"\n    fake {\n      count     = 8\n      id_prefix = %q\n    }", prefix)
	}
	// Both nodes see the same checkpoints directory, as a shared filesystem.
	ckpt := t.TempDir()
	volume := checkpointsVolume(ckpt)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "specs-1", Server: true, Client: true, PluginConfig: plugin("s1"), ClientHCL: volume})
	testcluster.StartNomad(t, testcluster.NomadOptions{Name: "specs-2", Client: true, Join: []string{n.RPCAddr}, PluginConfig: plugin("s2"), ClientHCL: volume})
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
		run := []string{"job", "run", "-detach", spec}
		if name == "training" {
			run = []string{"job", "run", "-detach", "-var", "checkpoint_dir=" + ckpt, spec}
		}
		if out, err := e.nomadCLI(run...); err != nil || !strings.Contains(out, "nomad-gpu: admitted") {
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

	t.Run("the README's tour works as printed", func(t *testing.T) {
		e := e.in(t)
		readmeTour(t, e, n)
	})
}

// readmeTour brings the cluster to where `make demo` leaves it: vision at
// 12 of its limit of 12, train-resnet within its guarantee and
// train-borrowed borrowed, search's service and the dev job gone. Then it
// runs the README's five-minute tour, taken from README.md itself, in one
// shell, in a directory laid out as the repository after `make demo`. Each
// command must show what the README says it does.
func readmeTour(t *testing.T, e *env, n *testcluster.Nomad) {
	for _, stop := range [][2]string{{"search", "ranker"}, {"vision", "dev-env"}} {
		if out, err := e.nomadCLI("job", "stop", "-namespace", stop[0], "-detach", stop[1]); err != nil {
			t.Fatalf("stop %s: %v\n%s", stop[1], err, out)
		}
	}
	spec, err := os.ReadFile("../../jobspecs/training.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	borrowed := filepath.Join(t.TempDir(), "borrowed.nomad.hcl")
	writeFile(t, borrowed, strings.Replace(string(spec), `job "train-resnet"`, `job "train-borrowed"`, 1))
	testcluster.WaitFor(t, 60*time.Second, "train-borrowed admitted borrowed", func() error {
		out, err := e.nomadCLI("job", "run", "-detach", "-var", "workers=1", "-var", "gpus_per_worker=4", borrowed)
		if err != nil || !strings.Contains(out, "borrowed: yes") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	e.waitRunning("vision", "train-borrowed")

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, found := strings.Cut(string(readme), "## A five-minute tour")
	_, block, ok := strings.Cut(tour, "```sh\n")
	if !found || !ok {
		t.Fatal("README.md: no tour section, or no ```sh block in it")
	}
	block, _, _ = strings.Cut(block, "```")
	// The repository after make demo: bin/ with gpu-broker, nomad and consul;
	// jobspecs/ and policies/.
	dir := t.TempDir()
	root, _ := filepath.Abs("../..")
	for link, target := range map[string]string{"bin/gpu-broker": testcluster.BrokerBinary(t), "bin/nomad": tools.Binary(t, "nomad"),
		"jobspecs": filepath.Join(root, "jobspecs"), "policies": filepath.Join(root, "policies")} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, link)), 0o755)
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	// The demo's addresses are this cluster's; a browser is a request.
	script := strings.NewReplacer("http://127.0.0.1:4649", e.broker.Addr, "http://127.0.0.1:4646", n.Addr,
		"xdg-open ", "curl -s -o /dev/null -w '%{http_code}\\n' ").Replace(block)
	var commands []string
	var sh strings.Builder
	for _, line := range strings.Split(script, "\n") {
		command, _, _ := strings.Cut(line, "  #")
		if command = strings.TrimSpace(command); command == "" || strings.HasPrefix(command, "#") {
			continue
		}
		fmt.Fprintf(&sh, "echo '### %d'\n%s 2>&1\necho \"### rc $?\"\n", len(commands), command)
		commands = append(commands, command)
	}
	cmd := exec.Command("bash", "-c", sh.String())
	// gpu-broker's default address is the demo's broker; here, this one.
	cmd.Dir, cmd.Env = dir, []string{"HOME=" + dir, "PATH=/usr/local/bin:/usr/bin:/bin", "GPU_BROKER_ADDR=" + e.broker.Addr}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the tour: %v\n%s", err, out)
	}
	// What the README says each command shows, by the command's start.
	wants := map[string][]string{
		"bin/gpu-broker usage -from":  {"GPU-hours from", "COST USD"},
		"bin/gpu-broker usage":        {"TENANT", "vision    12    8           12"},
		"nomad job run jobspecs/dev":  {"nomad-gpu: queued as", `tenant "vision" would hold 13 of its limit of 12 GPUs`},
		"bin/gpu-broker queue list":   {"dev-env"},
		"nomad job stop":              {"finished with status \"complete\""},
		"bin/gpu-broker reclaim list": {"RULE"},
		"bin/gpu-broker audit":        {"train-borrowed", "dev-env", "admit-borrowed: beyond tenant \"vision\"'s guarantee"},
		"curl -s $NOMAD_ADDR/metrics": {`nomadgpu_gpus{`},
		"curl -s -o /dev/null":        {"200"},
		"bin/gpu-broker job check":    {"jobspecs/training.nomad.hcl: warning: the broker writes into it"},
		"export PATH":                 nil,
		"export NOMAD_ADDR":           nil,
	}
	parts := strings.Split(string(out), "### ")
	for i, command := range commands {
		var got string
		for _, p := range parts {
			if strings.HasPrefix(p, fmt.Sprintf("%d\n", i)) {
				got = strings.TrimPrefix(p, fmt.Sprintf("%d\n", i))
			}
		}
		var want []string
		matched := ""
		for prefix, w := range wants {
			if strings.HasPrefix(command, prefix) && len(prefix) > len(matched) {
				want, matched = w, prefix
			}
		}
		if matched == "" {
			t.Errorf("the tour's command %q: this test does not know what it should show", command)
			continue
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("the tour's %q shows no %q:\n%s", command, w, got)
			}
		}
	}
	if rcs := strings.Count(string(out), "### rc 0"); rcs != len(commands) {
		t.Errorf("%d of %d tour commands exited 0:\n%s", rcs, len(commands), out)
	}
	// Room made: the queued dev job is admitted (the README's comment).
	e.waitRunning("vision", "dev-env")

	// In a terminal of 80 columns the audit table wraps its results and
	// never cuts one: each is there whole, as -json has it.
	var events []audit.Event
	if err := json.Unmarshal([]byte(e.brokerCLI("audit", "-since", "1h", "-json")), &events); err != nil {
		t.Fatal(err)
	}
	narrow := exec.Command(testcluster.BrokerBinary(t), "audit", "-since", "1h", "-address", e.broker.Addr)
	narrow.Env = append(os.Environ(), "COLUMNS=80")
	wrapped, err := narrow.CombinedOutput()
	if err != nil {
		t.Fatalf("COLUMNS=80 gpu-broker audit: %v\n%s", err, wrapped)
	}
	table := strings.Join(strings.Fields(string(wrapped)), " ")
	results := 0
	for _, ev := range events {
		if r := strings.Join(strings.Fields(ev.Result), " "); len(r) > 40 {
			results++
			if !strings.Contains(table, r) {
				t.Errorf("COLUMNS=80 gpu-broker audit cuts %q:\n%s", r, table)
			}
		}
	}
	if results == 0 {
		t.Errorf("no audit result longer than 40 characters to check: %+v", events)
	}
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

// checkpointsVolume is the client configuration of the host volume that
// jobspecs/training.nomad.hcl keeps its checkpoints in.
func checkpointsVolume(path string) string {
	return fmt.Sprintf("host_volume \"checkpoints\" {\n    path = %q\n  }", path)
}

// TestATrainingJobResumesFromItsCheckpointAfterPreemption: the training
// jobspec, borrowing, is preempted by Nomad for an owner's job. Its task
// writes a checkpoint on SIGTERM, and the broker requeues it. When the
// owner's job stops, it is registered again, gets a new allocation, and
// resumes from the step it reached, not from zero.
func TestATrainingJobResumesFromItsCheckpointAfterPreemption(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	ckpt := t.TempDir()
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "ckpt", Server: true, Client: true,
		PluginConfig: "\n    backend = \"fake\"\n    fake {\n      count = 4\n    }", ClientHCL: checkpointsVolume(ckpt)})
	n.WaitForNodes(t, 1)
	for _, ns := range []string{"vision", "search"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e := brokerEnv(t, n, consul, preemptPolicy, "vision", 4, testcluster.BrokerOptions{})
	if out, err := e.run("vision", "own", 1, 2, "", true); err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("own: %v\n%s", err, out)
	}
	e.waitRunning("vision", "own")
	out, err := e.nomadCLI("job", "run", "-detach", "-var", "workers=1", "-var", "gpus_per_worker=2",
		"-var", "checkpoint_dir="+ckpt, "../../jobspecs/training.nomad.hcl")
	if err != nil || !strings.Contains(out, "borrowed: yes") {
		t.Fatalf("training, borrowing: %v\n%s", err, out)
	}
	first := e.waitRunning("vision", "train-resnet").ID
	file := filepath.Join(ckpt, "vision", "train-resnet", "worker-0")
	testcluster.WaitFor(t, 60*time.Second, "a periodic checkpoint", func() error {
		_, err := os.Stat(file)
		return err
	})
	time.Sleep(3 * time.Second) // a few steps past the periodic checkpoint

	if out, err := e.run("search", "svc", 1, 2, "", true); err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("svc: %v\n%s", err, out)
	}
	testcluster.WaitFor(t, 60*time.Second, "train-resnet preempted and back in the queue", func() error {
		if out := e.brokerCLI("queue", "list"); !strings.Contains(out, "train-resnet") {
			return fmt.Errorf("queue:\n%s", out)
		}
		return nil
	})
	stopped := taskLog(n, first, "train")
	at := strings.Index(stopped, "checkpoint at step ")
	var reached int
	if at < 0 {
		t.Fatalf("the preempted task wrote no checkpoint on SIGTERM:\n%s", stopped)
	}
	if _, err := fmt.Sscanf(stopped[at:], "checkpoint at step %d", &reached); err != nil || reached <= 10 {
		t.Fatalf("checkpoint on SIGTERM at step %d (%v), want past the first periodic one:\n%s", reached, err, stopped)
	}

	e.stop("search", "svc")
	second := e.waitRunning("vision", "train-resnet").ID
	if second == first {
		t.Fatalf("the same allocation %s runs again", first)
	}
	want := fmt.Sprintf("resuming at step %d", reached)
	t.Logf("preempted at step %d; allocation %s follows %s", reached, second, first)
	testcluster.WaitFor(t, 30*time.Second, "the new allocation's first line", func() error {
		if log := taskLog(n, second, "train"); !strings.Contains(log, want) {
			return fmt.Errorf("log of %s:\n%s", second, log)
		}
		return nil
	})
}

// taskLog is what a task of an allocation on n wrote to its standard output.
func taskLog(n *testcluster.Nomad, allocID, task string) string {
	b, _ := os.ReadFile(filepath.Join(n.DataDir, "alloc", allocID, "alloc", "logs", task+".stdout.0"))
	return string(b)
}

// TestReplicasCountAsAShareOfAGPU: on a node whose plugin offers one GPU as 4
// time-sliced replicas, a tenant limited to 1 GPU runs 4 one-replica jobs at
// once (each a quarter of a GPU), and a fifth waits for its limit.
func TestReplicasCountAsAShareOfAGPU(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "shared", Server: true, Client: true,
		PluginConfig: "\n    backend = \"fake\"\n    fake {\n      count = 2\n    }\n    sharing {\n      replicas = 4\n      gpus     = 1\n    }"})
	n.WaitForNodes(t, 1)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		t.Fatal(err)
	}
	e := brokerEnv(t, n, consul, `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
  guaranteed = 1
  limit      = 1
}
`, "vision", 2, testcluster.BrokerOptions{})
	replica := func(id string) string {
		spec := e.spec("vision", id, 1, 1, "")
		b, _ := os.ReadFile(spec)
		writeFile(t, spec, strings.Replace(string(b), `device "nvidia/gpu"`, `device "nvidia/gpu/NVIDIA H100 80GB HBM3 (shared)"`, 1))
		out, err := e.nomadCLI("job", "run", "-detach", spec)
		if err != nil {
			t.Fatalf("%s: %v\n%s", id, err, out)
		}
		return out
	}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("notebook-%d", i)
		if out := replica(id); !strings.Contains(out, "0.25 GPUs, borrowed: no") {
			t.Fatalf("%s, a quarter of a GPU within the guarantee:\n%s", id, out)
		}
		e.waitRunning("vision", id)
	}
	// The dev jobspec asks for a replica by constraint.
	out, err := e.nomadCLI("job", "run", "-detach", "-var", "replica=true", "../../jobspecs/dev.nomad.hcl")
	if err != nil || !strings.Contains(out, "0.25 GPUs, borrowed: no") {
		t.Fatalf("jobspecs/dev.nomad.hcl -var replica=true: %v\n%s", err, out)
	}
	e.waitRunning("vision", "dev-env")
	if out := replica("notebook-5"); !strings.Contains(out, "would hold 1.25 of its limit of 1 GPUs") {
		t.Errorf("the fifth replica:\n%s", out)
	}
	if used := e.usedBy("vision"); used != 1 {
		t.Errorf("vision is charged %g GPUs for 4 replicas of one GPU", used)
	}
}
