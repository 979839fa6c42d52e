package cluster

import (
	"fmt"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

func ptr[T any](v T) *T { return &v }

// benchPolicy has n tenants, one namespace each.
func benchPolicy(b *testing.B, tenants int) *policy.Policy {
	src := "queue \"training\" { priority = 60 }\n"
	for i := 0; i < tenants; i++ {
		src += fmt.Sprintf("tenant \"t%d\" {\n namespaces = [\"ns%d\"]\n queues = [\"training\"]\n guaranteed = 8\n limit = 16\n}\n", i, i)
	}
	p, diags := policy.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	return p
}

// benchView has allocs one-GPU jobs spread over the tenants, and nodes of 8 GPUs.
func benchView(allocs, tenants int) *View {
	v := NewView()
	for i := 0; i < allocs/8+1; i++ {
		v.ObserveNode(&api.Node{ID: fmt.Sprint(i), Status: api.NodeStatusReady, NodeResources: &api.NodeResources{
			Devices: []*api.NodeDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "H100", Instances: make8()}}}})
	}
	for i := 0; i < allocs; i++ {
		v.ObserveJob(&api.Job{ID: ptr(fmt.Sprint(i)), Namespace: ptr(fmt.Sprintf("ns%d", i%tenants)), TaskGroups: []*api.TaskGroup{{
			Name: ptr("g"), Count: ptr(1), Tasks: []*api.Task{{Resources: &api.Resources{
				Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(1))}}}}}}}})
	}
	return v
}

func make8() []*api.NodeDevice {
	out := make([]*api.NodeDevice, 8)
	for i := range out {
		out[i] = &api.NodeDevice{ID: fmt.Sprint(i), Healthy: true}
	}
	return out
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
