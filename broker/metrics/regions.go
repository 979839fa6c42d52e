package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Regions are the Nomad regions a broker governs, for the series split by
// region (cluster.Regions).
type Regions interface {
	// Names are the regions, the broker's own first, as its broker.hcl
	// and Nomad name them: the region label's values.
	Names() []string
	In(region string) (*cluster.View, string, bool)
	Unreachable(region string) (time.Time, string)
	Drained(region string) string
}

var (
	regionGPUsDesc = prometheus.NewDesc("nomadgpu_region_gpus",
		"nomadgpu_gpus of one region (a broker governing several): GPUs by region, node pool, model and state.",
		[]string{"region", "node_pool", "model", "state"}, nil)
	regionTenantDesc = prometheus.NewDesc("nomadgpu_region_tenant_gpus",
		"A tenant's GPUs in one region (a broker governing several): used, borrowed (of used), and limit where the tenant caps the region (region \"<name>\" { limit }), per GPU class (\"all\": every class); guarantees and limits count over all regions (nomadgpu_tenant_gpus).",
		[]string{"region", "tenant", "gpu_class", "kind"}, nil)
	regionReachableDesc = prometheus.NewDesc("nomadgpu_region_reachable",
		"1 while the broker follows the region, 0 from its first failure to follow it (its jobs stay charged for region_lost_timeout).",
		[]string{"region"}, nil)
	regionDrainedDesc = prometheus.NewDesc("nomadgpu_region_drained",
		"1 while the region is drained (gpu-broker region drain): no new work goes there.", []string{"region"}, nil)
	regionQueueDesc = prometheus.NewDesc("nomadgpu_region_queue_depth",
		"Jobs waiting in the broker's queue by the region they name, \"auto\" for those whose region the broker chooses (a broker governing several).",
		[]string{"region"}, nil)
	regionDescs = []*prometheus.Desc{regionGPUsDesc, regionTenantDesc, regionReachableDesc, regionDrainedDesc, regionQueueDesc}
)

// regionQueues reports the queue's depth by region, when the broker governs
// several: each governed region and "auto", 0 too (an entry queued before
// entries had a region is in none).
func (c *scrape) regionQueues(ch chan<- prometheus.Metric, entries []queue.Entry) {
	r := c.src.Regions
	if r == nil || len(r.Names()) < 2 {
		return
	}
	depth := map[string]int{queue.RegionAuto: 0}
	for _, name := range r.Names() {
		depth[name] = 0
	}
	for _, e := range entries {
		if _, ok := depth[e.Region]; ok {
			depth[e.Region]++
		}
	}
	for region, n := range depth {
		ch <- prometheus.MustNewConstMetric(regionQueueDesc, prometheus.GaugeValue, float64(n), region)
	}
}

// regions reports the region series, when the broker governs several.
func (c *scrape) regions(ch chan<- prometheus.Metric, p *policy.Policy) {
	r := c.src.Regions
	if r == nil || len(r.Names()) < 2 {
		return
	}
	for _, name := range r.Names() {
		v, _, _ := r.In(name)
		for k, s := range byPoolAndModel(v.Inventory()) {
			for state, n := range gpuStates(s) {
				ch <- prometheus.MustNewConstMetric(regionGPUsDesc, prometheus.GaugeValue, float64(n), name, k.pool, k.model, state)
			}
		}
		u := v.UsageWithout(p, "", "")
		for tenant, t := range p.Tenants {
			tu := u.Tenants[tenant]
			kinds := map[string]policy.Quota{"used": tu.Used, "borrowed": tu.Borrowed}
			if limit, ok := t.RegionLimits[name]; ok {
				kinds["limit"] = policy.Quota{policy.AllGPUs: limit}
			}
			for kind, q := range kinds {
				ch <- prometheus.MustNewConstMetric(regionTenantDesc, prometheus.GaugeValue, q.Total(), name, tenant, "all", kind)
				for class, n := range q {
					if class != policy.AllGPUs {
						ch <- prometheus.MustNewConstMetric(regionTenantDesc, prometheus.GaugeValue, n, name, tenant, class, kind)
					}
				}
			}
		}
		since, _ := r.Unreachable(name)
		ch <- prometheus.MustNewConstMetric(regionReachableDesc, prometheus.GaugeValue, map[bool]float64{true: 1}[since.IsZero()], name)
		ch <- prometheus.MustNewConstMetric(regionDrainedDesc, prometheus.GaugeValue, map[bool]float64{true: 1}[r.Drained(name) != ""], name)
	}
}
