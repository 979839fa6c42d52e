package cluster

import (
	"fmt"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/testbuild"
)

// benchPolicy has n tenants, one namespace each.
func benchPolicy(b *testing.B, tenants int) *policy.Policy {
	src := "queue \"training\" { priority = 60 }\n"
	for i := 0; i < tenants; i++ {
		src += fmt.Sprintf("tenant \"t%d\" {\n namespaces = [\"ns%d\"]\n queues = [\"training\"]\n guaranteed = 8\n limit = 16\n}\n", i, i)
	}
	return testbuild.Policy(b, src)
}

// benchView has allocs one-GPU jobs spread over the tenants, and nodes of 8 GPUs.
func benchView(allocs, tenants int) *View {
	v := NewView(nil)
	for i := 0; i < allocs/8+1; i++ {
		v.ObserveNode(testbuild.Node(fmt.Sprint(i), "H100", 8, 0))
	}
	for i := 0; i < allocs; i++ {
		v.ObserveJob(testbuild.Job(fmt.Sprintf("ns%d", i%tenants), fmt.Sprint(i)).Group("g", 1, 1, "nvidia/gpu").Build())
	}
	return v
}

// BenchmarkUsageSnapshot is the cost of the usage snapshot one admission needs.
func BenchmarkUsageSnapshot(b *testing.B) {
	for _, allocs := range []int{1_000, 100_000} {
		for _, tenants := range []int{10, 1000} {
			b.Run(fmt.Sprintf("allocs=%d/tenants=%d", allocs, tenants), func(b *testing.B) {
				p := benchPolicy(b, tenants)
				v := benchView(allocs, tenants)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if u := v.UsageWithout(p, "ns0", "x"); u.Idle[policy.AllGPUs] < 0 {
						b.Fatal("negative idle")
					}
				}
			})
		}
	}
}
