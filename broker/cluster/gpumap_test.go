package cluster

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// Each GPU's state on the map: free, held (by whom, borrowed or not), idle
// below the threshold, unhealthy with the plugin's words, recovering; nodes
// by name with their drain and eligibility.
func TestTheMapShowsWhatEachGPUIsDoing(t *testing.T) {
	v := NewView(stamper.Verify)
	n1 := testbuild.Node("id-b", testbuild.H100, 4, 2)
	n1.Name, n1.NodePool = "gpu-b", "training"
	n1.NodeResources.Devices[0].Instances[4].HealthDescription = "XID 79: GPU has fallen off the bus"
	n1.NodeResources.Devices[0].Instances[5].HealthDescription = "recovering: healthy for 20s of 60s"
	n2 := testbuild.Node("id-a", testbuild.H100, 1, 0)
	n2.Name, n2.SchedulingEligibility = "gpu-a", api.NodeSchedulingIneligible
	n2.DrainStrategy = &api.DrainStrategy{}
	cpu := &api.Node{ID: "id-cpu", Name: "cpu", Status: api.NodeStatusReady}
	job := admitted(testbuild.Job("vision", "train").Group("g", 1, 2, "gpu"), admission.Decision{Outcome: admission.AdmitBorrowed, Tenant: "vision", Queue: "training", Priority: 20})
	child := testbuild.Job("vision", "batch/dispatch-1700000000-0a1b2c3d").Parent("batch").Group("g", 1, 1, "gpu").Build()
	v.Reset(Snapshot{Nodes: []*api.Node{n1, n2, cpu}, Jobs: []*api.Job{job, child},
		Allocs: []*api.Allocation{testbuild.Alloc("a1", "vision", "train", "id-b", 10, "id-b-0", "id-b-1").Build(),
			testbuild.Alloc("a2", "other", "web", "id-b", 11, "id-b-2").Build(),
			testbuild.Alloc("a3", "vision", *child.ID, "id-b", 12, "id-b-3").Build()}})
	v.SetSamples(map[string]Sample{"id-b-0": {Utilization: ptr(80.0)}, "id-b-1": {Utilization: ptr(80.0), TemperatureC: ptr(61.0)},
		"id-b-2": {Utilization: ptr(2.0)}})

	got := v.Map(5)
	if len(got) != 2 || got[0].Name != "gpu-a" || got[1].Name != "gpu-b" {
		t.Fatalf("nodes %+v, want gpu-a then gpu-b (no CPU-only node)", got)
	}
	if a := got[0]; !a.Draining || a.Eligible || len(a.GPUs) != 1 || a.GPUs[0].State != GPUFree {
		t.Errorf("gpu-a %+v, want draining, ineligible, one free GPU", a)
	}
	want := []MapGPU{
		{ID: "id-b-0", Model: testbuild.H100, State: GPUHeld, Namespace: "vision", Job: "train", Group: "g", Task: "t", Alloc: "a1", Tenant: "vision", Queue: "training", Borrowed: true, Utilization: ptr(80.0)},
		{ID: "id-b-1", Model: testbuild.H100, State: GPUHeld, Namespace: "vision", Job: "train", Group: "g", Task: "t", Alloc: "a1", Tenant: "vision", Queue: "training", Borrowed: true, Utilization: ptr(80.0), Temperature: ptr(61.0)},
		{ID: "id-b-2", Model: testbuild.H100, State: GPUIdle, Namespace: "other", Job: "web", Group: "g", Task: "t", Alloc: "a2", Utilization: ptr(2.0)},
		{ID: "id-b-3", Model: testbuild.H100, State: GPUHeld, Namespace: "vision", Job: "batch/dispatch-1700000000-0a1b2c3d", ParentJob: "batch", Group: "g", Task: "t", Alloc: "a3"},
		{ID: "id-b-4", Model: testbuild.H100, State: GPUUnhealthy, Health: "XID 79: GPU has fallen off the bus"},
		{ID: "id-b-5", Model: testbuild.H100, State: GPURecovering, Health: "recovering: healthy for 20s of 60s"},
	}
	for i := range want {
		want[i].PCIBusID = fmt.Sprintf("0000:%02x:00.0", i+1)
	}
	if b := got[1]; b.Pool != "training" || !b.Eligible || b.Draining || !reflect.DeepEqual(b.GPUs, want) {
		t.Errorf("gpu-b %+v\nwant GPUs %+v", b, want)
	}
	if nodes := v.GPUNodes(); !reflect.DeepEqual(nodes, []string{"id-a", "id-b"}) {
		t.Errorf("GPU nodes %v", nodes)
	}
}

func ptr[T any](v T) *T { return &v }
