package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/browser"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// uiPolicy: vision borrows beyond its guarantee of 2, search holds 4 at a
// higher priority; one priced class, so that the dashboard's cost has a price.
const uiPolicy = `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
gpu_class "h100" {
  models             = ["` + testbuild.H100 + `"]
  price_per_gpu_hour = 2.5
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 6
  budget {
    gpu_hours = 100
    period    = "month"
  }
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
  period = "1s"
}
`

// TestWebUI drives the broker's web UI in headless Chromium against a real
// cluster (Consul, two Nomad nodes of 4 and 2 simulated GPUs, the broker),
// saving a screenshot of each view. Then it checks that every metric the
// Grafana dashboard queries is one the broker or Nomad exposes.
func TestWebUI(t *testing.T) {
	t.Parallel()
	tab := browser.New(t)
	consul := testcluster.StartConsul(t)
	state := filepath.Join(t.TempDir(), "gpu-state.json")
	setState := func(s map[string]map[string]any) {
		b, _ := json.Marshal(s)
		writeFile(t, state+".tmp", string(b))
		if err := os.Rename(state+".tmp", state); err != nil {
			t.Fatal(err)
		}
	}
	setState(map[string]map[string]any{})
	plugin := func(prefix string, count int) string {
		return fmt.Sprintf(`
    backend            = "fake"
    stats_period       = "1s"
    fingerprint_period = "1s"
    fake {
      count      = %d
      id_prefix  = %q
      state_file = %q
    }`, count, prefix, state)
	}
	const telemetry = `
  prometheus_metrics         = true
  publish_node_metrics       = true
  publish_allocation_metrics = true`
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "ui-1", Server: true, Client: true, PluginConfig: plugin("ui1", 4), TelemetryHCL: telemetry})
	n2 := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "ui-2", Client: true, Join: []string{n.RPCAddr}, PluginConfig: plugin("ui2", 2), TelemetryHCL: telemetry})
	nodes := n.WaitForNodes(t, 2)
	for _, ns := range []string{"vision", "search"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e := brokerEnv(t, n, consul, uiPolicy, "vision", 4, testcluster.BrokerOptions{})
	testcluster.WaitFor(t, 30*time.Second, "batch preemption on", func() error {
		if cfg, _, err := n.API.Operator().SchedulerGetConfiguration(nil); err != nil || !cfg.SchedulerConfig.PreemptionConfig.BatchSchedulerEnabled {
			return fmt.Errorf("not yet (%v)", err)
		}
		return nil
	})
	gpuOf := map[string]string{} // a GPU of each node, by node name
	for _, nd := range nodes {
		gpuOf[nd.Name] = nd.NodeResources.Devices[0].Instances[0].ID
	}
	rows := "JSON.stringify([...document.querySelectorAll('#map-rows .row')].map(r => [r.dataset.node, r.dataset.gpus]))"

	browser.Navigate(t, tab, e.broker.Addr+"/gpu/#map")

	t.Run("the map shows each node with its GPUs", func(t *testing.T) {
		browser.WaitFor(t, tab, 20*time.Second, "both nodes", `document.querySelectorAll('#map-rows .row').length == 2`, rows)
		for name, want := range map[string]string{"ui-1": "4", "ui-2": "2"} {
			got := browser.Eval[string](t, tab, fmt.Sprintf(`document.querySelector('.row[data-node=%q]').dataset.gpus + '/' +
				document.querySelectorAll('.row[data-node=%q] .cell').length`, name, name))
			if got != want+"/"+want {
				t.Errorf("node %s: %s GPUs (attribute/cells), want %s", name, got, want)
			}
		}
	})

	t.Run("a borrowed job shows as borrowed", func(t *testing.T) {
		e := e.in(t)
		if out, err := e.run("vision", "big", 1, 4, "", true); err != nil || !strings.Contains(out, "borrowed: yes") {
			t.Fatalf("want a borrowed admission: %v\n%s", err, out)
		}
		browser.WaitFor(t, tab, 30*time.Second, "4 borrowed GPUs of job big",
			`[...document.querySelectorAll('.cell[data-borrowed="true"]')].filter(c => c.getAttribute('href').startsWith('/ui/jobs/big@vision')).length == 4`, rows)
		browser.Screenshot(t, tab, "webui-map-borrowed")
	})

	t.Run("a queued job appears in the queue and goes when admitted", func(t *testing.T) {
		e := e.in(t)
		e.queued("waiter", 4, true)
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#queues")
		row := `document.querySelector('#queue-tables tr[data-job="waiter"]')`
		browser.WaitFor(t, tab, 15*time.Second, "waiter in the queue table", row, "document.getElementById('queue-tables').innerText")
		if text := browser.Eval[string](t, tab, row+".innerText"); !strings.Contains(text, "vision") || !strings.Contains(text, "limit") {
			t.Errorf("waiter's row says %q: want its tenant and why it waits (its limit)", text)
		}
		browser.Screenshot(t, tab, "webui-queues")
		e.stop("vision", "big")
		browser.WaitFor(t, tab, 30*time.Second, "waiter gone from the queue once admitted", "!"+row, "document.getElementById('queue-tables').innerText")
		e.waitRunning("vision", "waiter")
	})

	t.Run("a preempted borrowed job is shown in reclaim", func(t *testing.T) {
		e := e.in(t)
		if out, err := e.run("search", "infer", 1, 4, "", true); err != nil || !strings.Contains(out, "tenant search, queue inference") {
			t.Fatalf("want admission within search's guarantee: %v\n%s", err, out)
		}
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#reclaim")
		browser.WaitFor(t, tab, 45*time.Second, "the preemption of waiter", `[...document.querySelectorAll('#decided tr[data-job="waiter"]')].some(r => r.innerText.includes('preempted-borrowed'))`,
			"document.getElementById('decided').innerText")
		browser.Screenshot(t, tab, "webui-reclaim")
	})

	t.Run("tenants show their quota use", func(t *testing.T) {
		e := e.in(t)
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#tenants")
		browser.WaitFor(t, tab, 15*time.Second, "search using its 4 GPUs", `(document.querySelector('.tenant[data-tenant="search"]') || {}).innerText?.includes('used 4.0')`,
			"document.getElementById('tenant-bars').innerText")
		browser.WaitFor(t, tab, 15*time.Second, "vision's budget burn-down", `document.querySelector('.budget[data-tenant="vision"] svg polyline')`,
			"document.getElementById('budgets').innerText")
		if text := browser.Eval[string](t, tab, `document.querySelector('.budget[data-tenant="vision"]').innerText`); !strings.Contains(text, "of 100 GPU-hours this month") {
			t.Errorf("vision's budget says %q", text)
		}
		browser.Screenshot(t, tab, "webui-tenants")
	})

	t.Run("a GPU made unhealthy shows as unhealthy within seconds, utilisation as sampled", func(t *testing.T) {
		e := e.in(t)
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#map")
		sick := gpuOf["ui-2"]
		util := map[string]map[string]any{sick: {"healthy": false, "health_description": "XID 79: GPU has fallen off the bus"}}
		for _, nd := range nodes {
			for _, inst := range nd.NodeResources.Devices[0].Instances {
				if inst.ID != sick {
					util[inst.ID] = map[string]any{"utilization_gpu": 61}
				}
			}
		}
		start := time.Now()
		setState(util)
		cell := fmt.Sprintf(`document.querySelector('.cell[data-gpu=%q]')`, sick)
		browser.WaitFor(t, tab, 15*time.Second, "the sick GPU unhealthy", cell+`.dataset.state == 'unhealthy'`, cell+".title")
		t.Logf("unhealthy on the map %s after the state file said so", time.Since(start).Round(100*time.Millisecond))
		if title := browser.Eval[string](t, tab, cell+".title"); !strings.Contains(title, "XID 79: GPU has fallen off the bus") {
			t.Errorf("the unhealthy GPU's details %q lack the plugin's reason", title)
		}
		held := fmt.Sprintf(`document.querySelector('.cell[data-gpu=%q]')`, gpuOf["ui-1"])
		browser.WaitFor(t, tab, 30*time.Second, "utilisation 61% on a held GPU", held+`.title.includes('utilisation: 61%')`, held+".title")
		browser.Screenshot(t, tab, "webui-map-unhealthy")
	})

	t.Run("job links reach Nomad's own UI through the broker", func(t *testing.T) {
		e := e.in(t)
		resp, err := http.Get(e.broker.Addr + "/ui/jobs/infer@search")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /ui/jobs/infer@search through the broker: %v %v", err, resp)
		}
		resp.Body.Close()
	})

	t.Run("every metric the Grafana dashboard queries is exposed", func(t *testing.T) {
		e := e.in(t)
		queried := dashboardMetrics(t, "../../dashboards/nomad-gpu.json")
		if len(queried) < 20 {
			t.Fatalf("the dashboard queries only %d metrics: %v", len(queried), queried)
		}
		// Nomad's raft gauges show from its first metrics interval on: a
		// loaded machine may scrape before it.
		testcluster.WaitFor(t, 30*time.Second, "every metric the dashboard queries", func() error {
			exposed := map[string]bool{}
			for _, series := range []map[string]float64{e.broker.Scrape(),
				testcluster.Scrape(t, http.DefaultClient, n.Addr+"/v1/metrics?format=prometheus"),
				testcluster.Scrape(t, http.DefaultClient, n2.Addr+"/v1/metrics?format=prometheus")} {
				for s := range series {
					name, _, _ := strings.Cut(s, "{")
					exposed[name] = true
				}
			}
			var missing []string
			for _, m := range queried {
				if !exposed[m] {
					missing = append(missing, m)
				}
			}
			if len(missing) == 0 {
				return nil
			}
			var have []string
			for m := range exposed {
				if strings.HasPrefix(m, "nomadgpu_") || strings.HasPrefix(m, "nomad_nomad") || strings.HasPrefix(m, "nomad_raft") || strings.HasPrefix(m, "nomad_client") {
					have = append(have, m)
				}
			}
			sort.Strings(have)
			return fmt.Errorf("the dashboard queries metrics no running broker or Nomad exposes: %v\nexposed: %v", missing, have)
		})
	})
}

// metricName is a metric name in a PromQL expression: every metric of the
// broker starts nomadgpu_ or, under DCGM's names, DCGM_FI_; every one of
// Nomad's nomad_.
var metricName = regexp.MustCompile(`\b(?:nomad(?:gpu)?_|DCGM_FI_)[A-Za-z0-9_:]+`)

// dashboardMetrics returns the metric names in every query of a Grafana
// dashboard: panels' expressions and template variables' queries.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	seen := map[string]bool{}
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(c, k)
			}
		case []any:
			for _, c := range v {
				walk(c, key)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				for _, m := range metricName.FindAllString(v, -1) {
					seen[m] = true
				}
			}
		}
	}
	walk(dash, "")
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}
