package sim_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/sim"
)

// BenchmarkSimulate replays a Philly-like workload on 10,000 GPUs (ten
// tenants, testdata/ten-tenants) in each mode; SIM_BENCH_JOBS sets the jobs
// (default 100,000; the goal is 1,000,000 in under 2 minutes).
func BenchmarkSimulate(b *testing.B) {
	jobs := 100_000
	if n, err := strconv.Atoi(os.Getenv("SIM_BENCH_JOBS")); err == nil {
		jobs = n
	}
	p, diags := policyhcl.LoadDir("testdata/ten-tenants", 10_000)
	if p == nil {
		b.Fatal(diags)
	}
	nodes := []sim.NodeGroup{{Model: "NVIDIA H100 80GB HBM3", GPUs: 8, Count: 1250}}
	work, err := sim.Generate(p, nodes, sim.Generator{Trace: sim.Philly, Jobs: jobs, Seed: 1, Load: 1.0})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range sim.Modes {
		b.Run(fmt.Sprintf("mode=%s/jobs=%d", m, jobs), func(b *testing.B) {
			var res *sim.Result
			for i := 0; i < b.N; i++ {
				if res, err = sim.Run(work, sim.Options{Policy: p, Nodes: nodes, Mode: m}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(jobs)*float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
			b.ReportMetric(100*res.Allocation, "allocation-%")
		})
	}
}
