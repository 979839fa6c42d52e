package nomadjob_test

import (
	"net/url"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// benchJob is the one-GPU job BenchmarkRegister (broker/integration) sends:
// what a registration through the gate reads.
const benchJob = `{"Job":{"ID":"bench-broker","Namespace":"vision","Type":"batch","Datacenters":["*"],"TaskGroups":[{"Name":"g","Count":1,
	  "Tasks":[{"Name":"t","Driver":"raw_exec","Config":{"command":"/bin/sleep","args":["3600"]},
	  "Resources":{"CPU":20,"MemoryMB":16,"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]}]}}`

// BenchmarkReadRequest reads a registration as the gate does (as Nomad
// reads it, losslessly), then pins and encodes it as it is forwarded.
func BenchmarkReadRequest(b *testing.B) {
	body := []byte(benchJob)
	query := url.Values{}
	b.ReportAllocs()
	for b.Loop() {
		req, err := nomadjob.ReadRequest(nomadjob.Register, body, query)
		if err != nil {
			b.Fatal(err)
		}
		req.Pin()
		_ = req.Body()
	}
}
