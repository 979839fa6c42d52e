package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// A broker governing two regions splits GPUs and tenants by region, with a
// tenant's cap in a region as its limit there, and says which region it
// follows and which is drained. The series over all regions stay as they are.
func TestSeriesAreSplitByRegion(t *testing.T) {
	east, west := cluster.NewView(nil), cluster.NewView(nil)
	west.SetRegion("west")
	east.ObserveNode(testbuild.Node("e1", testbuild.H100, 4, 0))
	west.ObserveNode(testbuild.Node("w1", testbuild.H100, 2, 0))
	west.ObserveJob(testbuild.Job("vision", "train").Group("g", 1, 2, "nvidia/gpu/"+testbuild.H100).Build())
	r := cluster.NewRegions("east", east, map[string]*cluster.View{"west": west})
	r.SetDrained(map[string]string{"west": "by ops"})
	p := testbuild.Policy(t, strings.Replace(src, "  limit      = { h100 = 6 }\n", "  limit      = { h100 = 6 }\n  region \"west\" {\n    limit = 2\n  }\n", 1))
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: r, Regions: r, Policies: testbuild.Fixed{P: p}, Queue: queuetest.NewMem(
		queue.Entry{ID: "e1", JobID: "a", Namespace: "vision", Tenant: "vision", Queue: "training", Region: "auto", Demand: 1},
		queue.Entry{ID: "e2", JobID: "w", Namespace: "vision", Tenant: "vision", Queue: "training", Region: "west", Demand: 1},
		queue.Entry{ID: "e3", JobID: "old", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1})})
	want := `
# HELP nomadgpu_region_drained 1 while the region is drained (gpu-broker region drain): no new work goes there.
# TYPE nomadgpu_region_drained gauge
nomadgpu_region_drained{region="east"} 0
nomadgpu_region_drained{region="west"} 1
# HELP nomadgpu_region_queue_depth Jobs waiting in the broker's queue by the region they name, "auto" for those whose region the broker chooses (a broker governing several).
# TYPE nomadgpu_region_queue_depth gauge
nomadgpu_region_queue_depth{region="auto"} 1
nomadgpu_region_queue_depth{region="east"} 0
nomadgpu_region_queue_depth{region="west"} 1
# HELP nomadgpu_region_reachable 1 while the broker follows the region, 0 from its first failure to follow it (its jobs stay charged for region_lost_timeout).
# TYPE nomadgpu_region_reachable gauge
nomadgpu_region_reachable{region="east"} 1
nomadgpu_region_reachable{region="west"} 1
# HELP nomadgpu_region_tenant_gpus A tenant's GPUs in one region (a broker governing several): used, borrowed (of used), and limit where the tenant caps the region (region "<name>" { limit }), per GPU class ("all": every class); guarantees and limits count over all regions (nomadgpu_tenant_gpus).
# TYPE nomadgpu_region_tenant_gpus gauge
nomadgpu_region_tenant_gpus{gpu_class="all",kind="borrowed",region="east",tenant="vision"} 0
nomadgpu_region_tenant_gpus{gpu_class="all",kind="borrowed",region="west",tenant="vision"} 0
nomadgpu_region_tenant_gpus{gpu_class="all",kind="limit",region="west",tenant="vision"} 2
nomadgpu_region_tenant_gpus{gpu_class="all",kind="used",region="east",tenant="vision"} 0
nomadgpu_region_tenant_gpus{gpu_class="all",kind="used",region="west",tenant="vision"} 2
nomadgpu_region_tenant_gpus{gpu_class="h100",kind="used",region="west",tenant="vision"} 2
# HELP nomadgpu_tenant_gpus A tenant's GPUs: used, borrowed (of used, at the borrowing band), guaranteed, limit and over_limit (used above the limit, 0 within it), per GPU class ("all": every class).
# TYPE nomadgpu_tenant_gpus gauge
nomadgpu_tenant_gpus{gpu_class="all",kind="borrowed",tenant="vision"} 0
nomadgpu_tenant_gpus{gpu_class="all",kind="guaranteed",tenant="vision"} 4
nomadgpu_tenant_gpus{gpu_class="all",kind="limit",tenant="vision"} 6
nomadgpu_tenant_gpus{gpu_class="all",kind="over_limit",tenant="vision"} 0
nomadgpu_tenant_gpus{gpu_class="all",kind="used",tenant="vision"} 2
nomadgpu_tenant_gpus{gpu_class="h100",kind="guaranteed",tenant="vision"} 4
nomadgpu_tenant_gpus{gpu_class="h100",kind="limit",tenant="vision"} 6
nomadgpu_tenant_gpus{gpu_class="h100",kind="over_limit",tenant="vision"} 0
nomadgpu_tenant_gpus{gpu_class="h100",kind="used",tenant="vision"} 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "nomadgpu_region_drained", "nomadgpu_region_queue_depth", "nomadgpu_region_reachable",
		"nomadgpu_region_tenant_gpus", "nomadgpu_tenant_gpus"); err != nil {
		t.Error(err)
	}
	gpus, err := testutil.GatherAndCount(m.Registry, "nomadgpu_region_gpus")
	if err != nil || gpus != 10 {
		t.Errorf("nomadgpu_region_gpus: %d series (%v), want 5 states in each of 2 regions", gpus, err)
	}
	one := metrics.New()
	one.Observe(metrics.Sources{Cluster: east, Regions: cluster.NewRegions("east", east, nil), Policies: testbuild.Fixed{P: p}, Queue: queuetest.NewMem()})
	if n, err := testutil.GatherAndCount(one.Registry, "nomadgpu_region_gpus", "nomadgpu_region_tenant_gpus", "nomadgpu_region_reachable", "nomadgpu_region_queue_depth"); err != nil || n != 0 {
		t.Errorf("one region: %d region series (%v), want none", n, err)
	}
}
