package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// reclaimBase is the reclaim tests' cluster policy: tenant vision with 8 GPUs
// of training and dev work, a reclaim pass a second.
const reclaimBase = `
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 8
  limit      = 8
}
borrowing {
  enabled = false
}
reclaim_settings {
  period = "1s"
}
`

const reclaimPolicy = reclaimBase + `
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  mode       = "enforce"
}
reclaim "idle-dev" {
  workload   = "dev"
  idle_below = 5
  idle_for   = "6s"
  action     = "stop"
  grace      = "10s" # time for the test to cancel one on a loaded machine
  mode       = "enforce"
}
reclaim "sick-gpu" {
  device_unhealthy_for = "2s"
  action               = "reschedule"
  mode                 = "enforce"
}
reclaim "crash-loop" {
  restarts_above = 2
  within         = "5m"
  action         = "stop"
  mode           = "enforce"
}
reclaim "idle-training" {
  workload   = "training"
  idle_below = 5
  idle_for   = "6s"
  action     = "stop"
}
`

// TestReclaim runs the reclaim rules against real Nomad with simulated GPUs
// whose utilisation the test sets. Its cases: an unadmitted job, an idle
// dev job, a busy one, an idle training job under a dry-run rule, and a
// decision cancelled during its grace.
func TestReclaim(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	state := filepath.Join(t.TempDir(), "gpu-state.json")
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "reclaim", Server: true, Client: true, PluginConfig: fmt.Sprintf(`
    backend            = "fake"
    stats_period       = "1s"
    fingerprint_period = "1s"
    fake {
      count      = 8
      id_prefix  = "reclaim"
      state_file = %q
    }`, state)})
	nodes := n.WaitForNodes(t, 1)
	if _, err := n.API.Namespaces().Register(&api.Namespace{Name: "vision"}, nil); err != nil {
		t.Fatal(err)
	}
	// Every GPU busy to begin with; each job the test wants idle is set so.
	util := map[string]int{}
	sick := map[string]bool{}
	for _, d := range nodes[0].NodeResources.Devices {
		for _, inst := range d.Instances {
			util[inst.ID] = 60
		}
	}
	setUtil := func() {
		s := map[string]map[string]any{}
		for id, u := range util {
			s[id] = map[string]any{"utilization_gpu": u, "healthy": !sick[id]}
		}
		b, _ := json.Marshal(s)
		writeFile(t, state+".tmp", string(b))
		if err := os.Rename(state+".tmp", state); err != nil {
			t.Fatal(err)
		}
	}
	setUtil()
	e := brokerEnv(t, n, consul, reclaimPolicy, "vision", 8, testcluster.BrokerOptions{})
	// The CLI is built now, not at its first use: "reclaim cancel" must come
	// within its decision's 10 s grace, and a build under make test's load
	// took longer than that.
	testcluster.BrokerBinary(t)
	// setJobUtil sets the utilisation of the GPUs of a job's allocations.
	setJobUtil := func(id string, u int) {
		allocs, _, err := n.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: "vision"})
		if err != nil {
			t.Fatal(err)
		}
		for _, stub := range allocs {
			alloc, _, err := n.API.Allocations().Info(stub.ID, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, tr := range alloc.AllocatedResources.Tasks {
				for _, d := range tr.Devices {
					for _, dev := range d.DeviceIDs {
						util[dev] = u
					}
				}
			}
		}
		setUtil()
	}
	idle := func(ns, id string) {
		e.waitRunning(ns, id)
		setJobUtil(id, 0)
	}
	decisions := func() map[string]reclaim.Record {
		out := map[string]reclaim.Record{}
		for _, r := range reclaimRecords(e.broker) {
			out[r.Job] = r
		}
		return out
	}
	waitDecision := func(job string, state reclaim.State) reclaim.Record {
		var rec reclaim.Record
		testcluster.WaitFor(t, 40*time.Second, "decision on "+job+" "+string(state), func() error {
			var ok bool
			if rec, ok = decisions()[job]; !ok || rec.State != state {
				return fmt.Errorf("decision %+v", rec)
			}
			return nil
		})
		return rec
	}
	stopped := func(id string) bool {
		job, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: "vision"})
		return err == nil && job.Stop != nil && *job.Stop
	}

	for _, id := range []string{"idle-nb", "busy-nb", "keep-nb"} {
		if out, err := e.run("vision", id, 1, 1, "dev", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if out, err := e.run("vision", "train", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	direct := job("vision", "direct", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1))).j
	if _, _, err := n.API.Jobs().Register(direct, nil); err != nil {
		t.Fatal(err)
	}
	// Straight to Nomad too, with the admission meta of an admitted job.
	admitted, _, err := n.API.Jobs().Info("busy-nb", &api.QueryOptions{Namespace: "vision"})
	if err != nil {
		t.Fatal(err)
	}
	copied := job("vision", "copied", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1))).j
	copied.Meta = admitted.Meta
	if _, _, err := n.API.Jobs().Register(copied, nil); err != nil {
		t.Fatal(err)
	}
	// Straight to Nomad too, using GPUs without asking for any.
	byHand := job("vision", "by-hand", api.JobTypeBatch).group("g", ptr(1), nil, task()).j
	byHand.TaskGroups[0].Tasks[0].Env = map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}
	if _, _, err := n.API.Jobs().Register(byHand, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"idle-nb", "keep-nb", "train"} {
		idle("vision", id)
	}
	e.waitRunning("vision", "busy-nb")

	t.Run("a GPU job registered straight to Nomad is stopped by rule unadmitted, with copied meta too, or asking for no GPU", func(t *testing.T) {
		for _, id := range []string{"direct", "copied", "by-hand"} {
			rec := waitDecision(id, reclaim.Executed)
			if !stopped(id) || rec.Rule != "unadmitted" || !strings.Contains(rec.Result, "job stopped") || rec.Evidence == "" {
				t.Errorf("%s: stopped %t, record %+v", id, stopped(id), rec)
			}
		}
		if rec := decisions()["by-hand"]; !strings.Contains(rec.Evidence, "uses GPUs without asking for them") {
			t.Errorf("by-hand's evidence: %q", rec.Evidence)
		}
		if stopped("busy-nb") {
			t.Error("the job whose meta was copied was stopped")
		}
	})
	var cancelledActAfter time.Time
	t.Run("a cancelled decision is never carried out", func(t *testing.T) {
		e := e.in(t)
		rec := waitDecision("keep-nb", reclaim.Proposed)
		cancelledActAfter = rec.ActAfter
		out := e.brokerCLI("reclaim", "cancel", rec.ID)
		if !strings.Contains(out, "cancelled") {
			t.Fatalf("cancel: %s", out)
		}
	})
	t.Run("an idle dev job is proposed, then stopped after its grace", func(t *testing.T) {
		e := e.in(t)
		rec := waitDecision("idle-nb", reclaim.Executed)
		if !stopped("idle-nb") || rec.ExecutedAt.Sub(rec.ProposedAt) < 10*time.Second || !strings.Contains(rec.Evidence, "every GPU below 5%") {
			t.Errorf("stopped %t, record %+v", stopped("idle-nb"), rec)
		}
		if out := e.brokerCLI("reclaim", "show", rec.ID); !strings.Contains(out, "idle-dev") || !strings.Contains(out, "executed") {
			t.Errorf("reclaim show:\n%s", out)
		}
	})
	t.Run("a scale through the broker keeps a job admitted, one straight in Nomad does not", func(t *testing.T) {
		e := e.in(t)
		for _, id := range []string{"idle-nb", "direct"} {
			setJobUtil(id, 60) // their GPUs, free again, busy for whoever gets them next
		}
		for _, id := range []string{"scaled", "scaled-direct"} {
			if out, err := e.run("vision", id, 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("%v\n%s", err, out)
			}
		}
		if out, err := e.nomadCLI("job", "scale", "-namespace", "vision", "-detach", "scaled", "g", "2"); err != nil {
			t.Fatalf("scale through the broker: %v\n%s", err, out)
		}
		if _, _, err := n.API.Jobs().Scale("scaled-direct", "g", ptr(2), "", false, nil, &api.WriteOptions{Namespace: "vision"}); err != nil {
			t.Fatal(err)
		}
		if rec := waitDecision("scaled-direct", reclaim.Executed); rec.Rule != "unadmitted" || !stopped("scaled-direct") {
			t.Errorf("scaled past the broker: stopped %t, record %+v", stopped("scaled-direct"), rec)
		}
		if rec, ok := decisions()["scaled"]; ok || stopped("scaled") {
			t.Errorf("scaled through the broker, then reclaimed: %+v", rec)
		}
	})
	t.Run("a child dispatched through the broker stays admitted, one dispatched straight in Nomad does not", func(t *testing.T) {
		e := e.in(t)
		parent := job("vision", "fan-out", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		parent.j.ParameterizedJob = &api.ParameterizedJobConfig{}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", parent.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("parameterized job: %d %s", status, out)
		}
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/fan-out/dispatch?namespace=vision", `{}`)
		var through api.JobDispatchResponse
		if status != http.StatusOK || json.Unmarshal([]byte(out), &through) != nil {
			t.Fatalf("dispatch through the broker: %d %s", status, out)
		}
		e.waitRunning("vision", through.DispatchedJobID)
		setJobUtil(through.DispatchedJobID, 60) // busy: no idle rule's business
		straight, _, err := n.API.Jobs().Dispatch("fan-out", nil, nil, "", &api.WriteOptions{Namespace: "vision"})
		if err != nil {
			t.Fatal(err)
		}
		if rec := waitDecision(straight.DispatchedJobID, reclaim.Executed); rec.Rule != "unadmitted" || !stopped(straight.DispatchedJobID) {
			t.Errorf("dispatched past the broker: stopped %t, record %+v", stopped(straight.DispatchedJobID), rec)
		}
		setJobUtil(straight.DispatchedJobID, 60) // its GPU, free again, busy for whoever gets it next
		if rec := decisions()[through.DispatchedJobID]; rec.Rule == "unadmitted" || stopped(through.DispatchedJobID) {
			t.Errorf("dispatched through the broker, then reclaimed: %+v", rec)
		}
		// Its GPU for the crash-looping job below: the tenant's work within its
		// guarantee runs in bands less than 10 apart, so Nomad no longer makes
		// room for training by evicting the tenant's own dev jobs.
		e.stop("vision", through.DispatchedJobID)
	})
	t.Run("an allocation on a sick GPU is placed again, on healthy ones", func(t *testing.T) {
		e := e.in(t)
		if out, err := e.run("vision", "on-sick", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("%v\n%s", err, out)
		}
		first := e.waitRunning("vision", "on-sick")
		alloc, _, err := n.API.Allocations().Info(first.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		bad := alloc.AllocatedResources.Tasks["t"].Devices[0].DeviceIDs[0]
		sick[bad] = true
		setUtil()
		rec := waitDecision("on-sick", reclaim.Executed)
		if rec.Rule != "sick-gpu" || !strings.Contains(rec.Evidence, bad+" unhealthy since") || !strings.Contains(rec.Result, "allocation stopped") {
			t.Errorf("record %+v", rec)
		}
		testcluster.WaitFor(t, 60*time.Second, "on-sick placed again", func() error {
			next := e.waitRunning("vision", "on-sick")
			if next.ID == first.ID {
				return fmt.Errorf("still the first allocation")
			}
			a, _, err := n.API.Allocations().Info(next.ID, nil)
			if err != nil {
				return err
			}
			if got := a.AllocatedResources.Tasks["t"].Devices[0].DeviceIDs[0]; got == bad {
				t.Fatalf("placed again on the sick GPU %s", bad)
			}
			return nil
		})
	})
	t.Run("a crash-looping task holding a GPU is stopped", func(t *testing.T) {
		e := e.in(t)
		crashing := job("vision", "crashing", api.JobTypeService).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		tg := crashing.j.TaskGroups[0]
		tg.Tasks[0].Driver, tg.Tasks[0].Config = "raw_exec", map[string]any{"command": "/bin/sh", "args": []string{"-c", "sleep 1; exit 1"}}
		tg.RestartPolicy = &api.RestartPolicy{Attempts: ptr(20), Interval: ptr(10 * time.Minute), Delay: ptr(time.Second), Mode: ptr("delay")}
		req, _ := http.NewRequest(http.MethodPut, e.broker.Addr+"/v1/jobs", strings.NewReader(crashing.body(nil, canonical)))
		resp, err := e.broker.Client.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("register: %v %v", err, resp)
		}
		resp.Body.Close()
		// Its GPU busy, whichever it got: this is the crash-loop rule's, not an idle rule's.
		testcluster.WaitFor(t, 30*time.Second, "crashing placed", func() error {
			allocs, _, err := n.API.Jobs().Allocations("crashing", false, &api.QueryOptions{Namespace: "vision"})
			if err != nil || len(allocs) == 0 {
				return fmt.Errorf("no allocation yet (%v); running: %s", err, runningAllocs(n))
			}
			return nil
		})
		setJobUtil("crashing", 60)
		rec := waitDecision("crashing", reclaim.Executed)
		if rec.Rule != "crash-loop" || !strings.Contains(rec.Evidence, "restarts within 5m0s") || !stopped("crashing") {
			t.Errorf("stopped %t, record %+v", stopped("crashing"), rec)
		}
	})
	t.Run("a dry-run rule records and does nothing", func(t *testing.T) {
		if rec := waitDecision("train", reclaim.DryRun); stopped("train") || rec.Rule != "idle-training" {
			t.Errorf("stopped %t, record %+v", stopped("train"), rec)
		}
	})
	t.Run("a job that keeps its GPUs idle is listed for right-sizing, and warned when submitted again", func(t *testing.T) {
		e := e.in(t)
		// Its profile is written every ten passes (of a second here).
		testcluster.WaitFor(t, 40*time.Second, "train listed for right-sizing", func() error {
			out := e.brokerCLI("usage", "-rightsizing", "-json")
			var rows []gpuapi.RightSizing
			if err := json.Unmarshal([]byte(out), &rows); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			for _, r := range rows {
				if r.Job == "train" && r.Tenant == "vision" && r.Asked == 1 && r.BusyP95 == 0 && r.Samples >= usage.MinSamples {
					return nil
				}
			}
			return fmt.Errorf("rows %+v", rows)
		})
		if out := e.brokerCLI("usage", "-rightsizing"); !strings.Contains(out, "BUSY P95") || !regexp.MustCompile(`vision\s+vision\s+train\s+training\s+1\s+0\s+0`).MatchString(out) {
			t.Errorf("usage -rightsizing:\n%s", out)
		}
		out, err := e.run("vision", "train", 1, 1, "", true)
		if err != nil || !strings.Contains(out, "admitted") || !strings.Contains(out, "right-sizing: train asks for 1 GPUs, and its earlier runs held 1 but kept at most 0 busy") {
			t.Errorf("submitted again: %v\n%s", err, out)
		}
		if out, _ := e.run("vision", "busy-nb", 1, 1, "dev", true); strings.Contains(out, "right-sizing") {
			t.Errorf("a busy job warned:\n%s", out)
		}
	})
	t.Run("a busy job, the one scaled through the broker and the cancelled one keep running", func(t *testing.T) {
		e := e.in(t)
		time.Sleep(time.Until(cancelledActAfter.Add(time.Second))) // past the cancelled decision's grace
		recs := decisions()
		if rec, ok := recs["busy-nb"]; ok || stopped("busy-nb") {
			t.Errorf("busy job reclaimed: %+v", rec)
		}
		if rec := recs["scaled"]; rec.Rule == "unadmitted" || stopped("scaled") {
			t.Errorf("job scaled through the broker reclaimed: %+v", rec)
		}
		if recs["keep-nb"].State != reclaim.Cancelled || stopped("keep-nb") {
			t.Errorf("cancelled decision carried out: %+v", recs["keep-nb"])
		}
		if out := e.brokerCLI("reclaim", "list"); !strings.Contains(out, "idle-dev") || !strings.Contains(out, "unadmitted") {
			t.Errorf("reclaim list:\n%s", out)
		}
	})
	t.Run("the broker's metrics say what happened", func(t *testing.T) {
		e := e.in(t)
		m := e.broker.Scrape()
		for series, want := range map[string]float64{
			`nomadgpu_reclaim_decisions_total{action="stop",rule="unadmitted",state="executed"}`:     5, // direct, copied, by-hand, scaled-direct, fan-out's straight child
			`nomadgpu_reclaim_decisions_total{action="stop",rule="idle-dev",state="executed"}`:       1,
			`nomadgpu_reclaim_decisions_total{action="stop",rule="idle-dev",state="cancelled"}`:      1,
			`nomadgpu_reclaim_decisions_total{action="reschedule",rule="sick-gpu",state="executed"}`: 1,
			`nomadgpu_reclaim_decisions_total{action="stop",rule="crash-loop",state="executed"}`:     1,
			`nomadgpu_reclaim_decisions_total{action="stop",rule="idle-training",state="dry-run"}`:   1,
			`nomadgpu_gpus{model="` + testbuild.H100 + `",node_pool="default",state="total"}`:        8,
			`nomadgpu_gpus{model="` + testbuild.H100 + `",node_pool="default",state="unhealthy"}`:    1,
			`nomadgpu_tenant_gpus{gpu_class="all",kind="limit",tenant="vision"}`:                     8,
			`nomadgpu_admissions_total{outcome="admit",queue="dev",rule="",source="submit"}`:         4, // three notebooks, busy-nb again
			`nomadgpu_leader`: 1,
		} {
			if got, ok := m[series]; !ok || got != want {
				t.Errorf("%s = %v (present %t), want %v", series, got, ok, want)
			}
		}
		busy := m[`nomadgpu_gpu_seconds_total{gpu_class="",queue="training",state="busy",tenant="vision"}`]
		idle := m[`nomadgpu_gpu_seconds_total{gpu_class="",queue="training",state="idle",tenant="vision"}`]
		allocated := m[`nomadgpu_gpu_seconds_total{gpu_class="",queue="training",state="allocated",tenant="vision"}`]
		if busy <= 0 || idle <= 0 || math.Abs(allocated-busy-idle) > 1e-6 {
			t.Errorf("training GPU-seconds: allocated %v, busy %v, idle %v", allocated, busy, idle)
		}
		if n := m[`nomadgpu_scale_up_seconds_count{queue="training",tenant="vision"}`]; n != 1 {
			t.Errorf("%v scale-ups timed, want the one through the broker", n)
		}
		if m["nomadgpu_cluster_view_index"] <= 0 || m["nomadgpu_cluster_view_listings_total"] < 1 {
			t.Errorf("cluster view index %v, listings %v", m["nomadgpu_cluster_view_index"], m["nomadgpu_cluster_view_listings_total"])
		}
		sick := 0.0
		for series, v := range m {
			if strings.HasPrefix(series, "nomadgpu_unhealthy_gpus{") {
				sick += v
			}
		}
		if sick != 1 {
			t.Errorf("%v unhealthy GPUs by reason, want the 1 made sick", sick)
		}
	})
	t.Run("the audit trail has each decision and act, and who made it", func(t *testing.T) {
		e := e.in(t)
		var events []audit.Event
		if err := json.Unmarshal([]byte(e.brokerCLI("audit", "-json", "-tenant", "", "-since", "1h")), &events); err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, ev := range events {
			seen = append(seen, ev.What+" "+ev.Job+" "+ev.Rule+" by "+ev.Who+": "+strings.Fields(ev.Result + " ")[0])
		}
		all := strings.Join(seen, "\n")
		for _, want := range []string{
			"admission idle-nb  by anonymous: admit:",
			"reclaim-decision direct unadmitted by broker: proposed",
			"reclaim-action direct unadmitted by broker: executed",
			"reclaim-decision keep-nb idle-dev by broker: proposed",
			"reclaim-cancel keep-nb idle-dev by anonymous: cancelled",
			"reclaim-decision train idle-training by broker: dry-run",
		} {
			if !strings.Contains(all, want) {
				t.Errorf("no %q in the audit trail:\n%s", want, all)
			}
		}
	})
}

const preemptPolicy = `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 4
}
tenant "search" {
  namespaces = ["search"]
  queues     = ["inference"]
  guaranteed = 2
  limit      = 2
}
borrowing {
  enabled  = true
  priority = 20
  backoff  = "0" # borrowed again at once: TestBroker has the backoff
}
reclaim_settings {
  period = "1s"
}
# Proposed only: what the broker does not take for its admission shows in
# gpu-broker reclaim list.
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  grace      = "1h"
  mode       = "dry-run"
}
`

// TestPreemptedBorrowedJobRunsAgainOnce: a borrowed job that Nomad preempts
// for an owner's job goes back to the broker's queue (its tenant no longer
// charged), and runs again, once, when GPUs free.
func TestPreemptedBorrowedJobRunsAgainOnce(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "preempt", 4, "vision", "search")
	e := brokerEnv(t, n, consul, preemptPolicy, "vision", 4, testcluster.BrokerOptions{})
	for _, c := range []struct{ ns, id, want string }{
		{"vision", "own", "borrowed: no"}, {"vision", "extra", "borrowed: yes"},
	} {
		if out, err := e.run(c.ns, c.id, 1, 2, "", true); err != nil || !strings.Contains(out, c.want) {
			t.Fatalf("%s: %v\n%s", c.id, err, out)
		}
		e.waitRunning(c.ns, c.id)
	}
	first := e.job("vision", "extra")
	if out, err := e.run("search", "svc", 1, 2, "", true); err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("%v\n%s", err, out)
	}
	e.waitRunning("search", "svc")
	testcluster.WaitFor(t, 30*time.Second, "extra back in the queue", func() error {
		if out := e.brokerCLI("queue", "list"); !strings.Contains(out, "extra") {
			return fmt.Errorf("queue:\n%s", out)
		}
		return nil
	})
	if used := e.usedBy("vision"); used != 2 {
		t.Errorf("vision is charged %g GPUs, holds 2", used)
	}
	e.stop("search", "svc")
	testcluster.WaitFor(t, 60*time.Second, "extra running again", func() error {
		job := e.job("vision", "extra")
		if job.Stop != nil && *job.Stop {
			return fmt.Errorf("still stopped")
		}
		allocs, _, err := n.API.Jobs().Allocations("extra", false, &api.QueryOptions{Namespace: "vision"})
		if err != nil {
			return err
		}
		running := 0
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning && a.DesiredStatus == api.AllocDesiredStatusRun {
				running++
			}
		}
		if running != 1 {
			return fmt.Errorf("%d running allocations", running)
		}
		return nil
	})
	waitPasses(t, e.broker, metrics.LoopReclaim, 3) // nothing happens again
	if again := e.job("vision", "extra"); *again.Version != *first.Version+2 || again.Meta["nomad-gpu.borrowed"] != "true" {
		// One stop (Nomad makes it a version) and one registration.
		t.Errorf("want one stop and one registration again, borrowed: version %d (was %d), meta %v", *again.Version, *first.Version, again.Meta)
	}
	if out := e.brokerCLI("queue", "list"); strings.Contains(out, "extra") {
		t.Errorf("running again, still queued:\n%s", out)
	}
	if out := e.brokerCLI("reclaim", "list"); !strings.Contains(out, "preempted-borrowed") || !strings.Contains(out, "executed") {
		t.Errorf("reclaim list:\n%s", out)
	}
	// The scenario as Prometheus sees it: borrowed, preempted once (work
	// lost), requeued, admitted again from the queue.
	m := e.broker.Scrape()
	for series, want := range map[string]float64{
		`nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="submit"}`:  1,
		`nomadgpu_preemptions_total{queue="training",tenant="vision"}`:                                  1,
		`nomadgpu_allocations_total{event="preempted",queue="training",tenant="vision"}`:                1,
		`nomadgpu_allocations_total{event="stopped",queue="inference",tenant="search"}`:                 1,
		`nomadgpu_reclaimed_gpus_total{action="requeue",rule="preempted-borrowed"}`:                     2,
		`nomadgpu_admissions_total{outcome="admit-borrowed",queue="training",rule="",source="queue"}`:   1,
		`nomadgpu_queue_wait_seconds_count{outcome="admit-borrowed",queue="training"}`:                  1,
		`nomadgpu_reclaim_decisions_total{action="requeue",rule="preempted-borrowed",state="executed"}`: 1,
		`nomadgpu_tenant_gpus{gpu_class="all",kind="borrowed",tenant="vision"}`:                         2,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %t), want %v", series, got, ok, want)
		}
	}
	if lost := m[`nomadgpu_preempted_gpu_seconds_total{queue="training",tenant="vision"}`]; lost <= 0 {
		t.Errorf("no work lost to the preemption: %v", lost)
	}
	if n := m[`nomadgpu_request_duration_seconds_count{class="register"}`]; n < 3 {
		t.Errorf("%v registrations timed, want at least own, extra and svc", n)
	}

	// borrowing.promote_below: once own stops, extra alone is within
	// vision's guarantee; the leader promotes it in place to the band own
	// ran at: the same allocation, no longer borrowed, no longer another
	// tenant's to preempt.
	band := *e.job("vision", "own").Priority
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), strings.Replace(preemptPolicy, `backoff  = "0"`, "backoff  = \"0\"\n  promote_below = 1", 1))
	allocOf := func(id string) string { // its running allocation
		allocs, _, err := n.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: "vision"})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range allocs {
			if a.ClientStatus == api.AllocClientStatusRunning && a.DesiredStatus == api.AllocDesiredStatusRun {
				return a.ID
			}
		}
		return ""
	}
	before := allocOf("extra")
	e.stop("vision", "own")
	testcluster.WaitFor(t, 60*time.Second, "extra promoted", func() error {
		if p := *e.job("vision", "extra").Priority; p != band {
			return fmt.Errorf("priority %d, want %d", p, band)
		}
		return nil
	})
	waitPasses(t, e.broker, metrics.LoopReclaim, 2) // the promoted job as the leader reads it
	if after := allocOf("extra"); after != before || before == "" {
		t.Errorf("extra's allocation %q became %q: not in place", before, after)
	}
	m = e.broker.Scrape()
	if b := m[`nomadgpu_tenant_gpus{gpu_class="all",kind="borrowed",tenant="vision"}`]; b != 0 {
		t.Errorf("vision still borrows %v GPUs after the promotion", b)
	}
	if out := e.brokerCLI("audit", "-since", "1h"); !strings.Contains(out, "promotion") || !strings.Contains(out, fmt.Sprintf("to %d", band)) {
		t.Errorf("no promotion in the audit trail:\n%s", out)
	}
	if out := e.brokerCLI("reclaim", "list"); strings.Count(out, "executed") != 1 {
		t.Errorf("the promoted job was reclaimed:\n%s", out)
	}
	if e.unadmitted("vision", "extra") {
		t.Errorf("the promoted job read as unadmitted")
	}

	// N8: extra, stopped, registered again straight in Nomad as it ran
	// (promoted, its stamp and its grant unchanged), is not the broker's
	// admission: the grant was for the run that stopped.
	e.stop("vision", "extra")
	testcluster.WaitFor(t, 30*time.Second, "extra's stop recorded", func() error {
		if p, _, err := consulKV(consul).Get(jobRecord("stopped", "vision", "extra"), nil); err != nil || p == nil {
			return fmt.Errorf("no record (%v)", err)
		}
		return nil
	})
	replay, _, err := n.API.Jobs().Info("extra", &api.QueryOptions{Namespace: "vision"})
	if err != nil {
		t.Fatal(err)
	}
	replay.Stop = ptr(false)
	if _, _, err := n.API.Jobs().Register(replay, nil); err != nil {
		t.Fatal(err)
	}
	e.waitRunning("vision", "extra")
	testcluster.WaitFor(t, 30*time.Second, "the replay read as unadmitted", func() error {
		if !e.unadmitted("vision", "extra") {
			return fmt.Errorf("no unadmitted decision on extra")
		}
		return nil
	})
	// The replay runs on, holding vision's guarantee as extra did: the
	// sub-bands below are borrowed beside it.

	// borrowing.sub_bands: vision borrows old, then new (1 GPU each; the
	// node is full). The leader moves old up its sub-bands in place as the
	// GPU time at stake grows (1 GPU-second doubled each step), so that when
	// search needs a GPU, Nomad evicts new, which loses less.
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), strings.Replace(preemptPolicy, `backoff  = "0"`,
		"backoff  = \"0\"\n  sub_bands = true\n  sub_band_step = \"1s\"", 1))
	if out, err := e.run("vision", "old", 1, 1, "", true); err != nil || !strings.Contains(out, "borrowed: yes") {
		t.Fatalf("old: %v\n%s", err, out)
	}
	e.waitRunning("vision", "old")
	oldAlloc := allocOf("old")
	testcluster.WaitFor(t, 60*time.Second, "old in sub-band 25 (16 GPU-seconds at stake)", func() error {
		if p := *e.job("vision", "old").Priority; p < 25 {
			return fmt.Errorf("priority %d", p)
		}
		return nil
	})
	if out, err := e.run("vision", "new", 1, 1, "", true); err != nil || !strings.Contains(out, "borrowed: yes") {
		t.Fatalf("new: %v\n%s", err, out)
	}
	e.waitRunning("vision", "new")
	if out, err := e.run("search", "svc2", 1, 1, "", true); err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("svc2: %v\n%s", err, out)
	}
	e.waitRunning("search", "svc2")
	testcluster.WaitFor(t, 30*time.Second, "new back in the queue", func() error {
		if out := e.brokerCLI("queue", "list"); !strings.Contains(out, "new") {
			return fmt.Errorf("queue:\n%s", out)
		}
		return nil
	})
	if after := allocOf("old"); after != oldAlloc || oldAlloc == "" {
		t.Errorf("old's allocation %q became %q: evicted or replaced, not moved in place", oldAlloc, after)
	}
	old := e.job("vision", "old")
	if *old.Priority < 25 || *old.Priority > 29 || old.Meta["nomad-gpu.borrowed"] != "true" {
		t.Errorf("old at priority %d (want a sub-band from 25 to 29), meta %v", *old.Priority, old.Meta)
	}
	// Each move is a job version; Nomad carries the source submitted with
	// `nomad job run` forward to it (the body names the version read).
	if sub, _, err := n.API.Jobs().Submission("old", int(*old.Version), &api.QueryOptions{Namespace: "vision"}); err != nil || sub == nil ||
		!strings.Contains(sub.Source, `job "old"`) || *old.Version < 3 {
		t.Errorf("version %d of old after its moves: submitted source %+v, %v", *old.Version, sub, err)
	}
	waitPasses(t, e.broker, metrics.LoopReclaim, 2)
	if b := e.broker.Scrape()[`nomadgpu_tenant_gpus{gpu_class="all",kind="borrowed",tenant="vision"}`]; b != 1 {
		t.Errorf("vision borrows %v GPUs, want old's 1 (still borrowed in its sub-band)", b)
	}
	if e.unadmitted("vision", "old") {
		t.Errorf("a job moved to a sub-band read as unadmitted")
	}
	// A job in a sub-band was admitted at the borrowing band's base, which
	// its stamp was made for: a scale is decided at that priority (D5: it was
	// refused, "would run at priority 20 but the job runs at 2x").
	if out, err := e.nomadCLI("job", "scale", "-namespace", "vision", "-detach", "old", "g", "1"); err != nil {
		t.Errorf("scale of old in its sub-band: %v\n%s", err, out)
	}
	if p := *e.job("vision", "old").Priority; p < 25 {
		t.Errorf("old's priority after the scale: %d, want its sub-band's", p)
	}
}

// TestReclaimDecisionSurvivesLeaderKill: the leader records a decision and is
// SIGKILLed during its grace, before acting; the next leader carries it out,
// once, without deciding it again.
func TestReclaimDecisionSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "reclaim-ha", 4, "vision")
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), twoTenantPolicy+`
reclaim_settings {
  period = "1s"
}
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  grace      = "5s"
  mode       = "enforce"
}
`)
	brokers := startBrokerPair(t, n, consul, policyDir)
	direct := job("vision", "direct", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1))).j
	if _, _, err := n.API.Jobs().Register(direct, nil); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 30*time.Second, "a proposed decision", func() error {
		if recs := reclaimRecords(brokers[0]); len(recs) != 1 || recs[0].State != reclaim.Proposed {
			return fmt.Errorf("%+v", recs)
		}
		return nil
	})
	killedAt := time.Now()
	survivor := killLeader(t, consul, brokers)
	var recs []reclaim.Record
	testcluster.WaitFor(t, 60*time.Second, "the decision carried out by the next leader", func() error {
		if recs = reclaimRecords(survivor); len(recs) != 1 || recs[0].State != reclaim.Executed {
			return fmt.Errorf("%+v", recs)
		}
		return nil
	})
	if job, _, err := n.API.Jobs().Info("direct", &api.QueryOptions{Namespace: "vision"}); err != nil || job.Stop == nil || !*job.Stop {
		t.Errorf("direct not stopped: %v", err)
	}
	waitPasses(t, survivor, metrics.LoopReclaim, 3) // nothing decided again
	if recs = reclaimRecords(survivor); len(recs) != 1 || !strings.Contains(recs[0].Result, "job stopped") || !recs[0].ActingSince.After(killedAt) {
		t.Errorf("want one decision, carried out once, by the next leader: %+v", recs)
	}
}

// TestLifetime: a dev job is stopped at its lifetime, or earlier at its own
// nomad-gpu.ttl; one asking for more than the rule's max_extend is refused
// at admission, naming the rule.
func TestLifetime(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "ttl", 4, "vision")
	e := brokerEnv(t, n, consul, reclaimBase+`
reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "8s"
  max_extend   = "4s"
  action       = "stop"
  mode         = "enforce"
}
`, "vision", 4, testcluster.BrokerOptions{})
	submit := func(id, ttl string) (int, string) {
		j := job("vision", id, api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		j.j.Meta = map[string]string{"nomad-gpu.queue": "dev"}
		if ttl != "" {
			j.j.Meta["nomad-gpu.ttl"] = ttl
		}
		req, _ := http.NewRequest(http.MethodPut, e.broker.Addr+"/v1/jobs", strings.NewReader(j.body(nil, canonical)))
		resp, err := e.broker.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	if status, out := submit("too-long", "13s"); status != http.StatusForbidden || !strings.Contains(out, "rejected by rule dev-ttl") {
		t.Errorf("ttl beyond max_extend: %d %s", status, out)
	}
	start := time.Now()
	for _, c := range []struct{ id, ttl string }{{"short", "3s"}, {"default", ""}} {
		if status, out := submit(c.id, c.ttl); status != http.StatusOK || !strings.Contains(out, "admitted") {
			t.Fatalf("%s: %d %s", c.id, status, out)
		}
	}
	// How long its task ran when the job was stopped: the rules count from
	// the task's start, whatever Nomad took to place it.
	ranFor := func(id string) time.Duration {
		var ran time.Duration
		testcluster.WaitFor(t, 40*time.Second, id+" stopped", func() error {
			job, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: "vision"})
			if err != nil || job.Stop == nil || !*job.Stop {
				return fmt.Errorf("running (%v)", err)
			}
			allocs, _, err := n.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: "vision"})
			if err != nil || len(allocs) == 0 {
				return fmt.Errorf("no allocation (%v)", err)
			}
			for _, ts := range allocs[0].TaskStates {
				if ts.StartedAt.IsZero() || ts.FinishedAt.IsZero() {
					return fmt.Errorf("task not finished yet")
				}
				ran = ts.FinishedAt.Sub(ts.StartedAt)
			}
			return nil
		})
		return ran
	}
	short, def := ranFor("short"), ranFor("default")
	t.Logf("stopped %s after submission", time.Since(start).Round(time.Second))
	if short >= 7*time.Second || def < 8*time.Second {
		t.Errorf("tasks ran %s (ttl 3s) and %s (lifetime 8s) before their jobs were stopped", short, def)
	}
	if job := e.job("vision", "short"); job.Meta["nomad-gpu.ttl"] != "3s" {
		t.Errorf("the job's own ttl did not reach Nomad: meta %v", job.Meta)
	}
}

// reclaimRecords are the reclaim decisions broker b lists (none when it
// cannot be reached).
func reclaimRecords(b *testcluster.Broker) []reclaim.Record {
	req, _ := http.NewRequest(http.MethodGet, b.Addr+"/v1/gpu/reclaim", nil)
	resp, err := b.Client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var recs []reclaim.Record
	json.NewDecoder(resp.Body).Decode(&recs)
	return recs
}

// runningAllocs says which allocations run, at which priority, for a
// placement that did not happen.
func runningAllocs(n *testcluster.Nomad) string {
	stubs, _, err := n.API.Allocations().List(&api.QueryOptions{Namespace: "*"})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, s := range stubs {
		if s.ClientStatus == api.AllocClientStatusRunning || s.ClientStatus == api.AllocClientStatusPending {
			j, _, _ := n.API.Jobs().Info(s.JobID, &api.QueryOptions{Namespace: s.Namespace})
			prio := 0
			if j != nil && j.Priority != nil {
				prio = *j.Priority
			}
			out = append(out, fmt.Sprintf("%s/%s (%s, priority %d)", s.Namespace, s.JobID, s.ClientStatus, prio))
		}
	}
	return strings.Join(out, ", ")
}

// A tenant's own order holds (issue 57): extra, borrowed and preempted by
// search's guaranteed service once (max_preemptions = 1), runs only within
// vision's guarantee from then on. vision's newer job, submitted while extra
// waits and GPUs are idle, is queued behind it, not admitted borrowed: once
// vision's own job ends, extra starts, and the newer job after it.
// Its own agents: the scenario needs the node to itself from a real
// preemption to the order of two registrations, which any other test's
// jobs on a shared node would change.
func TestATenantsCappedJobStartsBeforeItsNewerWork(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "capped", 4, "vision", "search")
	policy := strings.Replace(preemptPolicy, `backoff  = "0" # borrowed again at once: TestBroker has the backoff`, "backoff  = \"0\"\n  max_preemptions = 1", 1)
	e := brokerEnv(t, n, consul, policy, "vision", 4, testcluster.BrokerOptions{})
	for _, c := range []struct{ id, want string }{{"own", "borrowed: no"}, {"extra", "borrowed: yes"}} {
		if out, err := e.run("vision", c.id, 1, 2, "", true); err != nil || !strings.Contains(out, c.want) {
			t.Fatalf("%s: %v\n%s", c.id, err, out)
		}
		e.waitRunning("vision", c.id)
	}
	if out, err := e.run("search", "svc", 1, 2, "", true); err != nil || !strings.Contains(out, "borrowed: no") {
		t.Fatalf("svc: %v\n%s", err, out)
	}
	e.waitRunning("search", "svc")
	testcluster.WaitFor(t, 30*time.Second, "extra back in the queue, borrowing no more", func() error {
		if out := e.brokerCLI("queue", "list"); !strings.Contains(out, "extra") || !strings.Contains(out, "borrowing no more") {
			return fmt.Errorf("queue:\n%s", out)
		}
		return nil
	})
	from := passes(t, e.broker, metrics.LoopQueue)
	e.stop("search", "svc")
	e.waitUsed("search", 0)
	waitPassesSince(t, e.broker, metrics.LoopQueue, from, 1) // extra stays: vision holds its guarantee
	out, err := e.run("vision", "newer", 1, 2, "", true)
	if err != nil || !strings.Contains(out, "queued as") || !strings.Contains(out, `tenant "vision" has a job queued since`) {
		t.Fatalf("newer (2 GPUs, 2 idle) while vision's capped extra waits: want queued behind it: %v\n%s", err, out)
	}
	e.stop("vision", "own")
	e.waitRunning("vision", "extra")
	e.waitRunning("vision", "newer")
	extra, newer := e.job("vision", "extra"), e.job("vision", "newer")
	if *newer.CreateIndex < *extra.JobModifyIndex {
		t.Errorf("newer was registered (index %d) before extra ran again (index %d)", *newer.CreateIndex, *extra.JobModifyIndex)
	}
	if newer.Meta["nomad-gpu.borrowed"] != "true" || extra.Meta["nomad-gpu.borrowed"] == "true" {
		t.Errorf("extra within vision's guarantee, newer borrowed: got borrowed %q and %q", extra.Meta["nomad-gpu.borrowed"], newer.Meta["nomad-gpu.borrowed"])
	}
}
