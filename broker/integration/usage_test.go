package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// TestGPUHoursSurviveLeaderFailover: a job holding 4 GPUs, two of them
// idle, runs across a SIGKILL of the broker leader. The usage report then
// charges its tenant the allocation's lifetime × 4 GPU-seconds (from its
// task's start to its end as Nomad recorded them, to 0.1 s), half of it
// idle, priced by its class, and the scraped counter agrees.
func TestGPUHoursSurviveLeaderFailover(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	state := filepath.Join(t.TempDir(), "gpu-state.json")
	n := startGPUNodeWithState(t, "ledger", 4, state, "vision")
	// Two GPUs idle, two busy: whichever the job gets, it holds all four.
	s := map[string]map[string]any{}
	for i := 0; i < 4; i++ {
		s[fake.UUID("ledger", i)] = map[string]any{"utilization_gpu": []int{0, 0, 70, 70}[i], "healthy": true}
	}
	b, _ := json.Marshal(s)
	writeFile(t, state, string(b))

	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), `
currency = "EUR"
queue "training" { priority = 60 }
gpu_class "h100" {
  models             = ["`+testbuild.H100+`"]
  price_per_gpu_hour = 3600
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
}
reclaim_settings {
  period = "1s"
}
`)
	brokers := startBrokerPair(t, n, consul, policyDir)
	// The ledger counts from its first pass on: the job starts after it.
	for _, b := range brokers {
		if b.Addr == leaderOf(consul) {
			waitPasses(t, b, metrics.LoopReclaim, 1)
		}
	}
	spec := job("vision", "train", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu/"+testbuild.H100, 4)))
	testcluster.WaitFor(t, 60*time.Second, "train admitted", func() error {
		req, _ := http.NewRequest(http.MethodPut, brokers[0].Addr+"/v1/jobs", strings.NewReader(spec.body(nil, canonical)))
		resp, err := brokers[0].Client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out api.JobRegisterResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || !strings.Contains(out.Warnings, "admitted") {
			return fmt.Errorf("%d %v %+v", resp.StatusCode, err, out)
		}
		return nil
	})
	running := func() *api.AllocationListStub {
		var alloc *api.AllocationListStub
		testcluster.WaitFor(t, 60*time.Second, "train running", func() error {
			allocs, _, err := n.API.Jobs().Allocations("train", false, &api.QueryOptions{Namespace: "vision"})
			if err != nil {
				return err
			}
			for _, a := range allocs {
				if a.ClientStatus == api.AllocClientStatusRunning {
					alloc = a
					return nil
				}
			}
			return fmt.Errorf("no running allocation")
		})
		return alloc
	}
	first := running()
	time.Sleep(5 * time.Second)
	survivor := killLeader(t, consul, brokers)
	testcluster.WaitFor(t, 60*time.Second, "the next leader", func() error {
		if leaderOf(consul) != survivor.Addr {
			return fmt.Errorf("leader %q", leaderOf(consul))
		}
		return nil
	})
	waitPasses(t, survivor, metrics.LoopReclaim, 3) // the new leader counts
	if _, _, err := n.API.Jobs().Deregister("train", false, &api.WriteOptions{Namespace: "vision"}); err != nil {
		t.Fatal(err)
	}
	lifetime := taskLifetime(t, n, first.ID, "t0")
	waitPasses(t, survivor, metrics.LoopReclaim, 2) // nothing more charged after it

	from := time.Now().UTC().AddDate(0, 0, -1).Format("2006-01-02") // a run across midnight is still one report
	resp, err := survivor.Client.Get(survivor.Addr + "/v1/gpu/usage?from=" + from)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep gpuapi.UsageReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || len(rep.Rows) != 1 {
		t.Fatalf("report: %v %+v", err, rep)
	}
	row := rep.Rows[0]
	charged := time.Duration(row.AllocatedHours / 4 * float64(time.Hour))
	t.Logf("allocation ran %s; charged %s per GPU across the failover; idle share %.3f", lifetime, charged, row.IdleShare)
	if row.Group != "vision" || rep.Currency != "EUR" || (charged-lifetime).Abs() > 100*time.Millisecond {
		t.Errorf("vision charged %s per GPU, the allocation ran %s: %+v", charged, lifetime, row)
	}
	if math.Abs(row.IdleShare-0.5) > 0.06 || math.Abs(row.Cost-row.AllocatedHours*3600) > 1e-6 {
		t.Errorf("idle share %.3f (want 0.5), cost %.2f for %.5f GPU-hours at 3600: %+v", row.IdleShare, row.Cost, row.AllocatedHours, row)
	}
	// The report as the CLI prints it, and the new leader's counter: it
	// counts only what it committed, so no more than the report.
	cli := (&env{t: t, broker: survivor}).brokerCLI("usage", "-from", from, "-csv")
	if !strings.Contains(cli, "TENANT,ALLOCATED GPU-H") || !strings.Contains(cli, "vision,") {
		t.Errorf("usage -csv:\n%s", cli)
	}
	m := survivor.Scrape()
	if got := m[`nomadgpu_gpu_seconds_total{gpu_class="h100",queue="training",state="allocated",tenant="vision"}`]; got <= 0 || got > row.AllocatedHours*3600+1e-6 {
		t.Errorf("the new leader's counter: %v GPU-seconds, report %v", got, row.AllocatedHours*3600)
	}
}

// TestFairShareAdmitsTheLighterTenantFirst: two tenants with equal
// guarantees wait for the same GPUs; the one that used none recently is
// admitted before the one that did, although it queued later.
func TestFairShareAdmitsTheLighterTenantFirst(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "fair", 4, "vision", "search")
	// Guarantees of 1 each: the other GPUs are borrowed, shared by both.
	e := brokerEnv(t, n, consul, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 4
}
tenant "search" {
  namespaces = ["search"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 4
}
borrowing {
  enabled = true
}
fair_share {
  half_life = "1h"
}
reclaim_settings {
  period = "1s"
}
`, "vision", 4, testcluster.BrokerOptions{})
	if out, err := e.run("vision", "heavy", 1, 4, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitRunning("vision", "heavy")
	time.Sleep(5 * time.Second) // vision's GPU-hours add up, pass by pass
	first := e.queued("v-next", 4, true)
	second := e.queuedIn("search", "s-next", 4, true)
	if _, _, err := n.API.Jobs().Deregister("heavy", false, &api.WriteOptions{Namespace: "vision"}); err != nil {
		t.Fatal(err)
	}
	e.waitRunning("search", "s-next")
	var entries []gpuapi.QueuedJob
	if err := json.Unmarshal([]byte(e.brokerCLI("queue", "list", "-json")), &entries); err != nil || len(entries) != 1 || entries[0].ID != first {
		t.Errorf("want vision's v-next (%s) still queued, search's %s admitted: %v %+v", first, second, err, entries)
	}
}

// TestABudgetSpentMakesTheNextJobBorrowed: a tenant past its monthly
// GPU-hour budget gets its next job admitted borrowed, with the reason and
// the reset, and gpu-broker usage says so.
func TestABudgetSpentMakesTheNextJobBorrowed(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "budget", 4, "vision")
	e := brokerEnv(t, n, consul, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
  budget {
    gpu_hours = 0.002 # 7.2 GPU-seconds
    period    = "month"
  }
}
reclaim_settings {
  period = "1s"
}
`, "vision", 4, testcluster.BrokerOptions{})
	out, err := e.run("vision", "spender", 1, 2, "", true)
	if err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("first job, within budget: %v\n%s", err, out)
	}
	e.waitRunning("vision", "spender")
	testcluster.WaitFor(t, 30*time.Second, "vision over its budget", func() error {
		if out := e.brokerCLI("usage"); !strings.Contains(out, "OVER: ") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
	_, next := usage.PeriodBounds(time.Now(), "month")
	out, err = e.run("vision", "next", 1, 1, "", true)
	want := `borrowed: yes, preemptible when the owners need their GPUs (tenant "vision" spent`
	if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "GPU-hour budget this month (resets "+next.Format(time.RFC3339)+")") {
		t.Errorf("next job, over budget: %v\n%s", err, out)
	}
	if job, _, err := n.API.Jobs().Info("next", &api.QueryOptions{Namespace: "vision"}); err != nil || *job.Priority != 20 {
		t.Errorf("next runs at priority %v, want the borrowing band 20 (%v)", job.Priority, err)
	}
}

// TestAQueuedJobIsToldWhenItWillStart: a job queued behind a dev job with a
// lifetime is told when it will start; it starts then, and the estimate's
// error is recorded.
func TestAQueuedJobIsToldWhenItWillStart(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "estimate", 2, "vision")
	e := brokerEnv(t, n, consul, `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
  guaranteed = 2
  limit      = 2
}
borrowing {
  enabled = false
}
reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "20s"
  action       = "stop"
  mode         = "enforce"
}
reclaim_settings {
  period = "1s"
}
`, "vision", 2, testcluster.BrokerOptions{})
	if out, err := e.run("vision", "holder", 1, 2, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	held := e.waitRunning("vision", "holder")
	alloc, _, err := n.API.Allocations().Info(held.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	ends := alloc.TaskStates["t"].StartedAt.Add(20 * time.Second)
	waitPasses(t, e.broker, metrics.LoopReclaim, 2) // a whole pass has seen it running
	estimate := func(what, out string) time.Time {
		t.Helper()
		i := strings.Index(out, "Estimated start: ")
		if i < 0 {
			t.Fatalf("%s: no estimate:\n%s", what, out)
		}
		estimated, err := time.Parse(time.RFC3339, strings.Fields(out[i+len("Estimated start: "):])[0])
		if err != nil || (estimated.Sub(ends)).Abs() > 2*time.Second || !strings.Contains(out, "when 1 running allocations reach the end of their lifetimes") {
			t.Fatalf("%s: estimated %v (%v), holder's lifetime ends %s:\n%s", what, estimated, err, ends, out)
		}
		return estimated
	}
	// A plan tells the same before anything is queued.
	plan, _ := e.nomadCLI("job", "plan", e.spec("vision", "next", 1, 2, ""))
	if !strings.Contains(plan, "would be queued in queue dev") || !strings.Contains(plan, "It would be position 1 in queue dev.") {
		t.Fatalf("plan:\n%s", plan)
	}
	estimate("nomad job plan", plan)
	var queued []gpuapi.QueuedJob
	if err := json.Unmarshal([]byte(e.brokerCLI("queue", "list", "-json")), &queued); err != nil || len(queued) != 0 {
		t.Fatalf("a plan queued %v (%v)", queued, err)
	}
	out, err := e.run("vision", "next", 1, 2, "", true)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	estimated := estimate("nomad job run", out)
	if show := e.brokerCLI("queue", "list", "-json"); !strings.Contains(show, `"estimate":{"at":"`) {
		t.Errorf("queue list without the estimate: %s", show)
	}
	if list := e.brokerCLI("queue", "list"); !strings.Contains(list, "ESTIMATED START") || !strings.Contains(list, estimated.Format(time.RFC3339)) {
		t.Errorf("gpu-broker queue list does not show the estimate %s:\n%s", estimated.Format(time.RFC3339), list)
	}
	e.waitRunning("vision", "next")
	var events []audit.Event
	if err := json.Unmarshal([]byte(e.brokerCLI("audit", "-json", "-job", "next")), &events); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.What == audit.QueueAdmission {
			t.Logf("queue admission of next: %s", ev.Result)
			j := strings.Index(ev.Result, "s off)")
			k := strings.LastIndex(ev.Result[:max(j, 0)], ", ")
			if j < 0 || k < 0 {
				t.Fatalf("no estimate error in %q", ev.Result)
			}
			off, err := time.ParseDuration(ev.Result[k+2:j] + "s")
			if err != nil || off.Abs() > 5*time.Second {
				t.Errorf("started %v after the estimate (%v), want within 5s", off, err)
			}
			replayTheRecords(t, e)
			return
		}
	}
	t.Errorf("no queue admission of next in the audit trail: %+v", events)
}

// replayTheRecords: what the broker recorded (holder, then next) is a trace
// the simulator replays under the same policy.
func replayTheRecords(t *testing.T, e *env) {
	var trace string
	testcluster.WaitFor(t, 30*time.Second, "holder and next in the trace", func() error {
		trace = e.brokerCLI("usage", "-trace", "-since", "1h")
		if !strings.Contains(trace, `"id":"vision/holder","submit":0,"namespace":"vision","queue":"dev","gpus":2`) ||
			!strings.Contains(trace, `"id":"vision/next"`) {
			return fmt.Errorf("%s", trace)
		}
		return nil
	})
	path := filepath.Join(e.dir, "last-hour.jsonl")
	writeFile(t, path, trace)
	out, err := exec.Command(testcluster.BrokerBinary(t), "simulate", "-policy", e.policyDir, "-trace", path, "-nodes", "1x2:GPU").CombinedOutput()
	jobs := strings.Count(trace, "\n")
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("%d jobs on 2 GPUs", jobs)) ||
		!strings.Contains(string(out), fmt.Sprintf("%d / 0 / 0", jobs)) {
		t.Errorf("replaying the broker's records (%v):\n%s\n%s", err, trace, out)
	}
}

// taskLifetime waits until task of allocation id finished, and is how long
// it ran by its client's times.
func taskLifetime(t *testing.T, n *testcluster.Nomad, id, task string) time.Duration {
	t.Helper()
	var lifetime time.Duration
	testcluster.WaitFor(t, 60*time.Second, task+" finished", func() error {
		a, _, err := n.API.Allocations().Info(id, nil)
		if err != nil {
			return err
		}
		ts := a.TaskStates[task]
		if ts == nil || ts.FinishedAt.IsZero() {
			return fmt.Errorf("not finished")
		}
		lifetime = ts.FinishedAt.Sub(ts.StartedAt)
		return nil
	})
	return lifetime
}
