package integration

import (
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// TestTwoTasksShareOneGPUAsReplicas: with sharing { replicas = 2  gpus = 1 }
// Nomad sees one GPU whole and the other as two replicas. Two jobs asking
// for a shared GPU run at once on replicas of the same GPU, and each task
// sees that GPU.
func TestTwoTasksShareOneGPUAsReplicas(t *testing.T) {
	n := testcluster.StartDev(t, `
    backend            = "fake"
    fingerprint_period = "5s"
    fake {
      count     = 2
      id_prefix = "share"
    }
    sharing {
      replicas = 2
      gpus     = 1
    }`)
	node := n.WaitForNodes(t, 1)[0]
	groups := map[string]int{}
	for _, d := range node.NodeResources.Devices {
		groups[d.Name] += len(d.Instances)
	}
	if groups[model] != 1 || groups[model+" (shared)"] != 2 {
		t.Fatalf("device groups %v: want 1 whole GPU and 2 replicas", groups)
	}
	shared := &api.Constraint{LTarget: "${device.attr.shared}", Operand: "=", RTarget: "true"}
	var seen []string
	for _, id := range []string{"nb-a", "nb-b"} {
		register(t, n, gpuJob(id, 1, shared))
		alloc := waitRunning(t, n, id)
		replica := alloc.AllocatedResources.Tasks["t"].Devices[0].DeviceIDs[0]
		visible := strings.TrimSpace(readAllocFile(t, n, alloc, "alloc/gpus"))
		if !strings.HasPrefix(replica, visible+"-") || visible != fake.UUID("share", 0) {
			t.Fatalf("%s: replica %s, NVIDIA_VISIBLE_DEVICES=%q, want the first GPU %s", id, replica, visible, fake.UUID("share", 0))
		}
		seen = append(seen, replica)
	}
	if seen[0] == seen[1] {
		t.Errorf("both jobs got replica %s", seen[0])
	}
	purge(t, n, "nb-a", "nb-b")
}
