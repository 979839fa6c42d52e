package sim

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// The passes that order only the entries they can reach admit exactly what
// passes ordering the whole queue admit.
func TestBoundedPassesDecideAsWholeQueues(t *testing.T) {
	// testdata/ten-tenants at a tenth of its size.
	src, err := os.ReadFile("testdata/ten-tenants/policy.hcl")
	if err != nil {
		t.Fatal(err)
	}
	scaled := strings.NewReplacer("guaranteed = 1000", "guaranteed = 80", "limit      = 10000", "limit      = 800").Replace(string(src))
	p, diags := policyhcl.Parse(map[string][]byte{"policy.hcl": []byte(scaled)}, 800)
	if p == nil {
		t.Fatal(diags)
	}
	nodes := []NodeGroup{{Model: "H100", GPUs: 8, Count: 100}}
	for _, load := range []float64{0.9, 1.4} {
		jobs, err := Generate(p, nodes, Generator{Trace: Philly, Jobs: 3000, Seed: 7, Load: load})
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range []Mode{StrictQuotas, NomadGPU} {
			var got [2]Result
			for i, whole := range []bool{false, true} {
				r := newRun(jobs, Options{Policy: p, Nodes: nodes, Mode: mode, PassInterval: DefaultPassInterval,
					ReclaimPeriod: 5 * time.Minute, Samples: DefaultSamples})
				r.wholeQueue = whole
				if err := r.loop(); err != nil {
					t.Fatal(err)
				}
				r.finish(0)
				if r.queued != 0 || r.waitingJobs != 0 || r.placed != 0 {
					t.Errorf("load %g, %s: at the end %d queued, %d waiting, %d GPUs held", load, mode, r.queued, r.waitingJobs, r.placed)
				}
				got[i] = r.res
			}
			if got[0].Wait.Mean == 0 {
				t.Errorf("load %g, %s: nothing waited, nothing tested", load, mode)
			}
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Errorf("load %g, %s: bounded: wait %v, JCT %v, %d preemptions; whole queue: wait %v, JCT %v, %d preemptions",
					load, mode, got[0].Wait, got[0].JCT, got[0].Preemptions, got[1].Wait, got[1].JCT, got[1].Preemptions)
			}
		}
	}
}
