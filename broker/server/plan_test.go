package server

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// A plan shows what a registration would do: the same decision, and the
// same job forwarded (workload written, counts and nodes pinned, stamped),
// for generated jobs of every shape the gate reads.
func TestAPlanShowsWhatARegistrationDoes(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" {
  priority = 60
  workload = "training"
}
queue "dev" {
  priority = 50
  workload = "dev"
}
workload "training" {
  checkpoint_grace = "2m"
  restart_attempts = 3
}
workload "dev" {
  default_ttl = "8h"
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 4
  limit      = 6
}
`)
	rng := rand.New(rand.NewPCG(7, 7))
	outcomes := map[string]int{}
	for i := range 60 {
		job := generatedJob(rng, i)
		body := job.Register()
		up := &upstream{jobs: map[string]*api.Job{}}
		nomad := httptest.NewServer(up)
		t.Cleanup(nomad.Close)
		view := cluster.NewView(nil)
		view.ObserveNode(testbuild.Node("n", "H100", 8, 0))
		s, err := New(Options{Log: hclog.NewNullLogger(), Nomad: nomad.URL, Policies: testbuild.Fixed{P: p}, Cluster: view,
			Queue: queuetest.NewMem(), Stamper: nomadjob.Stamper{Key: []byte("k")}, NewID: func() string { return testQueueID }})
		if err != nil {
			t.Fatal(err)
		}
		id := *job.Build().ID
		plan := do(s, http.MethodPut, "/v1/job/"+id+"/plan", body)
		planned := up.last
		up.last = nil
		reg := do(s, http.MethodPut, "/v1/jobs", body)
		outcome, want := planOutcome(plan.Body.String()), registerOutcome(reg.Code, reg.Body.String())
		outcomes[outcome]++
		if outcome == "" || outcome != want {
			t.Errorf("job %d: the plan says %q (%s), the registration %q (%d %s)", i, outcome, plan.Body, want, reg.Code, reg.Body)
			continue
		}
		if strings.HasPrefix(outcome, "admitted") && !reflect.DeepEqual(planned["Job"], up.last["Job"]) {
			t.Errorf("job %d: the plan forwarded\n%v\nthe registration\n%v", i, planned["Job"], up.last["Job"])
		}
	}
	// The generated jobs reach every outcome, or the test proves little.
	kinds := map[string]bool{}
	for o := range outcomes {
		kinds[strings.TrimSuffix(strings.Fields(o)[0], ":")] = true
	}
	if !kinds["admitted"] || !kinds["queued"] || !kinds["rejected"] {
		t.Errorf("outcomes %v: want admitted, queued and rejected jobs", outcomes)
	}
}

// generatedJob is job i of several shapes: type, groups, counts, GPUs,
// queue, lifetime, restart and kill timeout set or left open.
func generatedJob(rng *rand.Rand, i int) *testbuild.JobBuilder {
	b := testbuild.Job("vision", fmt.Sprintf("job-%02d", i)).Type([]string{api.JobTypeBatch, api.JobTypeService, api.JobTypeSystem}[rng.IntN(3)])
	for g := range 1 + rng.IntN(2) {
		b.Group(fmt.Sprintf("g%d", g), 1+rng.IntN(3), 1+rng.IntN(3), "nvidia/gpu")
	}
	job := b.Build()
	job.Status = nil
	switch rng.IntN(3) {
	case 0:
		b.Meta(nomadjob.MetaQueue, "training")
	case 1:
		b.Meta(nomadjob.MetaQueue, "dev")
	}
	if rng.IntN(4) == 0 {
		b.Meta(nomadjob.MetaTTL, "1h")
	}
	for _, tg := range job.TaskGroups {
		if rng.IntN(3) == 0 {
			tg.RestartPolicy = &api.RestartPolicy{Attempts: new(int)}
		}
		if rng.IntN(3) == 0 {
			kill := 5 * time.Minute
			tg.Tasks[0].KillTimeout = &kill
		}
	}
	return b
}

var (
	planSays     = regexp.MustCompile(`nomad-gpu: would be (admitted: [^(]*|queued in queue [^\s:]+|rejected by rule [^\s:]+)`)
	registerSays = regexp.MustCompile(`nomad-gpu: (admitted: [^(]*)|position \d+ in queue ([^\s:]+):|rejected by rule ([^\s:]+):`)
)

// planOutcome and registerOutcome put what a plan says it would do and what
// a registration did in the same words.
func planOutcome(answer string) string {
	m := planSays.FindStringSubmatch(answer)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(strings.Replace(strings.Replace(m[1], "queued in queue", "queued", 1), "rejected by rule", "rejected", 1))
}

func registerOutcome(code int, answer string) string {
	m := registerSays.FindStringSubmatch(answer)
	switch {
	case m == nil:
		return fmt.Sprint(code)
	case m[1] != "":
		return strings.TrimSpace(m[1])
	case m[2] != "":
		return "queued " + m[2]
	}
	return "rejected " + m[3]
}
