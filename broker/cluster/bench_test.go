package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

// BenchmarkFollowEvents is the view absorbing Nomad's event stream end to
// end: frames of 10 events read from the stream's bytes as nomadapi reads
// them (Frames), each event's change made. Per 100 events: 90
// allocation updates of 1,000 running one-GPU jobs (each carrying its job,
// as Nomad's do), 8 job registrations and 2 node updates, on 125 nodes of 8
// GPUs. It reports events/s.
func BenchmarkFollowEvents(b *testing.B) {
	type event struct {
		Topic   api.Topic
		Type    string
		Index   uint64
		Payload map[string]any
	}
	var events []event
	for i := 0; i < 1000; i++ {
		node := fmt.Sprint(i % 125)
		j := testbuild.Job("ns0", fmt.Sprint(i)).Group("g", 1, 1, "nvidia/gpu").ModifyIndex(uint64(10 * i)).Build()
		for k := 0; k < 9; k++ {
			a := testbuild.Alloc(fmt.Sprintf("a%d", i), "ns0", fmt.Sprint(i), node, uint64(10*i+k), fmt.Sprintf("%s-%d", node, i%8)).Build()
			a.Job = j // as Nomad's events carry it
			events = append(events, event{api.TopicAllocation, "AllocationUpdated", uint64(10*i + k), map[string]any{"Allocation": a}})
		}
		if i%10 < 8 {
			events = append(events, event{api.TopicJob, "JobRegistered", uint64(10*i + 9), map[string]any{"Job": j}})
		} else {
			events = append(events, event{api.TopicNode, "NodeRegistration", uint64(10*i + 9), map[string]any{"Node": testbuild.Node(node, testbuild.H100, 8, 0)}})
		}
	}
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	for i := 0; i < len(events); i += 10 {
		if err := enc.Encode(map[string]any{"Index": events[i+9].Index, "Events": events[i : i+10]}); err != nil {
			b.Fatal(err)
		}
	}
	v := NewView(nil)
	var reverts []Revert
	b.ReportAllocs()
	b.ResetTimer()
	for applied := 0; applied < b.N; {
		frames := NewFrames(bytes.NewReader(stream.Bytes()))
		for applied < b.N {
			var frame Events
			if err := frames.Next(&frame); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			if err := v.applyBatch(frame.Events, &reverts); err != nil {
				b.Fatal(err)
			}
			applied += len(frame.Events)
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
