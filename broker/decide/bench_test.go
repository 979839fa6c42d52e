package decide_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// benchRegion is one region's view: 125 nodes of 8 GPUs, half of them held
// by 500 running 1-GPU jobs of the tenant.
func benchRegion(name string) *cluster.View {
	v := cluster.NewView(nil)
	v.SetRegion(name)
	for i := range 125 {
		v.ObserveNode(testbuild.Node(fmt.Sprintf("%s-%d", name, i), "H100", 8, 0))
	}
	for i := range 500 {
		v.ObserveJob(testbuild.Job("vision", fmt.Sprintf("%s-run-%d", name, i)).Group("g", 1, 1, "nvidia/gpu").Build())
	}
	return v
}

// BenchmarkDispatch is a 2-GPU job's admission sequence (Prepare and the
// decision, as the gate makes them, without its reservation) in one region
// when it names it, the baseline. It is measured too when the job leaves
// its region to the broker over 1, 3 and 10 regions of 1,000 GPUs each: the
// first region admits it under ordered, every region is decided on under
// best_fit. And for a job naming the broker's own region among 10, its
// tenant's usage read in each.
func BenchmarkDispatch(b *testing.B) {
	const src = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 100000
  limit      = 100000
}
`
	for _, c := range []struct {
		name     string
		regions  int
		auto     bool
		dispatch string
	}{{"named/regions=1", 1, false, ""}, {"auto/regions=1", 1, true, ""}, {"auto/regions=3", 3, true, ""}, {"auto/regions=10", 10, true, ""},
		{"auto/regions=3/best_fit", 3, true, "best_fit"}, {"auto/regions=10/best_fit", 10, true, "best_fit"},
		{"named/regions=10", 10, false, ""}} {
		b.Run(c.name, func(b *testing.B) {
			p := testbuild.Policy(b, src)
			if c.dispatch != "" {
				p = testbuild.Policy(b, src+"dispatch = \""+c.dispatch+"\"\n")
			}
			others := map[string]*cluster.View{}
			for i := 1; i < c.regions; i++ {
				others[fmt.Sprintf("r%d", i)] = benchRegion(fmt.Sprintf("r%d", i))
			}
			seq := &decide.Sequence{Cluster: cluster.NewRegions("r0", benchRegion(""), others), Enricher: enrich.Enricher{Clock: clock.Fixed(time.Now())}}
			job := testbuild.Job("vision", "new").Meta(nomadjob.MetaQueue, "training").Group("g", 1, 2, "nvidia/gpu")
			if c.auto {
				job.Meta(nomadjob.MetaRegion, nomadjob.RegionAuto)
			}
			body := []byte(job.Register())
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				req, err := nomadjob.ReadRequest(nomadjob.Register, body, nil)
				if err != nil {
					b.Fatal(err)
				}
				r, err := seq.Prepare(context.Background(), p, req, &versions{})
				if err != nil {
					b.Fatal(err)
				}
				if d, _ := seq.Decide(p, r.AdmissionJob(), decide.Preview); d.Outcome != admission.Admit {
					b.Fatal(d.Outcome, d.Reason)
				}
			}
		})
	}
}
