package cluster

import (
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

func gpuJob(ns, id string, count, gpus int, model string, borrowed bool) *api.Job {
	name := "nvidia/gpu"
	if model != "" {
		name += "/" + model
	}
	return &api.Job{ID: ptr(id), Namespace: ptr(ns), Status: ptr("running"),
		Meta: map[string]string{nomadjob.MetaBorrowed: map[bool]string{true: "true", false: "false"}[borrowed]},
		TaskGroups: []*api.TaskGroup{{Name: ptr("g"), Count: ptr(count), Tasks: []*api.Task{{Resources: &api.Resources{
			Devices: []*api.RequestedDevice{{Name: name, Count: ptr(uint64(gpus))}}}}}}}}
}

func gpuNode(id string, ready bool, healthy, sick int) *api.Node {
	var inst []*api.NodeDevice
	for i := 0; i < healthy+sick; i++ {
		inst = append(inst, &api.NodeDevice{ID: id + string(rune('a'+i)), Healthy: i < healthy})
	}
	status := api.NodeStatusReady
	if !ready {
		status = api.NodeStatusDown
	}
	return &api.Node{ID: id, Status: status, NodeResources: &api.NodeResources{Devices: []*api.NodeDeviceResource{
		{Vendor: "nvidia", Type: "gpu", Name: "NVIDIA H100 80GB HBM3", Instances: inst}}}}
}

func TestUsageFollowsJobsAndNodes(t *testing.T) {
	p, diags := policy.Parse(map[string][]byte{"p.hcl": []byte(`
queue "training" { priority = 60 }
gpu_class "h100" { models = ["NVIDIA H100*"] }
tenant "vision" {
  namespaces = ["vision", "vision-dev"]
  queues = ["training"]
  guaranteed = 4
  limit = 8
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	v := NewView()
	v.ObserveNode(gpuNode("n1", true, 8, 0))
	v.ObserveNode(gpuNode("n2", true, 6, 2))  // two unhealthy GPUs are not capacity
	v.ObserveNode(gpuNode("n3", false, 8, 0)) // a down node is not capacity
	v.ObserveJob(gpuJob("vision", "a", 2, 2, "", false))
	v.ObserveJob(gpuJob("vision-dev", "b", 1, 3, "NVIDIA H100 80GB HBM3", true))
	v.ObserveJob(gpuJob("other", "c", 1, 1, "", false))

	u := v.Usage(p)
	vision := u.Tenants["vision"]
	if vision.Used[policy.AllGPUs] != 7 || vision.Used["h100"] != 3 || vision.Borrowed[policy.AllGPUs] != 3 {
		t.Errorf("vision usage wrong: %+v", vision)
	}
	if u.Idle[policy.AllGPUs] != 14-8 || u.MaxAlloc[policy.AllGPUs] != 8 || u.MaxAlloc["h100"] != 8 {
		t.Errorf("idle %v max %v", u.Idle, u.MaxAlloc)
	}
	if w := v.UsageWithout(p, "vision", "a"); w.Tenants["vision"].Used[policy.AllGPUs] != 3 || w.Idle[policy.AllGPUs] != 10 {
		t.Errorf("without job a: %+v idle %v", w.Tenants["vision"], w.Idle)
	}

	v.ObserveJob(gpuJob("vision", "a", 1, 2, "", false)) // a new version replaces the old demand
	stopped := gpuJob("vision-dev", "b", 1, 3, "", true)
	stopped.Stop = ptr(true)
	v.ObserveJob(stopped)
	v.ForgetJob("other", "c")
	v.ObserveNode(gpuNode("n2", true, 8, 0))
	u = v.Usage(p)
	if got := u.Tenants["vision"]; got.Used[policy.AllGPUs] != 2 || got.Borrowed[policy.AllGPUs] != 0 || u.Idle[policy.AllGPUs] != 14 {
		t.Errorf("after updates: %+v idle %v", got, u.Idle)
	}
}
