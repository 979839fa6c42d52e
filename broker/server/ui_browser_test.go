package server

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim/reclaimtest"
	"github.com/nomad-gpu/nomad-gpu/testing/browser"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// largeCluster fills the view as a listing of a cluster of nodes would:
// 8 GPUs a node, a third held by admitted jobs (some borrowed), some idle,
// unhealthy and recovering, every 50th node draining.
func largeCluster(s *testFront, nodes int) {
	snap := cluster.Snapshot{}
	samples := map[string]cluster.Sample{}
	for i := range nodes {
		n := testbuild.Node(fmt.Sprintf("node-%04d", i), testbuild.H100, 7, 1)
		n.Name, n.NodePool = fmt.Sprintf("gpu-%04d", i), []string{"training", "inference"}[i%2]
		if i%50 == 0 {
			n.DrainStrategy = &api.DrainStrategy{}
			n.SchedulingEligibility = api.NodeSchedulingIneligible
		}
		n.NodeResources.Devices[0].Instances[7].HealthDescription = []string{"XID 79: GPU has fallen off the bus", "recovering: healthy for 20s of 60s"}[i%2]
		snap.Nodes = append(snap.Nodes, n)
		if i%3 == 0 {
			tenant := []string{"vision", "speech"}[i%2]
			job := testbuild.Job(tenant, fmt.Sprintf("train-%d", i)).Group("g", 1, 4, "gpu").Priority(60).Build()
			d := admission.Decision{Outcome: admission.Admit, Tenant: tenant, Queue: "training", Priority: 60}
			if i%9 == 0 {
				d.Outcome = admission.AdmitBorrowed
			}
			for k, v := range nomadjob.BrokerMeta(d, s.o.Stamper.Stamp(nomadjob.Namespace(job), job, d)) {
				job.Meta[k] = v
			}
			snap.Jobs = append(snap.Jobs, job)
			var gpus []string
			for g := range 4 {
				id := fmt.Sprintf("%s-%d", n.ID, g)
				gpus = append(gpus, id)
				util := 90.0
				if i%6 == 0 {
					util = 1
				}
				samples[id] = cluster.Sample{Utilization: &util}
			}
			snap.Allocs = append(snap.Allocs, testbuild.Alloc(fmt.Sprintf("alloc-%d", i), tenant, *job.ID, n.ID, uint64(10+i), gpus...).Build())
		}
	}
	view := cluster.NewView(s.o.Stamper.Verify)
	view.Reset(snap)
	view.SetSamples(samples)
	s.set(func(o *Options, a *gpuapi.Options) { o.Cluster, a.Cluster = view, view })
}

// The map of a 1,000-node cluster in a real browser: every node and GPU
// counted, only the rows in sight in the page, scrolling and filters work;
// the render time is logged (a figure, not a pass mark: see docs/performance.md).
func TestTheMapOfALargeClusterInABrowser(t *testing.T) {
	tab := browser.New(t)
	s, _, _, _ := newTestServer(t)
	largeCluster(s, 1000)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	browser.Navigate(t, tab, srv.URL+"/gpu/#map")
	browser.WaitFor(t, tab, 20*time.Second, "the map", "window.nomadGPU.renders > 0", "document.getElementById('status').textContent")
	if nodes, gpus := browser.Eval[int](t, tab, "window.nomadGPU.nodes"), browser.Eval[int](t, tab, "window.nomadGPU.gpus"); nodes != 1000 || gpus != 8000 {
		t.Fatalf("the map counts %d nodes, %d GPUs; want 1000, 8000", nodes, gpus)
	}
	rows := browser.Eval[int](t, tab, "document.querySelectorAll('#map-rows .row').length")
	if rows == 0 || rows > 100 {
		t.Errorf("%d node rows in the page: want only those in sight (under 100)", rows)
	}
	ms := browser.Eval[float64](t, tab, "window.nomadGPU.lastRenderMs")
	t.Logf("render of 1,000 nodes / 8,000 GPUs: %.1f ms, %d rows in the DOM", ms, rows)
	// Each state as many times as the broker's map has it.
	count := map[string]int{}
	for _, n := range s.a.Cluster.Map(5) {
		for _, g := range n.GPUs {
			k := g.State
			if g.Borrowed {
				k += " (borrowed)"
			}
			count[k]++
		}
	}
	summary := browser.Eval[string](t, tab, "document.getElementById('map-summary').textContent")
	for state, n := range count {
		if !strings.Contains(summary, fmt.Sprintf(" %d %s,", n, state)) && !strings.Contains(summary, fmt.Sprintf(" %d %s.", n, state)) {
			t.Errorf("summary %q lacks %d %s", summary, n, state)
		}
	}
	if len(count) != 7 {
		t.Errorf("the large cluster has GPUs in %d states, want all 7: %v", len(count), count)
	}
	if got := browser.Eval[string](t, tab, "document.querySelector('.row[data-node=\"gpu-0000\"] .marks').textContent"); got != "draining · ineligible" {
		t.Errorf("gpu-0000's marks %q, want draining · ineligible", got)
	}
	browser.Screenshot(t, tab, "map-1000-nodes")

	browser.Eval[bool](t, tab, "(() => { const b = document.getElementById('map-rows'); b.scrollTop = b.scrollHeight; b.dispatchEvent(new Event('scroll')); return true })()")
	browser.WaitFor(t, tab, 5*time.Second, "the last node after scrolling", "document.querySelector('.row[data-node=\"gpu-0999\"]')",
		"[...document.querySelectorAll('#map-rows .row')].map(r => r.dataset.node).join(' ')")

	browser.Eval[bool](t, tab, "(() => { const f = document.getElementById('f-tenant'); f.value = 'speech'; f.dispatchEvent(new Event('input')); return true })()")
	if nodes := browser.Eval[int](t, tab, "window.nomadGPU.nodes"); nodes != 167 {
		t.Errorf("filtered by tenant speech: %d nodes, want 167", nodes)
	}
}

// With ACLs the UI says what it needs, takes the token once, keeps it in
// the tab's session storage (never the URL) and sends it as Nomad's header.
func TestTheUIWithACLsInABrowser(t *testing.T) {
	tab := browser.New(t)
	s, up, _, _ := newTestServer(t)
	s.setACLs(true)
	up.tokens = map[string]testToken{"secret-of-ana": {"ana", []string{"vision"}, []string{"node-read"}}}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	browser.Navigate(t, tab, srv.URL+"/gpu/#map")
	browser.WaitFor(t, tab, 10*time.Second, "a request for a token", "document.getElementById('status').textContent.includes('Enter a Nomad ACL token')",
		"document.getElementById('status').textContent")
	browser.Eval[bool](t, tab, `(() => { document.getElementById('token').value = 'secret-of-ana'; document.getElementById('token-form').requestSubmit(); return true })()`)
	browser.WaitFor(t, tab, 10*time.Second, "the map with the token", "window.nomadGPU.renders > 0", "document.getElementById('status').textContent")
	if got := browser.Eval[string](t, tab, "sessionStorage.getItem('nomad-gpu-token') + ' ' + localStorage.length + ' ' + location.href + ' ' + document.getElementById('token').value"); got != "secret-of-ana 0 "+srv.URL+"/gpu/#map " {
		t.Errorf("token kept as %q: want it in session storage only, not in the URL nor left in the field", got)
	}
	// Entered once: a reload of the tab still has it.
	browser.Navigate(t, tab, srv.URL+"/gpu/#queues")
	browser.WaitFor(t, tab, 10*time.Second, "the queue with the kept token", "document.getElementById('status').textContent.startsWith('live')",
		"document.getElementById('status').textContent")
	browser.Screenshot(t, tab, "webui-acl-token")
}

// BenchmarkMapRender: one render of the GPU map in headless Chromium, in
// the page's own time (ms/render), for clusters of 10, 100 and 1,000 nodes.
func BenchmarkMapRender(b *testing.B) {
	tab := browser.New(b)
	for _, nodes := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			s, _, _, _ := newTestServer(b)
			largeCluster(s, nodes)
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			browser.Navigate(b, tab, srv.URL+"/gpu/#map")
			browser.WaitFor(b, tab, 20*time.Second, "the map", fmt.Sprintf("window.nomadGPU.nodes == %d", nodes), "document.getElementById('status').textContent")
			var ms float64
			for b.Loop() {
				ms += browser.Eval[float64](b, tab, "(renderMap(), window.nomadGPU.lastRenderMs)")
			}
			b.ReportMetric(ms/float64(b.N), "ms/render")
		})
	}
}

// The reclaim view: a proposed decision counts its grace down live and can
// be cancelled from the page, and then shows as decided.
func TestReclaimDecisionsInABrowser(t *testing.T) {
	tab := browser.New(t)
	s, _, _, _ := newTestServer(t)
	recs := reclaimtest.NewMem()
	s.set(func(_ *Options, a *gpuapi.Options) { a.Decisions = recs })
	now := time.Now().UTC()
	proposed := reclaim.Record{ID: "2b9f6b1e-4f5c-4d8a-9a55-6c1f0e0b7a10", Rule: "idle-dev", Action: policy.ActionStop, Namespace: "vision", Job: "notebook",
		Tenant: "vision", GPUs: 1, Evidence: "GPU util below 5% for 30m", State: reclaim.Proposed, ProposedAt: now, ActAfter: now.Add(90 * time.Second)}
	if ok, err := recs.Create(t.Context(), proposed); !ok || err != nil {
		t.Fatal(ok, err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	browser.Navigate(t, tab, srv.URL+"/gpu/#reclaim")
	row := `document.querySelector('#proposed tr[data-job="notebook"]')`
	browser.WaitFor(t, tab, 10*time.Second, "the proposed decision", row, "document.getElementById('proposed').innerText")
	first := browser.Eval[string](t, tab, row+".querySelector('.countdown').textContent")
	if !strings.HasPrefix(first, "1m ") || !strings.Contains(browser.Eval[string](t, tab, row+".innerText"), "GPU util below 5% for 30m") {
		t.Errorf("countdown %q (want 1m …s) or evidence missing: %q", first, browser.Eval[string](t, tab, row+".innerText"))
	}
	browser.WaitFor(t, tab, 5*time.Second, "the countdown moving", fmt.Sprintf("%s.querySelector('.countdown').textContent != %q", row, first), row+".innerText")
	browser.Screenshot(t, tab, "webui-reclaim-proposed")

	browser.Eval[bool](t, tab, "(() => { window.confirm = () => true; "+row+".querySelector('button').click(); return true })()")
	browser.WaitFor(t, tab, 10*time.Second, "the cancelled decision among the decided", `[...document.querySelectorAll('#decided tr[data-job="notebook"]')].some(r => r.innerText.includes('cancelled'))`,
		"document.getElementById('decided').innerText + ' / ' + document.getElementById('status').textContent")
	if rec, _ := recs.Get(t.Context(), proposed.ID); rec.State != reclaim.Cancelled {
		t.Errorf("the store has the decision %s", rec.State)
	}
}

// A long queue is shown by its first 200 rows, with how many wait in all;
// "Show more" asks for the next 200.
func TestALongQueueInABrowser(t *testing.T) {
	tab := browser.New(t)
	s, _, q, _ := newTestServer(t)
	now := time.Now()
	for i := range 250 {
		q.Put(t.Context(), queue.Entry{ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), JobID: fmt.Sprintf("job-%03d", i),
			Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1, SubmittedAt: now.Add(time.Duration(i) * time.Second)})
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() }) // the page's blocking query is open
	browser.Navigate(t, tab, srv.URL+"/gpu/#queues")
	rows := "document.querySelectorAll('#queue-tables tbody tr').length"
	browser.WaitFor(t, tab, 10*time.Second, "the first 200 rows", rows+" == 200", "document.getElementById('queue-summary').textContent")
	if got := browser.Eval[string](t, tab, "document.getElementById('queue-summary').textContent"); !strings.Contains(got, "250 jobs waiting") ||
		!strings.Contains(got, "The first 200 are shown") {
		t.Errorf("summary %q", got)
	}
	browser.Eval[bool](t, tab, "(() => { document.querySelector('#queue-summary button').click(); return true })()")
	browser.WaitFor(t, tab, 10*time.Second, "all 250 rows", rows+" == 250", "document.getElementById('queue-summary').textContent")
	if got := browser.Eval[string](t, tab, "document.querySelector('#queue-tables tbody tr:last-child').dataset.job"); got != "job-249" {
		t.Errorf("the last row is %q", got)
	}
}
