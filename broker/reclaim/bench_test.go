package reclaim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// BenchmarkPass is one reclaim pass under five rules over recorded samples:
// 100 allocations on 10 nodes (the baseline), and 10,000 on 1,000 nodes of 8
// GPUs (goal: under 50 ms a pass).
func BenchmarkPass(b *testing.B) {
	p := examplePolicy(b)
	for _, nodes := range []int{10, 1000} {
		b.Run(fmt.Sprintf("allocs=%d/nodes=%d", nodes*10, nodes), func(b *testing.B) {
			var allocs []reclaim.Alloc
			gpus := map[string]reclaim.GPU{}
			for n := 0; n < nodes; n++ {
				for i := 0; i < 8; i++ {
					gpus[fmt.Sprintf("n%d-g%d", n, i)] = reclaim.GPU{Utilization: float64((n + i) % 10), Healthy: (n+i)%97 != 0}
				}
				// 10 allocations of one GPU a node (the last two share ids with the
				// first: the pass costs per allocation and GPU, not per distinct id).
				for a := 0; a < 10; a++ {
					al := dev(fmt.Sprintf("n%d-a%d", n, a), fmt.Sprintf("job-%d", (n*10+a)/4), fmt.Sprintf("n%d-g%d", n, a%8))
					al.Admitted = (n+a)%50 != 0
					al.Restarts = []time.Time{t0.Add(-time.Minute)}
					allocs = append(allocs, al)
				}
			}
			e := reclaim.New()
			e.Pass(t0, p.ReclaimRules(), allocs, gpus)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				e.Pass(t0.Add(time.Duration(i+1)*time.Second), p.ReclaimRules(), allocs, gpus)
			}
		})
	}
}
