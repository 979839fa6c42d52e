package integration

import (
	"fmt"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// islandScript fragments an 8-GPU node of two 4-GPU NVLink islands: single
// GPUs come and go between 2- and 4-GPU jobs. A step with gpus 0 stops the
// job (its GPUs are free for the next step).
var islandScript = []struct {
	job  string
	gpus int
}{
	{"s1", 1}, {"p1", 2}, {"s2", 1}, {"p2", 2}, {"s1", 0}, {"s3", 1}, {"p1", 0}, {"p3", 2},
	{"s2", 0}, {"p2", 0}, {"p4", 2}, {"s3", 0}, {"s4", 1}, {"p3", 0}, {"q1", 4}, {"p4", 0},
	{"p5", 2}, {"s4", 0}, {"q1", 0}, {"q2", 4}, {"p5", 0}, {"q2", 0},
}

// islandRounds is how often one op plays the script: Nomad picks a group's
// GPUs in map order, so the spanning share without island groups varies.
const islandRounds = 4

// BenchmarkIslandSpanning plays islandScript on real Nomad with the fake
// backend (8 GPUs, 2 islands), one device group per model (Nomad's default
// pick: any free GPUs of the group) and then island_groups = true. It
// reports the share of multi-GPU allocations whose GPUs span islands, and
// the requests Nomad could not place: with island groups, a request fits
// only inside one island's free GPUs.
func BenchmarkIslandSpanning(b *testing.B) {
	for _, grouped := range []bool{false, true} {
		name := map[bool]string{false: "one-group", true: "island-groups"}[grouped]
		b.Run(name, func(b *testing.B) {
			prefix := "isl-" + name
			n := testcluster.StartDev(b, fmt.Sprintf(`
    backend            = "fake"
    fingerprint_period = "5s"
    island_groups      = %t
    fake {
      count     = 8
      id_prefix = %q
      islands   = 2
    }`, grouped, prefix))
			n.WaitForNodes(b, 1)
			island := map[string]int{}
			for i := 0; i < 8; i++ {
				island[fake.UUID(prefix, i)] = i / 4
			}
			var multi, spanning, unplaced, asked int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for r := 0; r < islandRounds; r++ {
					placed := map[string]bool{}
					for _, step := range islandScript {
						id := fmt.Sprintf("%s-%d-%d", step.job, i, r)
						if step.gpus == 0 {
							if placed[id] {
								purge(b, n, id)
								delete(placed, id)
							}
							continue
						}
						asked++
						eval := waitEval(b, n, register(b, n, gpuJob(id, step.gpus)))
						if len(eval.FailedTGAllocs) > 0 {
							unplaced++
							purge(b, n, id)
							continue
						}
						placed[id] = true
						if step.gpus < 2 {
							continue
						}
						multi++
						if spans(b, n, id, island) {
							spanning++
						}
					}
					for id := range placed {
						purge(b, n, id)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(100*float64(spanning)/float64(max(multi, 1)), "%spanning")
			b.ReportMetric(100*float64(unplaced)/float64(max(asked, 1)), "%unplaced")
		})
	}
}

// spans reports whether job id's allocation holds GPUs of more than one island.
func spans(b *testing.B, n *testcluster.Nomad, id string, island map[string]int) bool {
	b.Helper()
	stubs, _, err := n.API.Jobs().Allocations(id, false, nil)
	if err != nil || len(stubs) != 1 {
		b.Fatalf("%s: %d allocations (%v)", id, len(stubs), err)
	}
	a, _, err := n.API.Allocations().Info(stubs[0].ID, nil)
	if err != nil {
		b.Fatal(err)
	}
	seen := map[int]bool{}
	for _, d := range a.AllocatedResources.Tasks["t"].Devices {
		for _, gpu := range d.DeviceIDs {
			seen[island[gpu]] = true
		}
	}
	return len(seen) > 1
}
