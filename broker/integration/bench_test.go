package integration

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/testcluster"
)

// BenchmarkRegisterThroughBroker registers the same one-GPU job straight to a
// real Nomad agent and through the broker, interleaved in one run, and reports
// the latency percentiles of both and their ratios.
func BenchmarkRegisterThroughBroker(b *testing.B) {
	consul := testcluster.StartConsul(b)
	n := testcluster.StartNomad(b, testcluster.NomadOptions{Name: "bench", Server: true, Client: true,
		ConsulAddr: consul.Addr, PluginConfig: `backend = "fake"`})
	n.WaitForNodes(b, 1)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "p.hcl"), policies)
	broker := testcluster.StartReleaseBroker(b, n, consul, dir)
	body := []byte(`{"Job":{"ID":"bench","Namespace":"vision","Type":"batch","Datacenters":["*"],"TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Driver":"raw_exec","Config":{"command":"/bin/sleep","args":["3600"]},
	  "Resources":{"CPU":20,"MemoryMB":16,"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]}]}}`)
	client := &http.Client{}
	send := func(base string) time.Duration {
		start := time.Now()
		resp, err := client.Post(base+"/v1/jobs", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s answered %s", base, resp.Status)
		}
		return time.Since(start)
	}
	send(broker.Addr) // the broker's first decision waits for nothing after this
	var direct, brokered []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, send(n.Addr))
		brokered = append(brokered, send(broker.Addr))
	}
	b.StopTimer()
	pct := func(ds []time.Duration, q float64) float64 {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[int(q*float64(len(ds)-1))].Microseconds())
	}
	d50, d99, b50, b99 := pct(direct, .5), pct(direct, .99), pct(brokered, .5), pct(brokered, .99)
	b.ReportMetric(d50, "nomad-p50-µs")
	b.ReportMetric(b50, "broker-p50-µs")
	b.ReportMetric(d99, "nomad-p99-µs")
	b.ReportMetric(b99, "broker-p99-µs")
	b.ReportMetric(b50/max(d50, 1), "p50-ratio")
	b.ReportMetric(b99/max(d99, 1), "p99-ratio")
}
