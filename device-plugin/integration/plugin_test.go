package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

const model = "NVIDIA H100 80GB HBM3"

func pluginConfig(idPrefix, stateFile string) string {
	return fmt.Sprintf(`
    backend            = "fake"
    fingerprint_period = "5s"
    health_recovery    = "6s"
    fake {
      count      = 8
      id_prefix  = %q
      state_file = %q
    }`, idPrefix, stateFile)
}

// shapedConfig is a client of count fake GPUs of a real card's model (the
// fake takes that card's PCIe generation, power and clocks).
func shapedConfig(idPrefix, model string, memoryMiB, count int) string {
	return fmt.Sprintf(`
    backend = "fake"
    fake {
      count      = %d
      model      = %q
      memory_mib = %d
      id_prefix  = %q
    }`, count, model, memoryMiB, idPrefix)
}

// TestPluginOnDevAgent runs every single-node scenario on one real Nomad agent,
// in an order where each leaves the GPUs free for the next.
func TestPluginOnDevAgent(t *testing.T) {
	state := filepath.Join(t.TempDir(), "gpu-state.json")
	n := testcluster.StartDev(t, pluginConfig("dev", state))
	node := n.WaitForNodes(t, 1)[0]

	t.Run("fingerprint shows 8 GPUs with attributes", func(t *testing.T) {
		dev := gpuGroup(t, node)
		if len(dev.Instances) != 8 {
			t.Fatalf("want 8 GPUs, got %d", len(dev.Instances))
		}
		for i, inst := range sortedInstances(dev) {
			if !inst.Healthy {
				t.Errorf("GPU %s unhealthy at start: %s", inst.ID, inst.HealthDescription)
			}
			_ = i
		}
		want := map[string]string{"memory": "81559 MiB", "compute_capability": "9.0", "mig": "false", "pcie_generation": "5"}
		for k, v := range want {
			if got := dev.Attributes[k]; got == nil || got.String() != v {
				t.Errorf("attribute %s = %v, want %s", k, got, v)
			}
		}
		out := nomadCLI(t, n, "node", "status", "-verbose", node.ID)
		if !strings.Contains(out, "nvidia/gpu/"+model) || !strings.Contains(out, fake.UUID("dev", 7)) {
			t.Errorf("`nomad node status -verbose` does not list the GPU group and its ids:\n%s", out)
		}
	})

	t.Run("unsatisfiable device constraint leaves the job pending", func(t *testing.T) {
		job := gpuJob("too-big", 1, &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: "100 GiB"})
		evalID := register(t, n, job)
		eval := waitEval(t, n, evalID)
		failed := eval.FailedTGAllocs["g"]
		if failed == nil {
			t.Fatalf("job with memory >= 100 GiB was placed on 80 GiB GPUs: %+v", eval)
		}
		t.Logf("Nomad's reason: constraints %v, exhausted %v", failed.ConstraintFiltered, failed.DimensionExhausted)
		if len(failed.ConstraintFiltered) == 0 && len(failed.DimensionExhausted) == 0 {
			t.Errorf("no constraint or device reason given: %+v", failed)
		}
		fits := gpuJob("fits", 1, &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: "40 GiB"})
		register(t, n, fits)
		waitRunning(t, n, "fits")
		purge(t, n, "too-big", "fits")
	})

	t.Run("tasks see exactly their allocated GPUs", func(t *testing.T) {
		seen := map[string]string{}
		for _, id := range []string{"train-a", "train-b"} {
			register(t, n, gpuJob(id, 2, nil))
			alloc := waitRunning(t, n, id)
			allocated := alloc.AllocatedResources.Tasks["t"].Devices[0].DeviceIDs
			visible := readAllocFile(t, n, alloc, "alloc/gpus")
			got := strings.Split(strings.TrimSpace(visible), ",")
			sort.Strings(got)
			sort.Strings(allocated)
			if strings.Join(got, ",") != strings.Join(allocated, ",") || len(got) != 2 {
				t.Fatalf("%s: NVIDIA_VISIBLE_DEVICES=%q, allocated %v", id, visible, allocated)
			}
			for _, uuid := range got {
				if other, dup := seen[uuid]; dup {
					t.Fatalf("GPU %s given to both %s and %s", uuid, other, id)
				}
				seen[uuid] = id
			}
		}
		purge(t, n, "train-a", "train-b")
	})

	t.Run("stats from the state file reach the node stats API", func(t *testing.T) {
		uuid := fake.UUID("dev", 3)
		writeState(t, state, map[string]any{uuid: map[string]any{"utilization_gpu": 77, "memory_used_mib": 40000}})
		testcluster.WaitFor(t, 30*time.Second, "device stats", func() error {
			stats, err := n.API.Nodes().Stats(node.ID, nil)
			if err != nil {
				return err
			}
			for _, g := range stats.DeviceStats {
				inst := g.InstanceStats[uuid]
				if g.Name != model || inst == nil || inst.Stats == nil {
					continue
				}
				util := inst.Stats.Attributes["GPU utilization"]
				if util == nil || util.IntNumeratorVal == nil || *util.IntNumeratorVal != 77 {
					return fmt.Errorf("GPU utilization is %v", util)
				}
				if clock := inst.Stats.Attributes["Memory clock"]; clock == nil || clock.IntNumeratorVal == nil ||
					*clock.IntNumeratorVal != 2619 || clock.Unit != "MHz" {
					return fmt.Errorf("Memory clock is %v", clock)
				}
				return nil
			}
			return fmt.Errorf("no stats for %s yet", uuid)
		})
	})

	t.Run("unhealthy GPU is withheld and recovers", func(t *testing.T) {
		uuid := fake.UUID("dev", 5)
		writeState(t, state, map[string]any{uuid: map[string]any{"healthy": false, "health_description": "XID 79"}})
		start := time.Now()
		// The plugin's next scan (one period), then the Nomad v1.6 client's own
		// node-update interval (5s plus up to 5s of stagger) before servers see it.
		testcluster.WaitFor(t, 5*time.Second+10*time.Second+2*time.Second, "GPU reported unhealthy", func() error {
			return instanceHealth(n, node.ID, uuid, false, "XID 79")
		})
		t.Logf("unhealthy in Nomad after %s (fingerprint_period 5s)", time.Since(start).Round(100*time.Millisecond))

		evalID := register(t, n, gpuJob("all-eight", 8, nil))
		if eval := waitEval(t, n, evalID); eval.FailedTGAllocs["g"] == nil {
			t.Fatalf("a job for 8 GPUs was placed while one is unhealthy")
		}

		writeState(t, state, map[string]any{})
		healed := time.Now()
		testcluster.WaitFor(t, 30*time.Second, "GPU healthy again", func() error {
			return instanceHealth(n, node.ID, uuid, true, "")
		})
		if d := time.Since(healed); d < 6*time.Second {
			t.Errorf("recovered after %s, before health_recovery (6s)", d)
		}
		// Nomad v1.6 does not unblock a blocked evaluation when a device turns
		// healthy (only node status and capacity changes do): evaluate it again.
		if _, _, err := n.API.Jobs().ForceEvaluate("all-eight", nil); err != nil {
			t.Fatal(err)
		}
		waitRunning(t, n, "all-eight")
		purge(t, n, "all-eight")
	})

	t.Run("a killed plugin is started again and its GPUs come back", func(t *testing.T) {
		before := n.PluginPIDs()
		if len(before) != 1 {
			t.Fatalf("want one plugin process under the agent, got %v", before)
		}
		if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testcluster.WaitFor(t, 60*time.Second, "the plugin started again", func() error {
			if now := n.PluginPIDs(); len(now) != 1 || now[0] == before[0] {
				return fmt.Errorf("plugin processes %v (killed %d)", now, before[0])
			}
			return nil
		})
		register(t, n, gpuJob("after-restart", 8, nil))
		waitRunning(t, n, "after-restart")
		purge(t, n, "after-restart")
	})
}

// TestInvalidPluginConfigStopsAgent checks that a bad option is named in the error.
func TestInvalidPluginConfigStopsAgent(t *testing.T) {
	cases := map[string]struct{ config, want string }{
		"unknown backend": {`backend = "tpu"`, `option backend: "tpu" is not one of`},
		"bad duration":    {`fingerprint_period = "soon"`, `option fingerprint_period: "soon" is not a duration`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			n := testcluster.LaunchNomad(t, testcluster.NomadOptions{Name: "bad", Server: true, Client: true, PluginConfig: c.config})
			testcluster.WaitFor(t, 60*time.Second, "the agent to refuse its config", func() error {
				if !n.Exited() {
					return fmt.Errorf("agent still running")
				}
				return nil
			})
			if log := n.Log(); !strings.Contains(log, c.want) {
				t.Errorf("agent log does not contain %q:\n%s", c.want, log)
			}
		})
	}
}

// TestJobsWrittenForNomadDeviceNvidiaPlaceOnRealCards: three clients on one
// machine, fake GPUs shaped as a T4 (PCIe gen 3), an A100 (gen 4) and an
// H100 (gen 5). Jobspecs tuned on nomad-device-nvidia v1.1.0, constraining
// on its attributes with the values it reports there, place unchanged; a
// bound above what a card offers leaves a job pending (the values are
// compared, not just present). id_prefix keeps the GPUs of the clients apart.
// The T4 client's config still has its nomad-device-nvidia block, which
// ignores one of its GPUs: that GPU stays ignored, and the client's log says
// to rename the block.
func TestJobsWrittenForNomadDeviceNvidiaPlaceOnRealCards(t *testing.T) {
	server := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "server", Server: true})
	cards := []struct{ client, model string }{{"t4", "Tesla T4"}, {"a100", "NVIDIA A100-SXM4-80GB"}, {"h100", model}}
	ignored := fake.UUID("t4", 0)
	clients := map[string]*testcluster.Nomad{}
	for i, c := range cards {
		o := testcluster.NomadOptions{Name: c.client, Client: true,
			Join: []string{server.RPCAddr}, PluginConfig: shapedConfig(c.client, c.model, []int{15360, 81920, 81559}[i], 2)}
		if c.client == "t4" {
			o.ExtraHCL = fmt.Sprintf("plugin \"nomad-device-nvidia\" {\n  config {\n    ignored_gpu_ids = [%q]\n  }\n}\n", ignored)
		}
		clients[c.client] = testcluster.StartNomad(t, o)
	}
	nodes := server.WaitForNodes(t, len(cards))
	for _, node := range nodes {
		if node.Name != "t4" {
			continue
		}
		var ids []string
		for _, d := range node.NodeResources.Devices {
			for _, inst := range d.Instances {
				ids = append(ids, inst.ID)
			}
		}
		if len(ids) != 1 || ids[0] == ignored {
			t.Errorf("T4 client: GPUs %v, want one, not %s (ignored_gpu_ids of its nomad-device-nvidia block)", ids, ignored)
		}
	}
	if log := clients["t4"].Log(); !strings.Contains(log, "nomad-device-nvidia") || !strings.Contains(log, "rename it to plugin") {
		t.Errorf("the T4 client's log does not say to rename its nomad-device-nvidia block:\n%s", log)
	}
	ids := map[string]string{}
	for _, node := range nodes {
		for _, d := range node.NodeResources.Devices {
			for _, inst := range d.Instances {
				if other, dup := ids[inst.ID]; dup {
					t.Errorf("GPU %s on both %s and %s", inst.ID, other, node.Name)
				}
				ids[inst.ID] = node.Name
			}
		}
	}
	c := func(attr, op, value string) *api.Constraint {
		return &api.Constraint{LTarget: "${device.attr." + attr + "}", Operand: op, RTarget: value}
	}
	modelIs := func(m string) *api.Constraint {
		return &api.Constraint{LTarget: "${device.model}", Operand: "=", RTarget: m}
	}
	// Its "1" and "0" are strings, which Nomad does not compare with the
	// number a constraint's "1" is read as: jobs match them by regexp.
	common := []*api.Constraint{c("persistence_mode", "regexp", "^1$"), c("display_state", "regexp", "^0$"), c("driver_version", "=", "550.54.15")}
	jobs := map[string][]*api.Constraint{
		"ndn-t4":   {modelIs("Tesla T4"), c("pci_bandwidth", ">=", "16 GB/s"), c("power", "<", "70 W"), c("memory_clock", ">=", "5000 MHz")},
		"ndn-a100": {modelIs("NVIDIA A100-SXM4-80GB"), c("pci_bandwidth", ">=", "32 GB/s"), c("bar1", ">=", "64 GiB"), c("cores_clock", ">=", "200 MHz")},
		"ndn-h100": {modelIs(model), c("pci_bandwidth", ">=", "48 GB/s"), c("power", ">=", "50 W"), c("memory_clock", ">=", "2600 MHz")},
	}
	for id, cs := range jobs {
		register(t, server, gpuJob(id, 1, append(cs, common...)...))
	}
	for id := range jobs {
		waitRunning(t, server, id)
	}
	// nomad-device-nvidia gives a gen 5 x16 link 49,152 MB/s (our own
	// pcie_bandwidth: 63,008): a job tuned on it asking more stays pending.
	evalID := register(t, server, gpuJob("too-wide", 1, c("pci_bandwidth", ">=", "50 GB/s")))
	if eval := waitEval(t, server, evalID); eval.FailedTGAllocs["g"] == nil {
		t.Errorf("a job asking pci_bandwidth >= 50 GB/s was placed: no card offers that under nomad-device-nvidia's rates")
	}
}

func gpuGroup(t *testing.T, node *api.Node) *api.NodeDeviceResource {
	t.Helper()
	for _, d := range node.NodeResources.Devices {
		if d.Vendor == "nvidia" && d.Type == "gpu" && d.Name == model {
			return d
		}
	}
	t.Fatalf("node %s has no nvidia/gpu/%s group: %+v", node.Name, model, node.NodeResources.Devices)
	return nil
}

func sortedInstances(d *api.NodeDeviceResource) []*api.NodeDevice {
	out := append([]*api.NodeDevice(nil), d.Instances...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func instanceHealth(n *testcluster.Nomad, nodeID, uuid string, healthy bool, reason string) error {
	node, _, err := n.API.Nodes().Info(nodeID, nil)
	if err != nil {
		return err
	}
	for _, d := range node.NodeResources.Devices {
		for _, inst := range d.Instances {
			if inst.ID != uuid {
				continue
			}
			if inst.Healthy != healthy || !strings.Contains(inst.HealthDescription, reason) {
				return fmt.Errorf("healthy=%t %q", inst.Healthy, inst.HealthDescription)
			}
			return nil
		}
	}
	return fmt.Errorf("GPU %s not on the node", uuid)
}

// gpuJob is a raw_exec batch job whose task writes the GPUs it sees, then waits.
func gpuJob(id string, gpus int, constraints ...*api.Constraint) *api.Job {
	dev := &api.RequestedDevice{Name: "nvidia/gpu", Count: uint64Ptr(uint64(gpus))}
	for _, c := range constraints {
		if c != nil {
			dev.Constraints = append(dev.Constraints, c)
		}
	}
	task := &api.Task{
		Name:   "t",
		Driver: "raw_exec",
		Config: map[string]any{"command": "/bin/sh", "args": []string{"-c",
			`echo "$NVIDIA_VISIBLE_DEVICES" > "$NOMAD_ALLOC_DIR/gpus"; exec sleep 3600`}},
		Resources: &api.Resources{CPU: intPtr(50), MemoryMB: intPtr(32), Devices: []*api.RequestedDevice{dev}},
		// The task writes to a file; no `nomad logmon` process needs to run.
		LogConfig: &api.LogConfig{Disabled: boolPtr(true)},
	}
	job := api.NewBatchJob(id, id, "global", 50)
	job.Datacenters = []string{"*"}
	tg := api.NewTaskGroup("g", 1).AddTask(task)
	tg.ReschedulePolicy = &api.ReschedulePolicy{Attempts: intPtr(0), Unlimited: boolPtr(false)}
	job.AddTaskGroup(tg)
	return job
}

func register(t testing.TB, n *testcluster.Nomad, job *api.Job) string {
	t.Helper()
	resp, _, err := n.API.Jobs().Register(job, nil)
	if err != nil {
		t.Fatalf("register %s: %v", *job.ID, err)
	}
	return resp.EvalID
}

func waitEval(t testing.TB, n *testcluster.Nomad, id string) *api.Evaluation {
	t.Helper()
	var eval *api.Evaluation
	testcluster.WaitFor(t, 30*time.Second, "evaluation "+id, func() error {
		var err error
		eval, _, err = n.API.Evaluations().Info(id, nil)
		if err != nil {
			return err
		}
		if eval.Status != api.EvalStatusComplete {
			return fmt.Errorf("evaluation %s", eval.Status)
		}
		return nil
	})
	return eval
}

func waitRunning(t testing.TB, n *testcluster.Nomad, jobID string) *api.Allocation {
	t.Helper()
	var alloc *api.Allocation
	testcluster.WaitFor(t, 60*time.Second, jobID+" running", func() error {
		stubs, _, err := n.API.Jobs().Allocations(jobID, false, nil)
		if err != nil {
			return err
		}
		for _, s := range stubs {
			if s.ClientStatus == api.AllocClientStatusRunning {
				alloc, _, err = n.API.Allocations().Info(s.ID, nil)
				if err != nil {
					return err
				}
				if _, _, err := n.API.AllocFS().Stat(alloc, "alloc/gpus", nil); err != nil {
					return err
				}
				return nil
			}
		}
		return fmt.Errorf("%d allocations, none running", len(stubs))
	})
	return alloc
}

func readAllocFile(t *testing.T, n *testcluster.Nomad, alloc *api.Allocation, path string) string {
	t.Helper()
	r, err := n.API.AllocFS().Cat(alloc, path, nil)
	if err != nil {
		t.Fatalf("read %s of %s: %v", path, alloc.ID, err)
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

func purge(t testing.TB, n *testcluster.Nomad, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, _, err := n.API.Jobs().Deregister(id, true, nil); err != nil {
			t.Fatalf("stop %s: %v", id, err)
		}
	}
	testcluster.WaitFor(t, 30*time.Second, "allocations stopped", func() error {
		for _, id := range ids {
			stubs, _, _ := n.API.Jobs().Allocations(id, true, nil)
			for _, s := range stubs {
				if s.ClientStatus == api.AllocClientStatusRunning || s.ClientStatus == api.AllocClientStatusPending {
					return fmt.Errorf("%s still %s", id, s.ClientStatus)
				}
			}
		}
		return nil
	})
}

func writeState(t *testing.T, path string, state map[string]any) {
	t.Helper()
	b, _ := json.Marshal(state)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func nomadCLI(t *testing.T, n *testcluster.Nomad, args ...string) string {
	t.Helper()
	cmd := exec.Command(tools.Binary(t, "nomad"), args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+n.Addr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nomad %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func intPtr(i int) *int          { return &i }
func uint64Ptr(i uint64) *uint64 { return &i }
func boolPtr(b bool) *bool       { return &b }
