package usage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// BenchmarkSample is one right-sizing sample of a reclaim pass: 100
// allocations on 10 nodes (the baseline), and 10,000 on 1,000 nodes of 8 GPUs.
func BenchmarkSample(b *testing.B) {
	for _, nodes := range []int{10, 1000} {
		b.Run(fmt.Sprintf("allocs=%d/nodes=%d", nodes*10, nodes), func(b *testing.B) {
			var allocs []reclaim.Alloc
			gpus := map[string]reclaim.GPU{}
			for n := 0; n < nodes; n++ {
				for i := 0; i < 8; i++ {
					gpus[fmt.Sprintf("n%d-g%d", n, i)] = reclaim.GPU{Utilization: float64((n + i) % 10), Healthy: true}
				}
				for a := 0; a < 10; a++ {
					allocs = append(allocs, running(fmt.Sprintf("n%d-a%d", n, a), fmt.Sprintf("job-%d", (n*10+a)/4), fmt.Sprintf("n%d-g%d", n, a%8)))
				}
			}
			tab := usage.NewProfiles()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tab.Sample(t0.Add(time.Duration(i)*time.Second), allocs, gpus, 5)
			}
		})
	}
}
