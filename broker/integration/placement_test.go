package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

const placementPolicy = `
queue "training" { priority = 60 }
tenant "a" {
  namespaces = ["a"]
  queues     = ["training"]
  guaranteed = 5
  limit      = 8
}
tenant "b" {
  namespaces = ["b"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 8
}
borrowing {
  enabled = true
}
preemption {
  batch = true
}
placement {
  mode          = "broker"
  reserve_after = "0"
}
reclaim_settings {
  period = "1s"
}
`

// TestPlacement: borrowed work is admitted only where one node has room for
// it, and the broker pins each batch job to the node it chose, pinning it
// again when that node drains before the job runs there. Its own two nodes
// of 4 GPUs: it drains one.
func TestPlacement(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUCluster(t, "place", 2, 4, "a", "b")
	e := brokerEnv(t, n, consul, placementPolicy, "a", 4, testcluster.BrokerOptions{})
	pinOf := func(ns, id string) string {
		t.Helper()
		for _, c := range e.job(ns, id).TaskGroups[0].Constraints {
			if c.LTarget == "${node.unique.id}" && c.Operand == "set_contains_any" {
				return c.RTarget
			}
		}
		t.Fatalf("%s/%s is pinned to no node", ns, id)
		return ""
	}
	runsOn := func(ns, id, node string) {
		t.Helper()
		testcluster.WaitFor(t, 60*time.Second, fmt.Sprintf("%s/%s running on %s", ns, id, node), func() error {
			stubs, _, err := n.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: ns})
			if err != nil {
				return err
			}
			for _, s := range stubs {
				if s.ClientStatus == api.AllocClientStatusRunning && s.DesiredStatus == api.AllocDesiredStatusRun {
					if s.NodeID != node {
						return fmt.Errorf("running on %s", s.NodeID)
					}
					return nil
				}
			}
			return fmt.Errorf("%d allocations, none running", len(stubs))
		})
	}

	// Tenant b is guaranteed 1 GPU: 3 are borrowed. Best fit puts the
	// first on one node, the second on the other: 1 GPU left free on each.
	var first string
	for _, id := range []string{"b1", "b2"} {
		out, err := e.run("b", id, 1, 3, "", false)
		if err != nil || !strings.Contains(out, "borrowed: yes") || !strings.Contains(out, "placed by the broker") {
			t.Fatalf("%s: want admitted borrowed and placed by the broker: %v\n%s", id, err, out)
		}
		node := pinOf("b", id)
		runsOn("b", id, node)
		if id == "b1" {
			first = node
		} else if node == first {
			t.Fatalf("b2 pinned to b1's node %s, which has 1 GPU free", node)
		}
	}

	t.Run("borrowed work waits for a node with room, not for idle GPUs", func(t *testing.T) {
		e := e.in(t)
		// 2 GPUs are idle, but on two nodes: Nomad could not place it, so
		// it is not admitted (it would count against b while it waits).
		out, err := e.run("b", "b3", 1, 2, "", true)
		if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") || !strings.Contains(out, "no node has room for its allocations now") ||
			!strings.Contains(out, "the most free GPUs on one node: 1") {
			t.Fatalf("b3 on 2 idle GPUs spread over two nodes: want queued, no node has room: %v\n%s", err, out)
		}
		e.stop("b", "b1")
		e.waitAdmitted(t, "b", "b3", 60*time.Second)
		runsOn("b", "b3", first)
		if pin := pinOf("b", "b3"); pin != first {
			t.Errorf("b3 pinned to %s, want %s, the node b1 freed", pin, first)
		}
	})

	t.Run("a pinned job is pinned again when its node drains before it runs", func(t *testing.T) {
		e := e.in(t)
		// A job that needs no GPU, straight to Nomad, takes the memory of
		// the node b3 leaves: a GPU job pinned there waits, blocked (with
		// no borrowed work there, Nomad has nothing to preempt for it).
		e.stop("b", "b3")
		e.waitUsed("b", 3)
		node, _, err := n.API.Nodes().Info(first, nil)
		if err != nil {
			t.Fatal(err)
		}
		mem := int(node.NodeResources.Memory.MemoryMB) - 8
		if node.ReservedResources != nil {
			mem -= int(node.ReservedResources.Memory.MemoryMB)
		}
		allocs, _, err := n.API.Nodes().Allocations(first, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range allocs {
			if a.ClientTerminalStatus() || a.ServerTerminalStatus() {
				continue
			}
			for _, tr := range a.AllocatedResources.Tasks {
				mem -= int(tr.Memory.MemoryMB)
			}
		}
		hog := api.NewBatchJob("hog", "hog", "global", 55) // within 10 of a1: not preempted for it
		hog.Namespace = ptr("a")
		hog.Datacenters = []string{"*"}
		hog.Constrain(api.NewConstraint("${node.unique.id}", "=", first))
		hog.AddTaskGroup(api.NewTaskGroup("g", 1).AddTask(api.NewTask("t", "raw_exec").
			SetConfig("command", "/bin/sleep").SetConfig("args", []string{"3600"}).Require(&api.Resources{CPU: ptr(20), MemoryMB: &mem})))
		if _, _, err := n.API.Jobs().Register(hog, nil); err != nil {
			t.Fatal(err)
		}
		e.waitRunning("a", "hog")
		// Within a's guarantee: the broker places it where free GPUs fit
		// it best, b3's node (4 free), whose memory Nomad finds taken.
		out, err := e.run("a", "a1", 1, 2, "", true)
		if err != nil || !strings.Contains(out, "borrowed: no") || !strings.Contains(out, `task group "g" on node `+first) {
			t.Fatalf("a1: want admitted within the guarantee, placed on %s: %v\n%s", first, err, out)
		}
		testcluster.WaitFor(t, 30*time.Second, "a1 blocked", func() error {
			if s := *e.job("a", "a1").Status; s != "pending" {
				var on []string
				for _, id := range []string{"a/a1", "a/hog", "b/b3"} {
					ns, id, _ := strings.Cut(id, "/")
					stubs, _, _ := n.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: ns})
					for _, s := range stubs {
						on = append(on, fmt.Sprintf("%s on %s: %s/%s", id, s.NodeID, s.DesiredStatus, s.ClientStatus))
					}
				}
				return fmt.Errorf("status %s; memory %d; %v", s, mem, on)
			}
			return nil
		})
		if _, err := n.API.Nodes().UpdateDrain(first, &api.DrainSpec{Deadline: time.Second}, false, nil); err != nil {
			t.Fatal(err)
		}
		// The leader pins it to the other node, where Nomad evicts
		// borrowed b2 for it.
		var other string
		testcluster.WaitFor(t, 60*time.Second, "a1 pinned to the other node", func() error {
			if other = pinOf("a", "a1"); other == first {
				return fmt.Errorf("still pinned to the drained node %s", first)
			}
			return nil
		})
		runsOn("a", "a1", other)
		time.Sleep(3 * time.Second) // reclaim passes every second
		if e.unadmitted("a", "a1") {
			t.Errorf("a1 pinned again is taken for unadmitted work: its new stamp does not bind its new pin")
		}
	})
}

// TestAJobNamingAModelPlacesOnIslandGroups: a node whose plugin offers its 4
// GPUs per NVLink island (island_groups: groups "<model> (island N)" of 2).
// A job written for the model (device "nvidia/gpu/<model>") finds no group
// of that name when sent straight to Nomad; through the broker, which asks
// it of the model's island groups, it is admitted, told so, and runs. Its
// own one-node cluster: no other test's nodes offer island groups, and such
// a node would change what their jobs fit.
func TestAJobNamingAModelPlacesOnIslandGroups(t *testing.T) {
	t.Parallel()
	const model = "NVIDIA H100 80GB HBM3"
	consul := testcluster.StartConsul(t)
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "islands", Server: true, Client: true, PluginConfig: `
    backend       = "fake"
    island_groups = true
    fake {
      count     = 4
      islands   = 2
      id_prefix = "isl"
    }`})
	n.WaitForNodes(t, 1)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		t.Fatal(err)
	}
	e := brokerEnv(t, n, consul, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
}
`, "vision", 2, testcluster.BrokerOptions{})

	direct := testbuild.Job("vision", "direct").Type(api.JobTypeBatch).Group("g", 1, 2, "nvidia/gpu/"+model).Build()
	direct.Datacenters = []string{"*"}
	direct.TaskGroups[0].Tasks[0].Config = map[string]any{"command": "/bin/sleep", "args": []string{"3600"}}
	resp, _, err := n.API.Jobs().Register(direct, &api.WriteOptions{Namespace: "vision"})
	if err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 30*time.Second, "Nomad's evaluation of the job sent straight to it", func() error {
		ev, _, err := n.API.Evaluations().Info(resp.EvalID, &api.QueryOptions{Namespace: "vision"})
		if err != nil || ev.Status != api.EvalStatusComplete {
			return fmt.Errorf("evaluation %v (%v)", ev, err)
		}
		if ev.FailedTGAllocs["g"] == nil {
			t.Errorf("straight to Nomad, a job naming %q placed on island groups: the test shows nothing", model)
		}
		return nil
	})
	if _, _, err := n.API.Jobs().Deregister("direct", true, &api.WriteOptions{Namespace: "vision"}); err != nil {
		t.Fatal(err)
	}

	spec := e.spec("vision", "named", 1, 2, "")
	b, _ := os.ReadFile(spec)
	writeFile(t, spec, strings.Replace(string(b), `device "nvidia/gpu"`, `device "nvidia/gpu/`+model+`"`, 1))
	out, err := e.nomadCLI("job", "run", "-detach", spec)
	if err != nil || !strings.Contains(out, "nomad-gpu: admitted") || !strings.Contains(out, "per NVLink island (island_groups)") {
		t.Fatalf("a job naming the model through the broker: want admitted, with a warning about islands: %v\n%s", err, out)
	}
	e.waitRunning("vision", "named")
	dev := e.job("vision", "named").TaskGroups[0].Tasks[0].Resources.Devices[0]
	if dev.Name != "nvidia/gpu" || len(dev.Constraints) != 1 || dev.Constraints[0].LTarget != "${device.model}" || dev.Constraints[0].Operand != "regexp" {
		t.Errorf("the job Nomad runs asks %q %+v", dev.Name, dev.Constraints)
	}
	if used := e.usedBy("vision"); used != 2 {
		t.Errorf("vision charged %v GPUs, want 2", used)
	}
}
