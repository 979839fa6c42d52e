package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

const src = `
queue "training" { priority = 60 }
gpu_class "h100" { models = ["` + testbuild.H100 + `"] }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = { h100 = 4 }
  limit      = { h100 = 6 }
}
`

func TestScrapeReportsGPUsTenantsAndQueues(t *testing.T) {
	view := cluster.NewView(nil)
	n1, n2 := testbuild.Node("n1", testbuild.H100, 7, 1), testbuild.Node("n2", testbuild.H100, 8, 0)
	n1.NodePool, n2.NodePool = "gpu", "gpu"
	n1.NodeResources.Devices[0].Instances[7].HealthDescription = "XID 79 critical error"
	view.Reset(cluster.Snapshot{Nodes: []*api.Node{n1, n2},
		Jobs:   []*api.Job{testbuild.Job("vision", "train").Group("g", 1, 3, "nvidia/gpu").Build()},
		Allocs: []*api.Allocation{testbuild.Alloc("a", "vision", "train", "n1", 5, "n1-0", "n1-1", "n1-7").Build()}})
	q := queuetest.NewMem(queue.Entry{ID: "e1", JobID: "waits", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 2})
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: view, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Queue: q})
	m.Admission(metrics.Submit, admission.Decision{Outcome: admission.Admit, Queue: "training"})
	m.Decision("idle-dev", "stop", "executed")
	m.GPUSeconds(map[usage.Key]usage.Seconds{{Tenant: "vision", Queue: "training", Class: "h100"}: {Allocated: 90, Busy: 60, Idle: 30}})

	// The job asks for any GPU ("nvidia/gpu"): it counts in no class.
	// n1: 8 GPUs, one sick and held (n1-7), two more held; n2: 8 free.
	// Free per node: n1 5, n2 8; the largest node has 8, so n1's 5 are fragmented.
	want := `
# HELP nomadgpu_gpus GPUs by node pool, model and state: total, healthy, unhealthy, allocated (held by running or pending allocations), free (healthy, unheld, on a schedulable node).
# TYPE nomadgpu_gpus gauge
nomadgpu_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",state="allocated"} 3
nomadgpu_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",state="free"} 13
nomadgpu_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",state="healthy"} 15
nomadgpu_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",state="total"} 16
nomadgpu_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",state="unhealthy"} 1
# HELP nomadgpu_unhealthy_gpus Unhealthy GPUs by node pool, model and reason class: xid, ecc, lost, recovering (waiting out its hysteresis), other.
# TYPE nomadgpu_unhealthy_gpus gauge
nomadgpu_unhealthy_gpus{model="NVIDIA H100 80GB HBM3",node_pool="gpu",reason="xid"} 1
# HELP nomadgpu_free_gpus_fragmented_ratio Share of free GPUs on nodes with fewer free than the most GPUs any node has (where the largest single-node request cannot go).
# TYPE nomadgpu_free_gpus_fragmented_ratio gauge
nomadgpu_free_gpus_fragmented_ratio 0.38461538461538464
# HELP nomadgpu_node_free_gpus Free GPUs per schedulable node.
# TYPE nomadgpu_node_free_gpus histogram
nomadgpu_node_free_gpus_bucket{le="0"} 0
nomadgpu_node_free_gpus_bucket{le="1"} 0
nomadgpu_node_free_gpus_bucket{le="2"} 0
nomadgpu_node_free_gpus_bucket{le="4"} 0
nomadgpu_node_free_gpus_bucket{le="8"} 2
nomadgpu_node_free_gpus_bucket{le="+Inf"} 2
nomadgpu_node_free_gpus_sum 13
nomadgpu_node_free_gpus_count 2
# HELP nomadgpu_tenant_gpus A tenant's GPUs: used, borrowed (of used, at the borrowing band), guaranteed, limit and over_limit (used above the limit, 0 within it), per GPU class ("all": every class).
# TYPE nomadgpu_tenant_gpus gauge
nomadgpu_tenant_gpus{gpu_class="all",kind="borrowed",tenant="vision"} 0
nomadgpu_tenant_gpus{gpu_class="all",kind="guaranteed",tenant="vision"} 4
nomadgpu_tenant_gpus{gpu_class="all",kind="limit",tenant="vision"} 6
nomadgpu_tenant_gpus{gpu_class="all",kind="over_limit",tenant="vision"} 0
nomadgpu_tenant_gpus{gpu_class="all",kind="used",tenant="vision"} 3
nomadgpu_tenant_gpus{gpu_class="h100",kind="guaranteed",tenant="vision"} 4
nomadgpu_tenant_gpus{gpu_class="h100",kind="limit",tenant="vision"} 6
nomadgpu_tenant_gpus{gpu_class="h100",kind="over_limit",tenant="vision"} 0
# HELP nomadgpu_queue_depth Jobs waiting in the broker's queue.
# TYPE nomadgpu_queue_depth gauge
nomadgpu_queue_depth{queue="training"} 1
# HELP nomadgpu_leader 1 while this broker is the leader (admits, runs the queue and reclaim).
# TYPE nomadgpu_leader gauge
nomadgpu_leader 1
# HELP nomadgpu_admissions_total GPU job decisions by source (submit: a request to the broker; queue: a queued job's turn), outcome (admit, admit-borrowed, queue, reject), the rule that decided (if one did) and queue.
# TYPE nomadgpu_admissions_total counter
nomadgpu_admissions_total{outcome="admit",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="admit",queue="training",rule="",source="submit"} 1
nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="submit"} 0
nomadgpu_admissions_total{outcome="queue",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="queue",queue="training",rule="",source="submit"} 0
# HELP nomadgpu_reclaim_decisions_total Reclaim decisions by rule, action and the state they reached (proposed, dry-run, executed, failed, cancelled).
# TYPE nomadgpu_reclaim_decisions_total counter
nomadgpu_reclaim_decisions_total{action="stop",rule="idle-dev",state="executed"} 1
# HELP nomadgpu_gpu_seconds_total GPU time held by running allocations (allocated), split into busy and idle (below usage.idle_below); tenant and queue empty for jobs the broker did not admit.
# TYPE nomadgpu_gpu_seconds_total counter
nomadgpu_gpu_seconds_total{gpu_class="h100",queue="training",state="allocated",tenant="vision"} 90
nomadgpu_gpu_seconds_total{gpu_class="h100",queue="training",state="busy",tenant="vision"} 60
nomadgpu_gpu_seconds_total{gpu_class="h100",queue="training",state="idle",tenant="vision"} 30
`
	names := []string{"nomadgpu_gpus", "nomadgpu_unhealthy_gpus", "nomadgpu_free_gpus_fragmented_ratio", "nomadgpu_node_free_gpus", "nomadgpu_tenant_gpus",
		"nomadgpu_queue_depth", "nomadgpu_leader", "nomadgpu_admissions_total", "nomadgpu_reclaim_decisions_total", "nomadgpu_gpu_seconds_total"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

func TestANilMetricsCountsNothing(t *testing.T) {
	var m *metrics.Metrics
	m.Admission(metrics.Queued, admission.Decision{Outcome: admission.Admit})
	m.Decision("r", "stop", "executed")
	m.GPUSeconds(map[usage.Key]usage.Seconds{{}: {Allocated: 1}})
}

func TestPreemptionsReclaimAndQueueWaits(t *testing.T) {
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: cluster.NewView(nil), Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Queue: queuetest.NewMem(),
		InBackoff: func() map[string]int { return map[string]int{"vision": 2, "not-a-tenant": 1} }})
	m.Preempted("vision", "training", 7200)
	m.Preempted("vision", "training", 3600)
	m.Reclaimed("idle-dev", "stop", 2)
	m.QueueWait("training", "admit", 90*time.Second)
	want := `
# HELP nomadgpu_preemptions_total Allocations of borrowed jobs that Nomad preempted, as the broker observed them.
# TYPE nomadgpu_preemptions_total counter
nomadgpu_preemptions_total{queue="training",tenant="vision"} 2
# HELP nomadgpu_preempted_gpu_seconds_total GPU-seconds of work lost to preemption: each preempted allocation's GPUs × the time since it started.
# TYPE nomadgpu_preempted_gpu_seconds_total counter
nomadgpu_preempted_gpu_seconds_total{queue="training",tenant="vision"} 10800
# HELP nomadgpu_reclaimed_gpus_total GPUs freed by executed reclaim decisions (stop, reschedule, requeue).
# TYPE nomadgpu_reclaimed_gpus_total counter
nomadgpu_reclaimed_gpus_total{action="stop",rule="idle-dev"} 2
# HELP nomadgpu_borrow_backoff_jobs Jobs held back from borrowing by their re-borrow backoff (policy borrowing { backoff, max_backoff }), by tenant.
# TYPE nomadgpu_borrow_backoff_jobs gauge
nomadgpu_borrow_backoff_jobs{tenant="vision"} 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "nomadgpu_preemptions_total",
		"nomadgpu_preempted_gpu_seconds_total", "nomadgpu_reclaimed_gpus_total", "nomadgpu_borrow_backoff_jobs"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Registry, "nomadgpu_queue_wait_seconds"); n != 3 {
		t.Errorf("queue wait series: %d, want 3 (training: admit, admit-borrowed, cancelled)", n)
	}
}

// Each sampled GPU's telemetry, labelled by node name and device id; a
// value the device does not report is left out. The price of a priced class.
func TestPerGPUTelemetryAndPrice(t *testing.T) {
	view := cluster.NewView(nil)
	n := testbuild.Node("n1", testbuild.H100, 2, 0)
	n.Name = "gpu-1"
	view.Reset(cluster.Snapshot{Nodes: []*api.Node{n}})
	f := func(v float64) *float64 { return &v }
	view.SetSamples(map[string]cluster.Sample{"n1-0": {Utilization: f(42), MemoryUsedMiB: f(1024), MemoryTotalMiB: f(81559), TemperatureC: f(55), PowerW: f(300)},
		"n1-1": {Utilization: f(0)}})
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: view, Queue: queuetest.NewMem(), Policies: testbuild.Fixed{P: testbuild.Policy(t, `
currency = "EUR"
gpu_class "h100" {
  models             = ["`+testbuild.H100+`"]
  price_per_gpu_hour = 2.5
}`)}})
	want := `
# HELP nomadgpu_gpu_utilization_percent A GPU's utilisation at its last sample (the leader reads every GPU node's stats from Nomad each reclaim period).
# TYPE nomadgpu_gpu_utilization_percent gauge
nomadgpu_gpu_utilization_percent{gpu="n1-0",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 42
nomadgpu_gpu_utilization_percent{gpu="n1-1",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 0
# HELP nomadgpu_gpu_memory_used_bytes A GPU's frame-buffer memory in use at its last sample.
# TYPE nomadgpu_gpu_memory_used_bytes gauge
nomadgpu_gpu_memory_used_bytes{gpu="n1-0",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 1.073741824e+09
# HELP nomadgpu_gpu_memory_total_bytes A GPU's frame-buffer memory.
# TYPE nomadgpu_gpu_memory_total_bytes gauge
nomadgpu_gpu_memory_total_bytes{gpu="n1-0",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 8.5520809984e+10
# HELP nomadgpu_gpu_temperature_celsius A GPU's temperature at its last sample.
# TYPE nomadgpu_gpu_temperature_celsius gauge
nomadgpu_gpu_temperature_celsius{gpu="n1-0",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 55
# HELP nomadgpu_gpu_power_watts A GPU's power draw at its last sample.
# TYPE nomadgpu_gpu_power_watts gauge
nomadgpu_gpu_power_watts{gpu="n1-0",model="NVIDIA H100 80GB HBM3",node="gpu-1"} 300
# HELP nomadgpu_gpu_price_per_hour What an allocated GPU of a class costs an hour (the policy's price_per_gpu_hour, in its currency): multiply nomadgpu_gpu_seconds_total by it for cost.
# TYPE nomadgpu_gpu_price_per_hour gauge
nomadgpu_gpu_price_per_hour{currency="EUR",gpu_class="h100"} 2.5
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "nomadgpu_gpu_utilization_percent", "nomadgpu_gpu_memory_used_bytes",
		"nomadgpu_gpu_memory_total_bytes", "nomadgpu_gpu_temperature_celsius", "nomadgpu_gpu_power_watts", "nomadgpu_gpu_price_per_hour"); err != nil {
		t.Fatal(err)
	}
}

func TestTheLeadersPassesAreCountedByLoopAndResult(t *testing.T) {
	m := metrics.New()
	m.Pass(metrics.LoopQueue, 250*time.Millisecond, nil)
	m.Pass(metrics.LoopQueue, 500*time.Millisecond, nil)
	m.Pass(metrics.LoopReclaim, 2*time.Second, errors.New("consul unreachable"))
	var none *metrics.Metrics
	none.Pass(metrics.LoopQueue, time.Second, nil) // no metrics: nothing, no panic
	want := `
# HELP nomadgpu_leader_passes_total Passes the leader's loops finished, by loop (queue, reclaim) and result (ok, error): a loop whose count stops rising is stuck.
# TYPE nomadgpu_leader_passes_total counter
nomadgpu_leader_passes_total{loop="queue",result="ok"} 2
nomadgpu_leader_passes_total{loop="reclaim",result="error"} 1
# HELP nomadgpu_leader_pass_seconds_total Time the leader's loops spent in their passes, by loop (queue, reclaim): its rate is the share of the time a loop is busy, which stays low while Nomad fails.
# TYPE nomadgpu_leader_pass_seconds_total counter
nomadgpu_leader_pass_seconds_total{loop="queue"} 0.75
nomadgpu_leader_pass_seconds_total{loop="reclaim"} 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "nomadgpu_leader_passes_total", "nomadgpu_leader_pass_seconds_total"); err != nil {
		t.Error(err)
	}
}

// A label's value is a name the policy has: 200 rejections naming queues of
// their own make one series, queue="other", not 200.
func TestLabelsHoldOnlyThePolicysNames(t *testing.T) {
	m := metrics.New()
	m.Admission(metrics.Submit, admission.Decision{Outcome: admission.Reject, Rule: admission.RuleQueueNotAllowed, Queue: "training"})
	m.Observe(metrics.Sources{Cluster: cluster.NewView(nil), Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Queue: queuetest.NewMem()})
	for i := 0; i < 200; i++ {
		m.Admission(metrics.Submit, admission.Decision{Outcome: admission.Reject, Rule: admission.RuleQueueNotAllowed, Queue: fmt.Sprintf("q-%d", i)})
	}
	m.Admission(metrics.Submit, admission.Decision{Outcome: admission.Admit, Queue: "training"})
	m.Admission(metrics.Submit, admission.Decision{Outcome: admission.Reject, Rule: admission.RuleUnmappedNamespace})
	m.Preempted("someone", "training", 60)
	m.GPUSeconds(map[usage.Key]usage.Seconds{{Tenant: "vision", Queue: "made-up", Class: "b200"}: {Allocated: 1}})
	want := `
# HELP nomadgpu_admissions_total GPU job decisions by source (submit: a request to the broker; queue: a queued job's turn), outcome (admit, admit-borrowed, queue, reject), the rule that decided (if one did) and queue.
# TYPE nomadgpu_admissions_total counter
nomadgpu_admissions_total{outcome="admit",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="admit",queue="training",rule="",source="submit"} 1
nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="submit"} 0
nomadgpu_admissions_total{outcome="queue",queue="training",rule="",source="queue"} 0
nomadgpu_admissions_total{outcome="queue",queue="training",rule="",source="submit"} 0
nomadgpu_admissions_total{outcome="reject",queue="",rule="unmapped-namespace",source="submit"} 1
nomadgpu_admissions_total{outcome="reject",queue="other",rule="queue-not-allowed",source="submit"} 201
# HELP nomadgpu_preemptions_total Allocations of borrowed jobs that Nomad preempted, as the broker observed them.
# TYPE nomadgpu_preemptions_total counter
nomadgpu_preemptions_total{queue="training",tenant="other"} 1
nomadgpu_preemptions_total{queue="training",tenant="vision"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "nomadgpu_admissions_total", "nomadgpu_preemptions_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry, "nomadgpu_gpu_seconds_total"); n != 6 {
		t.Errorf("gpu seconds series: %d, want 6 (allocated, busy, idle of vision/other/other, and at 0 of vision/training/h100)", n)
	}
}

// Every counter keyed by the policy's names has its series at 0 from the
// start, and a reload adds those of the names it brings: rate() and
// increase() then see their first rise (a tenant's first second over its
// limit). A removed name's series stays.
func TestEveryNameThePolicyGivesStartsAtZero(t *testing.T) {
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: cluster.NewView(nil), Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Queue: queuetest.NewMem()})
	want := `
# HELP nomadgpu_tenant_over_limit_gpu_seconds_total GPU-seconds a tenant held above its limit (raised by approvals in force) or above a region cap, as Nomad's allocations in its namespaces show them, admitted by the broker or not.
# TYPE nomadgpu_tenant_over_limit_gpu_seconds_total counter
nomadgpu_tenant_over_limit_gpu_seconds_total{tenant="vision"} 0
# HELP nomadgpu_preempted_gpu_seconds_total GPU-seconds of work lost to preemption: each preempted allocation's GPUs × the time since it started.
# TYPE nomadgpu_preempted_gpu_seconds_total counter
nomadgpu_preempted_gpu_seconds_total{queue="training",tenant="vision"} 0
`
	names := []string{"nomadgpu_tenant_over_limit_gpu_seconds_total", "nomadgpu_preempted_gpu_seconds_total"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry, "nomadgpu_allocations_total"); n != 6 {
		t.Errorf("allocation series: %d, want vision/training's 6 (complete, failed, lost, stopped, preempted, retried)", n)
	}

	m.Named(testbuild.Policy(t, src+`
queue "dev" { priority = 40 }
tenant "search" {
  namespaces = ["search"]
  queues     = ["dev"]
  guaranteed = 2
  limit      = 2
}
`))
	m.OverLimit(map[string]float64{"vision": 3})
	want = `
# HELP nomadgpu_tenant_over_limit_gpu_seconds_total GPU-seconds a tenant held above its limit (raised by approvals in force) or above a region cap, as Nomad's allocations in its namespaces show them, admitted by the broker or not.
# TYPE nomadgpu_tenant_over_limit_gpu_seconds_total counter
nomadgpu_tenant_over_limit_gpu_seconds_total{tenant="search"} 0
nomadgpu_tenant_over_limit_gpu_seconds_total{tenant="vision"} 3
# HELP nomadgpu_preempted_gpu_seconds_total GPU-seconds of work lost to preemption: each preempted allocation's GPUs × the time since it started.
# TYPE nomadgpu_preempted_gpu_seconds_total counter
nomadgpu_preempted_gpu_seconds_total{queue="dev",tenant="search"} 0
nomadgpu_preempted_gpu_seconds_total{queue="training",tenant="vision"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// Every sampled GPU under dcgm-exporter's names and labels, with its
// holder's namespace and tenant when the policy has them, and its
// allocation, job (a periodic child's parent), task group and task. A
// shared GPU once per holder, a MIG instance with its GPU's index and UUID.
func TestGPUTelemetryUnderDCGMsNames(t *testing.T) {
	const held, held2 = "5c2b6a9e-0d1f-4c1e-9d4a-7b2e8f3a1c00", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	n := testbuild.Node("n1", testbuild.H100, 2, 0)
	n.Name = "gpu-1"
	testbuild.SharedGPUs(n, testbuild.H100, 1, 2)
	for _, d := range n.NodeResources.Devices[1].Instances {
		d.Locality = &api.NodeDeviceLocality{PciBusID: "0000:3b:00.0"}
	}
	n.NodeResources.Devices = append(n.NodeResources.Devices, &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu",
		Name: testbuild.H100 + " MIG 3g.40gb", Instances: []*api.NodeDevice{{ID: "MIG-a", Healthy: true,
			Locality: &api.NodeDeviceLocality{PciBusID: "0000:4c:00.0"}}}})
	view := cluster.NewView(nil)
	// serve's run of 1700000000 counts under serve, its parent.
	child := testbuild.Job("vision", "serve/periodic-1700000000").Parent("serve").Group("g", 1, 1, "gpu").Build()
	view.Reset(cluster.Snapshot{Nodes: []*api.Node{n}, Jobs: []*api.Job{child}, Allocs: []*api.Allocation{
		testbuild.Alloc(held, "vision", "train", "n1", 10, "n1-0").Build(),
		testbuild.Alloc("not-a-uuid", "other", "web", "n1", 11, "n1-shared-0-0").Build(),
		testbuild.Alloc(held2, "vision", *child.ID, "n1", 12, "n1-shared-0-1").Build()}})
	f := func(v float64) *float64 { return &v }
	whole := func(i float64, uuid string) cluster.Sample {
		return cluster.Sample{Utilization: f(42), MemoryUsedMiB: f(1024), MemoryTotalMiB: f(81559), TemperatureC: f(55), PowerW: f(300),
			SMClockMHz: f(1980), MemClockMHz: f(2619), LastXID: f(0), ECCCorrected: f(3), ECCUncorrected: f(0), GPUIndex: f(i), GPUUUID: uuid,
			MemCopyUtil: f(17), EncoderUtil: f(4), DecoderUtil: f(9), DriverVersion: "550.54.15"}
	}
	shared := whole(2, "GPU-s")
	shared.LastXID = f(79)
	gpu0 := whole(0, "GPU-0")
	gpu0.TensorActive = f(25) // GPM: a Hopper GPU's; GPU-s has none
	view.SetSamples(map[string]cluster.Sample{"n1-0": gpu0,
		"n1-1":          {Utilization: f(0)}, // a plugin that does not say which GPU it is: not reported
		"n1-shared-0-0": shared, "n1-shared-0-1": shared,
		"MIG-a": {MemoryUsedMiB: f(512), MemoryTotalMiB: f(40960), GPUIndex: f(3), GPUUUID: "GPU-m", MIGInstance: f(2), MIGProfile: "3g.40gb",
			DriverVersion: "550.54.15", TensorActive: f(40)}})
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: view, Queue: queuetest.NewMem(), Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}})
	labels := func(gpu, uuid, bus, profile, instance, ns, tenant, alloc, job string) string {
		dev, group, task := "", "", ""
		if gpu != "" {
			dev = "nvidia" + gpu
		}
		if job != "" {
			group, task = "g", "t"
		}
		return fmt.Sprintf(`{DCGM_FI_DRIVER_VERSION="550.54.15",GPU_I_ID=%q,GPU_I_PROFILE=%q,Hostname="gpu-1",UUID=%q,alloc_id=%q,device=%q,gpu=%q,modelName=%q,namespace=%q,nomad_job=%q,pci_bus_id=%q,task=%q,task_group=%q,tenant=%q}`,
			instance, profile, uuid, alloc, dev, gpu, testbuild.H100, ns, job, bus, task, group, tenant)
	}
	w0 := labels("0", "GPU-0", "00000000:01:00.0", "", "", "vision", "vision", held, "train")
	ws := labels("2", "GPU-s", "00000000:3B:00.0", "", "", "", "", "", "")
	wv := labels("2", "GPU-s", "00000000:3B:00.0", "", "", "vision", "vision", held2, "serve")
	mig := labels("3", "GPU-m", "00000000:4C:00.0", "3g.40gb", "2", "", "", "", "")
	var want strings.Builder
	for _, f := range []struct {
		name, help, kind string
		v0, vs           string
		mig              string
	}{
		{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", "42", "42", ""},
		{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge", "1024", "1024", "512"},
		{"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", "80535", "80535", "40448"},
		{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", "55", "55", ""},
		{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", "300", "300", ""},
		{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", "1980", "1980", ""},
		{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", "2619", "2619", ""},
		{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge", "17", "17", ""},
		{"DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "gauge", "4", "4", ""},
		{"DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "gauge", "9", "9", ""},
		{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Share of time any tensor pipe was active (a ratio, 0 to 1).", "gauge", "0.25", "", "0.4"},
		{"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none since the plugin started).", "gauge", "0", "79", ""},
		{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors (corrected, since the driver loaded).", "counter", "3", "3", ""},
		{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors (uncorrected, since the driver loaded).", "counter", "0", "0", ""},
	} {
		fmt.Fprintf(&want, "# HELP %s %s (DCGM's name; from the device plugin's stats through Nomad, at the leader's last sample)\n# TYPE %s %s\n",
			f.name, f.help, f.name, f.kind)
		l0, ls, lv := w0, ws, wv
		if f.name == "DCGM_FI_DEV_XID_ERRORS" { // and what the XID means
			l0 = strings.Replace(w0, ",gpu=", `,err_code="0",err_msg="No error",gpu=`, 1)
			ls = strings.Replace(ws, ",gpu=", `,err_code="79",err_msg="GPU has fallen off the bus",gpu=`, 1)
			lv = strings.Replace(wv, ",gpu=", `,err_code="79",err_msg="GPU has fallen off the bus",gpu=`, 1)
		}
		fmt.Fprintf(&want, "%s%s %s\n", f.name, l0, f.v0)
		if f.vs != "" {
			fmt.Fprintf(&want, "%s%s %s\n%s%s %s\n", f.name, ls, f.vs, f.name, lv, f.vs)
		}
		if f.mig != "" {
			fmt.Fprintf(&want, "%s%s %s\n", f.name, mig, f.mig)
		}
	}
	names := []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
		"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
		"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want.String()), names...); err != nil {
		t.Fatal(err)
	}
}

// A scale-up is timed from its admission to its first new allocation
// running, both as their clocks tell: a test's clock, or the daemon's.
func TestAScaleUpIsTimedToItsFirstAllocationRunning(t *testing.T) {
	m := metrics.New()
	m.Observe(metrics.Sources{Cluster: cluster.NewView(nil), Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}, Queue: queuetest.NewMem()})
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m.ScaledUp("vision", "train", "vision", "training", t0)
	m.AllocEvent(cluster.AllocEvent{Namespace: "vision", Job: "train", Tenant: "vision", Queue: "training", Event: "running", At: t0.Add(3 * time.Second)})
	m.AllocEvent(cluster.AllocEvent{Namespace: "vision", Job: "train", Tenant: "vision", Queue: "training", Event: "running", At: t0.Add(9 * time.Second)})
	got, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range got {
		if f.GetName() != "nomadgpu_scale_up_seconds" {
			continue
		}
		if h := f.GetMetric()[0].GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 3 {
			t.Errorf("scale-ups timed: %d, %g s in all; want one of 3 s (the second allocation is not the first)", h.GetSampleCount(), h.GetSampleSum())
		}
		return
	}
	t.Errorf("no nomadgpu_scale_up_seconds")
}
