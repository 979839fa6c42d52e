package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

const policies = `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
queue "dev" { priority = 40 }

tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 4
  limit      = 8
}

tenant "search" {
  namespaces = ["search"]
  queues     = ["inference"]
  guaranteed = 4
  limit      = 4
}

borrowing {
  enabled  = true
  priority = 20
}

preemption {
  batch   = true
  service = true
}

reclaim_settings {
  period = "2s"
}
`

type env struct {
	t         *testing.T
	nomad     *testcluster.Nomad
	broker    *testcluster.Broker
	dir       string
	policyDir string
	// logged names the jobs whose task output is collected. Every other
	// test job runs without a log collector: one `nomad logmon` process per
	// task is most of the CPU the suite's agents use.
	logged map[string]bool
}

// dcgmPromises reads the README's DCGM compatibility tables: the metrics,
// and the labels each carries.
func dcgmPromises(t *testing.T, path string) (metrics, labels []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "## GPU metrics for existing dashboards\n")
	if !ok {
		t.Fatalf("%s has no section \"GPU metrics for existing dashboards\"", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	inLabels := false // the label table follows the metric table
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| label |") {
			inLabels = true
		}
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(line[2:], " |")
		for _, name := range regexp.MustCompile("`([A-Za-z_]+)`").FindAllStringSubmatch(first, -1) {
			if inLabels {
				labels = append(labels, name[1])
			} else {
				metrics = append(metrics, name[1])
			}
		}
	}
	if len(metrics) < 10 || len(labels) < 11 {
		t.Fatalf("%s promises %d metrics %v and %d labels %v: the tables were not read", path, len(metrics), metrics, len(labels), labels)
	}
	return metrics, labels
}

// seriesLabels are the labels of a series as the text format writes it.
func seriesLabels(key string) map[string]string {
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`).FindAllStringSubmatch(key, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestBroker runs the broker scenarios in order on one cluster: a Nomad agent
// with 8 simulated GPUs, Consul, and the broker in front, driven by the nomad CLI.
func TestBroker(t *testing.T) {
	t.Parallel()
	// A process: "queue survives a broker crash" SIGKILLs it.
	e, n, _ := startBrokerTest(t, testcluster.BrokerOptions{Process: true})
	e.logged["train-a"] = true

	t.Run("rejects name the rule and exit non-zero", func(t *testing.T) {
		e := e.in(t)
		cases := []struct {
			ns, queue, rule string
			count, gpus     int
		}{
			{"default", "", "unmapped-namespace", 1, 1},
			{"vision", "inference", "queue-not-allowed", 1, 1},
			{"vision", "", "above-limit", 3, 3},
			{"vision", "", "no-node-fits", 1, 9},
		}
		for _, c := range cases {
			out, err := e.run(c.ns, "rejected", c.count, c.gpus, c.queue, false)
			if err == nil || !strings.Contains(out, "403") || !strings.Contains(out, "rejected by rule "+c.rule) {
				t.Errorf("%s: want exit 1 with rule %s, got %v:\n%s", c.rule, c.rule, err, out)
			}
		}
	})

	t.Run("non-GPU job passes through untouched", func(t *testing.T) {
		e := e.in(t)
		out, err := e.run("default", "cpu-only", 1, 0, "", false)
		if err != nil || strings.Contains(out, "nomad-gpu") {
			t.Fatalf("want plain Nomad output, got %v:\n%s", err, out)
		}
		job := e.job("default", "cpu-only")
		if *job.Priority != 50 || job.Meta["nomad-gpu.tenant"] != "" {
			t.Errorf("non-GPU job changed: priority %d meta %v", *job.Priority, job.Meta)
		}
	})

	// What a change of band could do to a running job, asked of Nomad: an
	// update that changes only the priority keeps its allocation (an
	// in-place update), one that changes its meta replaces it.
	t.Run("Nomad changes a running job's priority in place, not its meta", func(t *testing.T) {
		e := e.in(t)
		j := job("default", "in-place", api.JobTypeService).group("g", ptr(1), nil, task())
		j.j.Priority, j.j.Meta = ptr(20), map[string]string{"nomad-gpu.borrowed": "true"}
		update := func(what string) *api.AllocationListStub {
			t.Helper()
			resp, _, err := n.API.Jobs().Register(j.j, nil)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			var running *api.AllocationListStub
			testcluster.WaitFor(t, 60*time.Second, "in-place: "+what, func() error {
				ev, _, err := n.API.Evaluations().Info(resp.EvalID, nil)
				if err != nil || ev.Status != api.EvalStatusComplete {
					return fmt.Errorf("evaluation not complete (%v)", err)
				}
				stubs, _, err := n.API.Jobs().Allocations("in-place", false, nil)
				if err != nil {
					return err
				}
				running = nil
				for _, a := range stubs {
					if a.DesiredStatus == api.AllocDesiredStatusRun && a.ClientStatus == api.AllocClientStatusRunning {
						if running != nil {
							return fmt.Errorf("two allocations running")
						}
						running = a
					}
				}
				if running == nil {
					return fmt.Errorf("none running")
				}
				if latest := e.job("default", "in-place"); running.JobVersion != *latest.Version {
					return fmt.Errorf("the allocation runs version %d of %d", running.JobVersion, *latest.Version)
				}
				return nil
			})
			return running
		}
		first := update("registered at priority 20")
		j.j.Priority = ptr(45)
		if again := update("priority 20 → 45"); again.ID != first.ID {
			t.Errorf("a priority-only update replaced allocation %s with %s", first.ID, again.ID)
		}
		j.j.Meta["nomad-gpu.borrowed"] = "false"
		again := update("meta borrowed → false")
		if again.ID == first.ID {
			t.Fatalf("a meta update kept allocation %s", first.ID)
		}
		// The broker's listing of Nomad leaves out the replaced allocation
		// once it has ended (Nomad filters it), and keeps the running one.
		testcluster.WaitFor(t, 30*time.Second, "the replaced allocation ended", func() error {
			a, _, err := n.API.Allocations().Info(first.ID, nil)
			if err != nil || a.ClientStatus != api.AllocClientStatusComplete {
				return fmt.Errorf("not ended yet (%v)", err)
			}
			return nil
		})
		c, err := nomadapi.New(n.Addr, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := c.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, a := range snap.Allocs {
			listed[a.ID] = true
		}
		if !listed[again.ID] || listed[first.ID] {
			t.Errorf("listing: the running allocation %t (want true), the ended one %t (want false)", listed[again.ID], listed[first.ID])
		}
		e.stop("default", "in-place")
	})

	t.Run("plan shows the decision without side effects", func(t *testing.T) {
		e := e.in(t)
		path := e.spec("vision", "planned", 1, 2, "")
		out, _ := e.nomadCLI("job", "plan", path) // exit 1 means "allocations would be created"
		if !strings.Contains(out, "nomad-gpu: would be admitted: tenant vision, queue training, priority 45") {
			t.Errorf("plan does not show the admission:\n%s", out)
		}
		if _, _, err := e.nomad.API.Jobs().Info("planned", &api.QueryOptions{Namespace: "vision"}); err == nil {
			t.Errorf("plan registered the job")
		}
		if list := e.brokerCLI("queue", "list", "-json"); strings.TrimSpace(list) != "[]" {
			t.Errorf("plan queued something: %s", list)
		}
	})

	t.Run("admitted job runs with its queue's priority and meta", func(t *testing.T) {
		e := e.in(t)
		out, err := e.run("vision", "train-a", 1, 4, "", false)
		if err != nil || !strings.Contains(out, "nomad-gpu: admitted: tenant vision, queue training, priority 45, 4 GPUs, borrowed: no") {
			t.Fatalf("nomad job run: %v\n%s", err, out)
		}
		job := e.job("vision", "train-a")
		if *job.Priority != 45 || job.Meta["nomad-gpu.tenant"] != "vision" || job.Meta["nomad-gpu.queue"] != "training" ||
			job.Meta["nomad-gpu.workload"] != "training" || !strings.HasPrefix(job.Meta["nomad-gpu.admission"], "v5:") {
			t.Errorf("job not stamped: priority %d meta %v", *job.Priority, job.Meta)
		}
		e.waitRunning("vision", "train-a")
		if out, err := e.nomadCLI("job", "status", "-namespace", "vision", "train-a"); err != nil || !strings.Contains(out, "running") {
			t.Errorf("nomad job status through the broker: %v\n%s", err, out)
		}
		out, err = e.nomadCLI("job", "scale", "-namespace", "vision", "-detach", "train-a", "g", "3")
		if err == nil || !strings.Contains(out, `scale of "train-a" rejected by rule above-limit: the job needs 12 GPUs`) {
			t.Errorf("scaling above the limit must be refused with the rule: %v\n%s", err, out)
		}
	})

	// The README's compatibility table is the contract: every metric and
	// label in it, scraped from the leader while train-a holds 4 GPUs.
	t.Run("GPU telemetry is served under DCGM's names and labels, as the README promises", func(t *testing.T) {
		e := e.in(t)
		promised, labels := dcgmPromises(t, "../../README.md")
		alloc := e.waitRunning("vision", "train-a")
		nodes, _, err := n.API.Nodes().List(nil)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes %v %v", nodes, err)
		}
		var series map[string][]map[string]string // by metric
		testcluster.WaitFor(t, 30*time.Second, "train-a's GPUs sampled", func() error {
			series = map[string][]map[string]string{}
			for key := range e.broker.Scrape() {
				name, _, _ := strings.Cut(key, "{")
				if strings.HasPrefix(name, "DCGM_") {
					series[name] = append(series[name], seriesLabels(key))
				}
			}
			held := 0
			for _, l := range series["DCGM_FI_DEV_GPU_UTIL"] {
				if l["alloc_id"] == alloc.ID {
					held++
				}
			}
			if held != 4 || len(series["DCGM_FI_DEV_GPU_UTIL"]) != 8 {
				return fmt.Errorf("%d series of train-a's allocation, %d in all", held, len(series["DCGM_FI_DEV_GPU_UTIL"]))
			}
			return nil
		})
		for _, m := range promised {
			if len(series[m]) != 8 {
				t.Errorf("%s: %d series, want one per GPU (8)", m, len(series[m]))
			}
			for _, l := range series[m] {
				for _, name := range labels {
					if _, ok := l[name]; !ok {
						t.Errorf("%s has no label %s: %v", m, name, l)
					}
				}
				gpu := l["gpu"]
				var i int
				fmt.Sscan(gpu, &i)
				want := map[string]string{"UUID": fake.UUID("broker", i), "device": "nvidia" + gpu, "modelName": "NVIDIA H100 80GB HBM3",
					"Hostname": nodes[0].Name, "pci_bus_id": fmt.Sprintf("00000000:%02X:00.0", i), "GPU_I_PROFILE": "", "GPU_I_ID": ""}
				if l["alloc_id"] == alloc.ID {
					want["namespace"], want["tenant"] = "vision", "vision"
					want["nomad_job"], want["task_group"], want["task"] = "train-a", "g", "t"
				}
				for k, v := range want {
					if l[k] != v {
						t.Errorf("%s: %s=%q, want %q (%v)", m, k, l[k], v, l)
					}
				}
			}
		}
		// The dashboard for one scrape target: every series and label its
		// queries and legends name is served, and its GPU variable (UUID)
		// tells every GPU apart.
		for _, q := range dashboardQueries(t, "../../dashboards/dcgm-cluster.json") {
			for _, m := range metricName.FindAllString(q, -1) {
				if len(series[m]) == 0 {
					t.Errorf("dcgm-cluster.json queries %s, which the broker does not serve: %s", m, q)
					continue
				}
				for _, label := range queryLabels.FindAllStringSubmatch(q, -1) {
					if _, ok := series[m][0][label[1]]; !ok {
						t.Errorf("dcgm-cluster.json: %s has no label %s: %s", m, label[1], q)
					}
				}
			}
		}
		uuids := map[string]bool{}
		for _, l := range series["DCGM_FI_DEV_GPU_TEMP"] {
			uuids[l["UUID"]] = true
		}
		if len(uuids) != 8 {
			t.Errorf("the GPU variable's label, UUID, has %d values for 8 GPUs", len(uuids))
		}
	})

	t.Run("Nomad's own API passes through: exec, logs, events, blocking queries", func(t *testing.T) {
		e := e.in(t)
		alloc := e.waitRunning("vision", "train-a")
		out, err := e.nomadCLI("alloc", "exec", "-namespace", "vision", "-task", "t", alloc.ID, "/bin/echo", "through-the-broker")
		if err != nil || !strings.Contains(out, "through-the-broker") {
			t.Errorf("nomad alloc exec (websocket) through the broker: %v\n%s", err, out)
		}
		if out, err := e.nomadCLI("alloc", "logs", "-namespace", "vision", "-stderr", alloc.ID, "t"); err != nil {
			t.Errorf("nomad alloc logs through the broker: %v\n%s", err, out)
		}
		client, _ := api.NewClient(&api.Config{Address: e.broker.Addr})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		events, err := client.EventStream().Stream(ctx, map[api.Topic][]string{api.TopicJob: {"*"}}, 0, &api.QueryOptions{Namespace: "*"})
		if err != nil {
			t.Fatalf("event stream through the broker: %v", err)
		}
		select {
		case ev := <-events:
			if ev.Err != nil || len(ev.Events) == 0 {
				t.Errorf("event stream through the broker: %+v", ev)
			}
		case <-ctx.Done():
			t.Errorf("no event through the broker in 10s")
		}
		_, meta, err := client.Jobs().List(&api.QueryOptions{Namespace: "vision"})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, meta2, err := client.Jobs().List(&api.QueryOptions{Namespace: "vision", WaitIndex: meta.LastIndex, WaitTime: 2 * time.Second})
		if err != nil || time.Since(start) < 1500*time.Millisecond || meta2.LastIndex < meta.LastIndex {
			t.Errorf("blocking query through the broker returned after %s (index %d → %d): %v", time.Since(start), meta.LastIndex, meta2.LastIndex, err)
		}
	})

	t.Run("borrowed job preempted by a tenant within its guarantee goes back to the queue", func(t *testing.T) {
		e := e.in(t)
		out, err := e.run("vision", "borrow-a", 1, 4, "", true)
		if err != nil || !strings.Contains(out, "priority 20, 4 GPUs, borrowed: yes") {
			t.Fatalf("want borrowed admission: %v\n%s", err, out)
		}
		borrowed := e.waitRunning("vision", "borrow-a")
		out, err = e.run("search", "infer-b", 1, 4, "", true)
		if err != nil || !strings.Contains(out, "tenant search, queue inference, priority 49") {
			t.Fatalf("want admission within guarantee: %v\n%s", err, out)
		}
		e.waitRunning("search", "infer-b")
		a, _, err := e.nomad.API.Allocations().Info(borrowed.ID, nil)
		if err != nil || a.DesiredStatus != api.AllocDesiredStatusEvict {
			t.Errorf("borrowed allocation not preempted: %v %+v", err, a)
		}
		// The broker puts the preempted job back in its queue: vision is no
		// longer charged for GPUs it does not hold.
		var requeued string
		testcluster.WaitFor(t, 30*time.Second, "borrow-a requeued", func() error {
			for _, line := range strings.Split(e.brokerCLI("queue", "list"), "\n") {
				if strings.Contains(line, "borrow-a") && strings.Contains(line, "preempted-borrowed") {
					requeued = strings.Fields(line)[1]
					return nil
				}
			}
			return fmt.Errorf("not in the queue")
		})
		if job := e.job("vision", "borrow-a"); job.Stop == nil || !*job.Stop {
			t.Errorf("requeued, but still registered in Nomad")
		}
		for _, u := range e.usage() {
			if u.Used > u.Limit || (u.Tenant == "vision" && u.Used != 4) {
				t.Errorf("tenant %s is charged %g GPUs (limit %g); vision holds 4", u.Tenant, u.Used, u.Limit)
			}
		}
		// Preempted while borrowed: it does not borrow again for the
		// policy's default backoff, and says so. The preemption came less
		// than a minute ago: its backoff ends this minute, or the one before.
		until := time.Now().UTC().Add(policy.DefaultBorrowBackoff)
		backoff := func(text string) bool {
			for _, at := range []time.Time{until, until.Add(-time.Minute)} {
				if strings.Contains(text, "borrowing again after "+at.Format("15:04")+" (preempted 1 time)") {
					return true
				}
			}
			return false
		}
		if list := e.brokerCLI("queue", "list"); !backoff(list) {
			t.Errorf("queue list does not show borrow-a's backoff (ending about %s):\n%s", until.Format("15:04"), list)
		}
		if show := e.brokerCLI("queue", "show", requeued); !strings.Contains(show, "Backoff") || !backoff(show) {
			t.Errorf("queue show:\n%s", show)
		}
		if v := e.broker.Scrape()[`nomadgpu_borrow_backoff_jobs{tenant="vision"}`]; v != 1 {
			t.Errorf("nomadgpu_borrow_backoff_jobs{tenant=\"vision\"} = %v, want 1", v)
		}
		out, err = e.run("vision", "borrow-a", 1, 4, "", true)
		if err != nil || !strings.Contains(out, "queued") || !backoff(out) {
			t.Errorf("submitted again in its backoff, borrow-a must wait, saying why: %v\n%s", err, out)
		}
		// Its owner would rather not wait.
		if out := e.brokerCLI("queue", "cancel", requeued); !strings.Contains(out, "cancelled") {
			t.Errorf("gpu-broker queue cancel:\n%s", out)
		}
	})

	t.Run("over quota is queued, shown, and admitted when the tenant's jobs stop", func(t *testing.T) {
		e := e.in(t)
		// vision holds train-a (4), its guarantee: 4 more must borrow, and search holds the other 4 GPUs.
		id := e.queued("train-q", 4, false)
		if list := e.brokerCLI("queue", "list"); !strings.Contains(list, id) || !strings.Contains(list, "train-q") {
			t.Fatalf("gpu-broker queue list does not show %s:\n%s", id, list)
		}
		if show := e.brokerCLI("queue", "show", id); !strings.Contains(show, "position 1") || !strings.Contains(show, "only 0 GPUs are idle") {
			t.Errorf("gpu-broker queue show:\n%s", show)
		}
		if _, _, err := e.nomad.API.Jobs().Info("train-q", &api.QueryOptions{Namespace: "vision"}); err == nil {
			t.Fatalf("a queued job must not be in Nomad yet")
		}
		other := e.queued("train-cancelled", 4, true)
		if out := e.brokerCLI("queue", "cancel", other); !strings.Contains(out, "cancelled") {
			t.Errorf("gpu-broker queue cancel:\n%s", out)
		}
		if list := e.brokerCLI("queue", "list"); strings.Contains(list, other) {
			t.Errorf("cancelled job still queued:\n%s", list)
		}
		stopped := time.Now()
		e.stop("vision", "train-a")
		e.stop("vision", "borrow-a")
		e.waitAdmitted(t, "vision", "train-q", 10*time.Second)
		t.Logf("queued job admitted %s after its tenant's jobs stopped", time.Since(stopped).Round(100*time.Millisecond))
		e.waitRunning("vision", "train-q")
	})

	t.Run("queue survives a broker crash and admits exactly once", func(t *testing.T) {
		e := e.in(t)
		// vision holds 4 of its guarantee of 4; 4 more must borrow, and no GPU is idle.
		id := e.queued("crash-q", 4, true)
		e.broker.Kill()
		e.broker.Start()
		if list := e.brokerCLI("queue", "list"); !strings.Contains(list, id) {
			t.Fatalf("queued job lost in the restart:\n%s", list)
		}
		e.stop("search", "infer-b")
		// The crashed broker's leader session expires within two TTLs (20s).
		e.waitAdmitted(t, "vision", "crash-q", 45*time.Second)
		e.waitRunning("vision", "crash-q")
		job := e.job("vision", "crash-q")
		if *job.Version != 0 || *job.Priority != 20 || job.Meta["nomad-gpu.borrowed"] != "true" {
			t.Errorf("want one registration, borrowed at priority 20: version %d priority %d meta %v", *job.Version, *job.Priority, job.Meta)
		}
		if list := e.brokerCLI("queue", "list"); strings.Contains(list, id) {
			t.Errorf("admitted job still queued:\n%s", list)
		}
	})

}

// startBrokerTest starts what TestBroker and TestBrokerPolicyAndGPUHealth
// run on: Consul, one Nomad node of 8 fake GPUs whose health is read from
// the state file it returns, and a broker with the policies above. It
// returns once the broker sees the GPUs and has switched Nomad's batch
// preemption on.
func startBrokerTest(t *testing.T, o testcluster.BrokerOptions) (*env, *testcluster.Nomad, string) {
	t.Helper()
	consul := testcluster.StartConsul(t)
	gpuState := filepath.Join(t.TempDir(), "gpu-state.json")
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "dev", Server: true, Client: true,
		ConsulAddr: consul.Addr, PluginConfig: fmt.Sprintf(`
    backend            = "fake"
    fingerprint_period = "2s"
    health_recovery    = "2s"
    fake {
      count      = 8
      id_prefix  = "broker"
      state_file = %q
    }`, gpuState)})
	n.WaitForNodes(t, 1)
	for _, ns := range []string{"vision", "search"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, nomad: n, dir: t.TempDir(), policyDir: t.TempDir(), logged: map[string]bool{}}
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), policies)
	e.broker = testcluster.StartBrokerWith(t, n, consul, e.policyDir, o)
	testcluster.WaitFor(t, 30*time.Second, "broker to see 8 GPUs", func() error {
		if cfg, _, err := n.API.Operator().SchedulerGetConfiguration(nil); err != nil || !cfg.SchedulerConfig.PreemptionConfig.BatchSchedulerEnabled {
			return fmt.Errorf("batch preemption not switched on yet (%v)", err)
		}
		out, _ := e.run("vision", "probe", 1, 9, "", false)
		if !strings.Contains(out, "no node has more than 8") {
			return fmt.Errorf("broker's view not ready: %s", out)
		}
		return nil
	})
	return e, n, gpuState
}

// TestBrokerPolicyAndGPUHealth: a sick GPU's recovery, and policy changes,
// moved out of TestBroker (its chain of subtests was the package's longest
// unit and set how long the package took). Agents of its own: it makes its
// node's GPU sick, takes every GPU of it, and rewrites its broker's policy,
// which no other test sharing them could bear.
func TestBrokerPolicyAndGPUHealth(t *testing.T) {
	t.Parallel()
	e, n, gpuState := startBrokerTest(t, testcluster.BrokerOptions{})

	t.Run("a job blocked on a sick GPU is placed when it recovers", func(t *testing.T) {
		e := e.in(t)
		sick := fake.UUID("broker", 0)
		writeFile(t, gpuState, fmt.Sprintf(`{%q: {"healthy": false, "health_description": "XID 79"}}`, sick))
		testcluster.WaitFor(t, 30*time.Second, "GPU unhealthy in Nomad", func() error {
			node := n.WaitForNodes(t, 1)[0]
			for _, d := range node.NodeResources.Devices {
				for _, inst := range d.Instances {
					if inst.ID == sick && !inst.Healthy {
						return nil
					}
				}
			}
			return fmt.Errorf("not yet")
		})
		// Straight to Nomad, so that only Nomad's own scheduling is involved.
		job := api.NewBatchJob("all-eight", "all-eight", "global", 50)
		job.Datacenters = []string{"*"}
		job.AddTaskGroup(api.NewTaskGroup("g", 1).AddTask(&api.Task{Name: "t", Driver: "raw_exec",
			Config: map[string]any{"command": "/bin/sleep", "args": []string{"3600"}}, LogConfig: &api.LogConfig{Disabled: ptr(true)},
			Resources: &api.Resources{CPU: ptr(20), MemoryMB: ptr(16),
				Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(8))}}}}))
		resp, _, err := n.API.Jobs().Register(job, nil)
		if err != nil {
			t.Fatal(err)
		}
		testcluster.WaitFor(t, 20*time.Second, "blocked evaluation", func() error {
			ev, _, err := n.API.Evaluations().Info(resp.EvalID, nil)
			if err != nil || ev.BlockedEval == "" {
				return fmt.Errorf("not blocked yet (%v)", err)
			}
			return nil
		})
		writeFile(t, gpuState, `{}`)
		e.waitRunning("default", "all-eight")
		if !strings.Contains(e.broker.Log(), "re-evaluated blocked jobs") {
			t.Errorf("placed without the broker's re-evaluation?")
		}
		e.stop("default", "all-eight")
	})

	t.Run("policy reload keeps the last good policy", func(t *testing.T) {
		e := e.in(t)
		path := filepath.Join(e.policyDir, "policy.hcl")
		writeFile(t, path, strings.Replace(policies, "limit      = 8", "limit      = 8\n  bogus = true", 1))
		time.Sleep(3 * time.Second)
		if limit := e.limitOf("vision"); limit != 8 {
			t.Fatalf("a broken policy was applied: vision limit %g", limit)
		}
		testcluster.WaitFor(t, 10*time.Second, "refusal logged", func() error {
			if !strings.Contains(e.broker.Log(), "policy reload refused") {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		// The stale policy is said, not only logged: policy status exits 1,
		// the metric is 1.
		status := exec.Command(testcluster.BrokerBinary(t), "policy", "status", "-address", e.broker.Addr)
		if out, err := status.CombinedOutput(); err == nil || !strings.Contains(string(out), "STALE") || !strings.Contains(string(out), "policy.hcl:") {
			t.Errorf("policy status with a refused reload: %v\n%s", err, out)
		}
		if n := e.broker.Scrape()["nomadgpu_policy_reload_failed"]; n != 1 {
			t.Errorf("nomadgpu_policy_reload_failed = %g, want 1", n)
		}
		loaded := e.broker.Scrape()["nomadgpu_policy_loaded_timestamp"]
		writeFile(t, path, strings.Replace(policies, "limit      = 8", "limit      = 6", 1))
		testcluster.WaitFor(t, 10*time.Second, "fixed policy applied", func() error {
			if l := e.limitOf("vision"); l != 6 {
				return fmt.Errorf("vision limit %g", l)
			}
			return nil
		})
		if out := e.brokerCLI("policy", "status"); strings.Contains(out, "STALE") || !strings.Contains(out, "3 queues, 2 tenants") {
			t.Errorf("policy status once fixed:\n%s", out)
		}
		if m := e.broker.Scrape(); m["nomadgpu_policy_reload_failed"] != 0 || m["nomadgpu_policy_loaded_timestamp"] <= loaded-1 || loaded == 0 {
			t.Errorf("once fixed: reload_failed %g, loaded at %g (before: %g)", m["nomadgpu_policy_reload_failed"], m["nomadgpu_policy_loaded_timestamp"], loaded)
		}
	})

	// A policy change never deletes a queued job: an empty file is refused,
	// and a policy without the job's tenant parks it with the reason until
	// the tenant is back.
	t.Run("a policy that drops a tenant parks its queued jobs, never deletes them", func(t *testing.T) {
		e := e.in(t)
		path := filepath.Join(e.policyDir, "policy.hcl")
		restored := strings.Replace(policies, "limit      = 8", "limit      = 6", 1)
		if free := 6 - int(e.usedBy("vision")); free > 0 {
			if out, err := e.run("vision", "hold", 1, free, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("holding vision's limit: %v\n%s", err, out)
			}
		}
		id := e.queued("waiter", 1, true)
		show := func() string { return e.brokerCLI("queue", "show", id) }

		writeFile(t, path, "")
		testcluster.WaitFor(t, 10*time.Second, "the empty file refused", func() error {
			if !strings.Contains(e.broker.Log(), "define no tenant, while the policy in force has 2") {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		start := strings.Index(restored, `tenant "vision"`)
		writeFile(t, path, restored[:start]+restored[start+strings.Index(restored[start:], "}\n")+2:]) // no tenant vision
		testcluster.WaitFor(t, 15*time.Second, "the entry parked", func() error {
			if out := show(); !strings.Contains(out, "the policy in force rejects it (rule unmapped-namespace") {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		writeFile(t, path, restored)
		testcluster.WaitFor(t, 15*time.Second, "the entry waiting again", func() error {
			if out := show(); strings.Contains(out, "policy in force rejects") {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		e.stop("vision", "hold")
		e.waitAdmitted(t, "vision", "waiter", 60*time.Second)
		e.stop("vision", "waiter")
	})

	// Guarantees that add up to more than the cluster (a warning, not an
	// error): search's inference job within its guarantee finds vision's
	// training job within its own on the GPUs it needs. Their bands (49 and
	// 45) are less than 10 apart, so Nomad does not evict vision's job; at
	// the queues' priorities (80 and 60) it would.
	t.Run("another tenant's guaranteed job does not evict guaranteed work", func(t *testing.T) {
		e := e.in(t)
		for _, ns := range []string{"vision", "search"} {
			jobs, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range jobs {
				if _, _, err := n.API.Jobs().Deregister(j.ID, true, &api.WriteOptions{Namespace: ns}); err != nil {
					t.Fatal(err)
				}
			}
		}
		overcommitted := strings.Replace(policies, "  queues     = [\"inference\"]\n  guaranteed = 4\n  limit      = 4", "  queues     = [\"inference\"]\n  guaranteed = 8\n  limit      = 8", 1)
		if overcommitted == policies {
			t.Fatal("search's guarantee not found in the policy")
		}
		writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), overcommitted)
		defer writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), policies)
		testcluster.WaitFor(t, 30*time.Second, "search's guarantee of 8, nothing held", func() error {
			if l, v, s := e.limitOf("search"), e.usedBy("vision"), e.usedBy("search"); l != 8 || v != 0 || s != 0 {
				return fmt.Errorf("search's limit %g, vision holds %g, search %g", l, v, s)
			}
			return nil
		})
		if out, err := e.run("vision", "keep", 1, 4, "", true); err != nil || !strings.Contains(out, "queue training, priority 45, 4 GPUs, borrowed: no") {
			t.Fatalf("vision within its guarantee: %v\n%s", err, out)
		}
		kept := e.waitRunning("vision", "keep")
		if out, err := e.run("search", "big", 1, 8, "", true); err != nil || !strings.Contains(out, "queue inference, priority 49, 8 GPUs, borrowed: no") {
			t.Fatalf("search within its guarantee: %v\n%s", err, out)
		}
		testcluster.WaitFor(t, 30*time.Second, "Nomad to block big's placement", func() error {
			if a, _, err := n.API.Allocations().Info(kept.ID, nil); err == nil && a.DesiredStatus != api.AllocDesiredStatusRun {
				t.Fatalf("vision's guaranteed job was %s for search's", a.DesiredStatus)
			}
			evals, _, err := n.API.Jobs().Evaluations("big", &api.QueryOptions{Namespace: "search"})
			if err != nil {
				return err
			}
			for _, ev := range evals {
				if ev.Status == api.EvalStatusBlocked {
					return nil
				}
			}
			return fmt.Errorf("%d evaluations, none blocked", len(evals))
		})
		if a, _, err := n.API.Allocations().Info(kept.ID, nil); err != nil || a.DesiredStatus != api.AllocDesiredStatusRun {
			t.Errorf("vision's guaranteed job was evicted for search's: %v %+v", err, a)
		}
		e.stop("search", "big")
		e.stop("vision", "keep")
	})
}

// queued submits a job the broker must queue and returns its queue id.
func (e *env) queued(id string, gpus int, detach bool) string {
	e.t.Helper()
	return e.queuedIn("vision", id, gpus, detach)
}

// queuedIn submits a job in namespace ns that must be queued; it returns its entry id.
func (e *env) queuedIn(ns, id string, gpus int, detach bool) string {
	e.t.Helper()
	out, err := e.run(ns, id, 1, gpus, "", detach)
	if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") || !strings.Contains(out, "in queue training") {
		e.t.Fatalf("nomad job run (detach=%t) of a queued job must exit 0 with the message: %v\n%s", detach, err, out)
	}
	rest := out[strings.Index(out, "queued as ")+len("queued as "):]
	return strings.TrimSuffix(strings.Fields(rest)[0], ",")
}

func (e *env) waitAdmitted(t *testing.T, ns, id string, timeout time.Duration) {
	t.Helper()
	testcluster.WaitFor(t, timeout, id+" admitted from the queue", func() error {
		_, _, err := e.nomad.API.Jobs().Info(id, &api.QueryOptions{Namespace: ns})
		return err
	})
}

// run submits a job through the broker with the nomad CLI.
func (e *env) run(ns, id string, count, gpus int, queue string, detach bool) (string, error) {
	args := []string{"job", "run"}
	if detach {
		args = append(args, "-detach")
	}
	return e.nomadCLI(append(args, e.spec(ns, id, count, gpus, queue))...)
}

// spec writes a raw_exec batch jobspec and returns its path.
func (e *env) spec(ns, id string, count, gpus int, queue string) string {
	meta := ""
	if queue != "" {
		meta = fmt.Sprintf(`meta = { "nomad-gpu.queue" = %q }`, queue)
	}
	device := ""
	if gpus > 0 {
		device = fmt.Sprintf(`device "nvidia/gpu" { count = %d }`, gpus)
	}
	noLogs := !e.logged[id]
	spec := fmt.Sprintf(`job %q {
  namespace   = %q
  type        = "batch"
  datacenters = ["*"]
  %s
  group "g" {
    count = %d
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      logs {
        disabled = %t
      }
      resources {
        cpu    = 20
        memory = 16
        %s
      }
    }
  }
}
`, id, ns, meta, count, noLogs, device)
	path := filepath.Join(e.dir, id+".nomad.hcl")
	writeFile(e.t, path, spec)
	return path
}

func (e *env) nomadCLI(args ...string) (string, error) {
	cmd := exec.Command(tools.Binary(e.t, "nomad"), args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+e.broker.Addr)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) brokerCLI(args ...string) string {
	cmd := exec.Command(testcluster.BrokerBinary(e.t), args...)
	cmd.Env = append(os.Environ(), "GPU_BROKER_ADDR="+e.broker.Addr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("gpu-broker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *env) usage() []gpuapi.TenantUsage {
	var rows []gpuapi.TenantUsage
	if err := json.Unmarshal([]byte(e.brokerCLI("usage", "-json")), &rows); err != nil {
		e.t.Fatal(err)
	}
	return rows
}

func (e *env) limitOf(tenant string) float64 {
	for _, u := range e.usage() {
		if u.Tenant == tenant {
			return u.Limit
		}
	}
	return -1
}

func (e *env) job(ns, id string) *api.Job {
	e.t.Helper()
	job, _, err := e.nomad.API.Jobs().Info(id, &api.QueryOptions{Namespace: ns})
	if err != nil {
		e.t.Fatalf("job %s/%s: %v", ns, id, err)
	}
	return job
}

func (e *env) waitRunning(ns, id string) *api.AllocationListStub {
	e.t.Helper()
	var running *api.AllocationListStub
	testcluster.WaitFor(e.t, 60*time.Second, id+" running", func() error {
		stubs, _, err := e.nomad.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: ns})
		if err != nil {
			return err
		}
		for _, s := range stubs {
			if s.ClientStatus == api.AllocClientStatusRunning && s.DesiredStatus == api.AllocDesiredStatusRun {
				running = s
				return nil
			}
		}
		return fmt.Errorf("%d allocations, none running", len(stubs))
	})
	return running
}

func (e *env) stop(ns, id string) {
	e.t.Helper()
	if _, _, err := e.nomad.API.Jobs().Deregister(id, false, &api.WriteOptions{Namespace: ns}); err != nil {
		e.t.Fatalf("stop %s: %v", id, err)
	}
}

// startGPUNode starts a Nomad agent (server and client) with gpus fake GPUs
// and the given namespaces.
func startGPUNode(t *testing.T, name string, gpus int, namespaces ...string) *testcluster.Nomad {
	t.Helper()
	return startGPUNodeWithState(t, name, gpus, "", namespaces...)
}

// startGPUCluster starts a Nomad cluster of nodes clients of gpus fake GPUs
// each (the first one also its server) with namespaces, and waits for them.
func startGPUCluster(t *testing.T, name string, nodes, gpus int, namespaces ...string) *testcluster.Nomad {
	t.Helper()
	plugin := func(i int) string {
		return fmt.Sprintf(`
    backend = "fake"
    fake {
      count     = %d
      id_prefix = "%s%d"
    }`, gpus, name, i)
	}
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: name + "-1", Server: true, Client: true, PluginConfig: plugin(1)})
	for i := 2; i <= nodes; i++ {
		testcluster.StartNomad(t, testcluster.NomadOptions{Name: fmt.Sprintf("%s-%d", name, i), Client: true, Join: []string{n.RPCAddr},
			PluginConfig: plugin(i)})
	}
	n.WaitForNodes(t, nodes)
	for _, ns := range namespaces {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// startGPUNodeWithState is startGPUNode whose fake GPUs read their health
// and utilisation from the state file (when not ""), every second.
func startGPUNodeWithState(t *testing.T, name string, gpus int, state string, namespaces ...string) *testcluster.Nomad {
	t.Helper()
	periods, stateFile := "", ""
	if state != "" {
		periods = `
    stats_period       = "1s"
    fingerprint_period = "1s"`
		stateFile = fmt.Sprintf("\n      state_file = %q", state)
	}
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: name, Server: true, Client: true, PluginConfig: fmt.Sprintf(`
    backend = "fake"%s
    fake {
      count     = %d
      id_prefix = %q%s
    }`, periods, gpus, name, stateFile)})
	n.WaitForNodes(t, 1)
	for _, ns := range namespaces {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// waitForView waits until try's request for one GPU more than a node has is
// refused by rule no-node-fits: the broker then sees nodes of gpus GPUs.
func waitForView(t *testing.T, gpus int, try func() string) {
	t.Helper()
	testcluster.WaitFor(t, 60*time.Second, fmt.Sprintf("the broker's view of nodes with %d GPUs", gpus), func() error {
		if out := try(); !strings.Contains(out, fmt.Sprintf("no node has more than %d", gpus)) {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
}

// brokerEnv starts a broker (options o) in front of n with policy src, and
// waits until it sees nodes of gpus GPUs, probing in namespace ns.
func brokerEnv(t *testing.T, n *testcluster.Nomad, consul *testcluster.Consul, src, ns string, gpus int, o testcluster.BrokerOptions) *env {
	t.Helper()
	e := &env{t: t, nomad: n, dir: t.TempDir(), policyDir: t.TempDir()}
	writeFile(t, filepath.Join(e.policyDir, "policy.hcl"), src)
	e.broker = testcluster.StartBrokerWith(t, n, consul, e.policyDir, o)
	waitForView(t, gpus, func() string {
		out, _ := e.run(ns, "probe", 1, gpus+1, "", false)
		return out
	})
	return e
}

// usedBy is the GPUs the broker charges tenant.
func (e *env) usedBy(tenant string) float64 {
	for _, u := range e.usage() {
		if u.Tenant == tenant {
			return u.Used
		}
	}
	return -1
}

// unadmitted reports whether gpu-broker reclaim list has a decision of the
// rule named unadmitted on job ns/id.
func (e *env) unadmitted(ns, id string) bool {
	e.t.Helper()
	var recs []reclaim.Record
	if err := json.Unmarshal([]byte(e.brokerCLI("reclaim", "list", "-json")), &recs); err != nil {
		e.t.Fatal(err)
	}
	for _, r := range recs {
		if r.Rule == "unadmitted" && r.Namespace == ns && r.Job == id {
			return true
		}
	}
	return false
}

// waitUsed waits until the broker counts want GPUs used by tenant: an
// update's old allocations hold theirs until their tasks end.
func (e *env) waitUsed(tenant string, want float64) {
	e.t.Helper()
	testcluster.WaitFor(e.t, 60*time.Second, fmt.Sprintf("tenant %s using %g GPUs", tenant, want), func() error {
		if got := e.usedBy(tenant); got != want {
			return fmt.Errorf("%g used; %s", got, e.holders(tenant))
		}
		return nil
	})
}

// holders says, for a wait's failure, which allocations of tenant's jobs
// the broker's GPU map has holding GPUs, and how Nomad has each of those
// jobs' allocations.
func (e *env) holders(tenant string) string {
	var m gpuapi.GPUMap
	resp, err := e.broker.Client.Get(e.broker.Addr + "/v1/gpu/nodes")
	if err != nil {
		return fmt.Sprintf("no GPU map: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return fmt.Sprintf("no GPU map: %v", err)
	}
	held, jobs := map[string]int{}, map[[2]string]bool{}
	for _, n := range m.Nodes {
		for _, g := range n.GPUs {
			if g.Tenant == tenant {
				held[g.Namespace+"/"+g.Job+" alloc "+g.Alloc]++
				jobs[[2]string{g.Namespace, g.Job}] = true
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the broker's GPU map has %v held", held)
	for k := range jobs {
		stubs, _, err := e.nomad.API.Jobs().Allocations(k[1], true, &api.QueryOptions{Namespace: k[0]})
		fmt.Fprintf(&b, "; Nomad's allocations of %s/%s (%v):", k[0], k[1], err)
		for _, a := range stubs {
			fmt.Fprintf(&b, " %s v%d %s/%s", a.ID, a.JobVersion, a.DesiredStatus, a.ClientStatus)
		}
	}
	return b.String()
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// waitPasses waits until the leader b has finished n more passes of loop
// than it had when called: what a test waits for instead of a fixed sleep.
func waitPasses(t *testing.T, b *testcluster.Broker, loop string, n int) {
	t.Helper()
	waitPassesSince(t, b, loop, passes(t, b, loop), n)
}

// passes is how many passes of loop the broker finished so far.
func passes(t *testing.T, b *testcluster.Broker, loop string) float64 {
	t.Helper()
	return b.Scrape()[`nomadgpu_leader_passes_total{loop="`+loop+`",result="ok"}`]
}

// waitPassesSince waits until the broker finished n passes of loop since it
// had finished from (passes). The queue's loop passes only when something
// it decides on changed: count from before the change a test waits out.
func waitPassesSince(t *testing.T, b *testcluster.Broker, loop string, from float64, n int) {
	t.Helper()
	testcluster.WaitFor(t, time.Duration(n)*15*time.Second, fmt.Sprintf("%d more %s passes", n, loop), func() error {
		if got := passes(t, b, loop); got < from+float64(n) {
			return fmt.Errorf("%g so far", got-from)
		}
		return nil
	})
}

// queryLabels are the label names a query's selectors match on (name=~…,
// name=…), its legend names ({{name}}) and label_values' label.
var queryLabels = regexp.MustCompile(`(?:[{,]|\{\{)\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!=|=|\}\}|\))`)

// dashboardQueries returns every query of a Grafana dashboard (panels'
// expressions with their legends, template variables' queries).
func dashboardQueries(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Targets []struct {
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			out = append(out, v.Definition)
		}
	}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			out = append(out, target.Expr+" "+target.Legend)
		}
	}
	if len(out) < 10 {
		t.Fatalf("%s: only %d queries read", path, len(out))
	}
	return out
}
