package cluster

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// benchPolicy has n tenants, one namespace each.
func benchPolicy(b *testing.B, tenants int) *policy.Policy {
	src := "queue \"training\" { priority = 60 }\n"
	for i := 0; i < tenants; i++ {
		src += fmt.Sprintf("tenant \"t%d\" {\n namespaces = [\"ns%d\"]\n queues = [\"training\"]\n guaranteed = 8\n limit = 16\n}\n", i, i)
	}
	return testbuild.Policy(b, src)
}

// benchView has allocs one-GPU jobs spread over the tenants, and nodes of 8 GPUs.
func benchView(allocs, tenants int) *View {
	v := NewView(nil)
	for i := 0; i < allocs/8+1; i++ {
		v.ObserveNode(testbuild.Node(fmt.Sprint(i), "H100", 8, 0))
	}
	for i := 0; i < allocs; i++ {
		v.ObserveJob(testbuild.Job(fmt.Sprintf("ns%d", i%tenants), fmt.Sprint(i)).Group("g", 1, 1, "nvidia/gpu").Build())
	}
	return v
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

// BenchmarkAdmit is one admission decision as the proxy makes it: the
// tenant's usage snapshot, the decision and its reservation, for 10 and
// 1,000 tenants and 1,000 and 100,000 running jobs (the queue, however
// long, is not read to decide).
func BenchmarkAdmit(b *testing.B) {
	for _, allocs := range []int{1_000, 100_000} {
		for _, tenants := range []int{10, 1000} {
			b.Run(fmt.Sprintf("allocs=%d/tenants=%d", allocs, tenants), func(b *testing.B) {
				p := benchPolicy(b, tenants)
				v := benchView(allocs, tenants)
				job := admission.Job{ID: "new", Namespace: "ns0", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					d, res := v.Admit(p, job)
					if d.Outcome == admission.Reject {
						b.Fatal(d.Reason)
					}
					res.Release()
				}
			})
		}
	}
}

// BenchmarkFollowEvents is the view absorbing Nomad's event stream as the
// stream delivers it (each payload JSON): per 100 events, 90
// allocation updates of 1,000 running one-GPU jobs, 8 job registrations and
// 2 node updates, on 125 nodes of 8 GPUs. It reports events/s.
func BenchmarkFollowEvents(b *testing.B) {
	payload := func(key string, v any) map[string]json.RawMessage {
		raw, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		return map[string]json.RawMessage{key: raw}
	}
	var events []Event
	for i := 0; i < 1000; i++ {
		node := fmt.Sprint(i % 125)
		j := testbuild.Job("ns0", fmt.Sprint(i)).Group("g", 1, 1, "nvidia/gpu").ModifyIndex(uint64(10 * i)).Build()
		for k := 0; k < 9; k++ {
			a := testbuild.Alloc(fmt.Sprintf("a%d", i), "ns0", fmt.Sprint(i), node, uint64(10*i+k), fmt.Sprintf("%s-%d", node, i%8)).Build()
			a.Job = j // as Nomad's events carry it
			events = append(events, Event{Topic: api.TopicAllocation, Type: "AllocationUpdated", Payload: payload("Allocation", a)})
		}
		if i%10 < 8 {
			events = append(events, Event{Topic: api.TopicJob, Type: "JobRegistered", Payload: payload("Job", j)})
		} else {
			events = append(events, Event{Topic: api.TopicNode, Type: "NodeRegistration", Payload: payload("Node", testbuild.Node(node, testbuild.H100, 8, 0))})
		}
	}
	v := NewView(nil)
	var reverts []Revert
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := v.apply(&events[i%len(events)], &reverts); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkViewMemory is the heap the view holds for 100,000 running one-GPU
// jobs, each with its allocation, on 12,500 nodes of 8 GPUs (the memory goal
// is 300 MB for the whole broker at this size and 10,000 queued jobs).
func BenchmarkViewMemory(b *testing.B) {
	const jobs = 100_000
	var heap float64
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		v := benchView(jobs, 1000)
		for j := 0; j < jobs; j++ {
			node := fmt.Sprint(j / 8)
			v.ObserveAlloc(testbuild.Alloc(fmt.Sprintf("a%d", j), fmt.Sprintf("ns%d", j%1000), fmt.Sprint(j), node, uint64(j+1),
				fmt.Sprintf("%s-%d", node, j%8)).Build())
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
		runtime.KeepAlive(v)
	}
	b.ReportMetric(heap, "heap-MB")
}
