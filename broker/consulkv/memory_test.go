package consulkv

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// BenchmarkQueueMemory is the heap a queue pass holds for 10,000 queued jobs,
// each with a 2 KB register request, decoded from Consul's answer as List
// decodes it. The memory goal, 300 MB, is for the whole broker with 100,000
// allocations in its view and 10,000 jobs queued.
func BenchmarkQueueMemory(b *testing.B) {
	const queued = 10_000
	request := json.RawMessage(fmt.Sprintf(`{"Job":{"ID":"train","Namespace":"vision","Meta":{"note":%q},"TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Driver":"docker","Config":{"image":"pytorch"},"Resources":{"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]}]}}`,
		strings.Repeat("x", 1800)))
	pairs := make([]*consul.KVPair, queued)
	for i := range pairs {
		e := queue.Entry{ID: queue.NewID(), JobID: fmt.Sprintf("train-%d", i), Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1,
			Reason: "beyond tenant \"vision\"'s guarantee and only 0 GPUs are idle; queued until GPUs free", SubmittedBy: "alice",
			SubmittedAt: time.Now(), Request: request}
		v, err := json.Marshal(e)
		if err != nil {
			b.Fatal(err)
		}
		pairs[i] = &consul.KVPair{Key: "nomad-gpu/queue/" + e.ID, Value: v, ModifyIndex: uint64(i + 1)}
	}
	q := NewQueue(nil, "nomad-gpu/", nil)
	var heap float64
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		entries := make([]queue.Entry, 0, queued)
		for _, p := range pairs {
			e, err := q.r.decode(p)
			if err != nil {
				b.Fatal(err)
			}
			entries = append(entries, e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
		runtime.KeepAlive(entries)
	}
	b.ReportMetric(heap, "heap-MB")
}
