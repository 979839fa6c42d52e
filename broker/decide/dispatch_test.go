package decide_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// regions is east (the broker's own, one 2-GPU node) and west (one 4-GPU
// node).
func regions() (*decide.Sequence, *cluster.View) {
	east, west := cluster.NewView(nil), cluster.NewView(nil)
	west.SetRegion("west")
	east.ObserveNode(testbuild.Node("e1", "H100", 2, 0))
	west.ObserveNode(testbuild.Node("w1", "H100", 4, 0))
	r := cluster.NewRegions("east", east, map[string]*cluster.View{"west": west})
	return &decide.Sequence{Cluster: r, Enricher: enrich.Enricher{Clock: clock.Fixed(time.Now())}}, west
}

// A job with meta nomad-gpu.region = "auto" goes to one region: the first
// that admits it in the policy's order (the broker's own first), or the
// freest under best_fit. It stays in the one it runs in, whatever the
// order. The region is written where Nomad forwards by it, and the answer
// says why.
func TestAJobLeavingItsRegionToTheBrokerGoesToOne(t *testing.T) {
	auto := func(id string, gpus int) *testbuild.JobBuilder {
		return testbuild.Job("vision", id).Meta(nomadjob.MetaQueue, "training").Meta(nomadjob.MetaRegion, "auto").Group("g", 1, gpus, "nvidia/gpu")
	}
	for _, c := range []struct {
		name, policy string
		job          *testbuild.JobBuilder
		running      bool // the job runs in west already
		want, note   string
	}{
		{name: "ordered: the broker's own region first", job: auto("a", 1), want: "east", note: "region east (dispatch ordered)"},
		{name: "best_fit: the region with the most idle GPUs", policy: `dispatch = "best_fit"`, job: auto("a", 1), want: "west",
			note: "region west (dispatch best_fit)"},
		{name: "dispatch_order", policy: `dispatch_order = ["west", "south"]`, job: auto("a", 1), want: "west", note: "region west (dispatch ordered)"},
		{name: "a region no node of fits is passed over, and said so", job: auto("a", 3), want: "west",
			note: "region west (dispatch ordered; not east: task group \"g\" needs 3 GPUs in one allocation, but no node has more than 2"},
		{name: "a job running in a region stays there", job: auto("a", 1), running: true, want: "west", note: "region west, where the job runs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			seq, west := regions()
			if c.running {
				west.ObserveJob(c.job.Build())
			}
			p := testbuild.Policy(t, policySrc+c.policy)
			r, err := seq.Prepare(context.Background(), p, request(t, c.job), &versions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Dispatched != c.want || !strings.HasPrefix(r.Dispatch, c.note) {
				t.Errorf("dispatched to %q (%s), want %q (%s…)", r.Dispatched, r.Dispatch, c.want, c.note)
			}
			body := string(r.Body())
			if !strings.Contains(body, `"Region":"`+c.want+`"`) {
				t.Errorf("the region is not written into the request: %s", body)
			}
		})
	}
	t.Run("a job no region can take is refused, each region's reason told", func(t *testing.T) {
		seq, _ := regions()
		_, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc), request(t, auto("a", 8)), &versions{})
		if !decide.IsJobError(err) || !strings.Contains(err.Error(), "no region this broker governs can take it: east: ") ||
			!strings.Contains(err.Error(), "; west: ") {
			t.Errorf("8 GPUs, no node with more than 4: %v", err)
		}
	})
	t.Run("a drained region is passed over, or waited for when no other takes the job", func(t *testing.T) {
		seq, _ := regions()
		seq.Cluster.(*cluster.Regions).SetDrained(map[string]string{"east": "by ops"})
		p := testbuild.Policy(t, policySrc)
		r, err := seq.Prepare(context.Background(), p, request(t, auto("a", 1)), &versions{})
		if err != nil || r.Dispatched != "west" || r.Dispatch != "region west (dispatch ordered; not east: drained (by ops))" {
			t.Errorf("east drained: dispatched to %q (%s), %v; want west", r.Dispatched, r.Dispatch, err)
		}
		seq.Cluster.(*cluster.Regions).SetDrained(map[string]string{"east": "by ops", "west": "by ops"})
		r, err = seq.Prepare(context.Background(), p, request(t, auto("a", 1)), &versions{})
		if err != nil || r.Dispatched != "east" || !strings.HasPrefix(r.Dispatch, "region east to wait in") {
			t.Errorf("both drained: dispatched to %q (%s), %v; want to wait in east", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("a region where the tenant is at its cap there is passed over", func(t *testing.T) {
		seq, _ := regions()
		capped := strings.Replace(policySrc, "  limit      = 4\n}", "  limit      = 4\n  region \"east\" {\n    limit = 0\n  }\n}", 1)
		r, err := seq.Prepare(context.Background(), testbuild.Policy(t, capped), request(t, auto("a", 1)), &versions{})
		if err != nil || r.Dispatched != "west" || !strings.Contains(r.Dispatch, `not east: tenant "vision" would hold 1 of its limit of 0 GPUs in region east`) {
			t.Errorf("vision capped at 0 in east: dispatched to %q (%s), %v; want west", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("ordered passes over a region that admits the job but has too few GPUs idle for it", func(t *testing.T) {
		seq, _ := regions()
		east, _, _ := seq.Cluster.(*cluster.Regions).In("east")
		east.ObserveJob(testbuild.Job("vision", "holds-east").Meta(nomadjob.MetaQueue, "training").Group("g", 1, 2, "nvidia/gpu").Build())
		r, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc), request(t, auto("a", 2)), &versions{})
		if err != nil || r.Dispatched != "west" || !strings.Contains(r.Dispatch, "not east: admits it, but 0 of its 2 GPUs are idle there") {
			t.Errorf("east full, within vision's guarantee: dispatched to %q (%s), %v; want west", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("best_fit ranks regions by the free GPUs the job's allocations could take, node by node", func(t *testing.T) {
		seq, west := regions()
		// West: w1 (4 GPUs, 3 held) and w2, w3 (1 GPU each): 3 free, none two on one node.
		west.ObserveNode(testbuild.Node("w2", "H100", 1, 0))
		west.ObserveNode(testbuild.Node("w3", "H100", 1, 0))
		west.ObserveJob(testbuild.Job("audio", "holds-w1").Group("g", 1, 3, "nvidia/gpu").Build())
		west.ObserveAlloc(testbuild.Alloc("h1", "audio", "holds-w1", "w1", 5, "w1-0", "w1-1", "w1-2").Build())
		r, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc+`dispatch = "best_fit"`), request(t, auto("a", 2)), &versions{})
		if err != nil || r.Dispatched != "east" {
			t.Errorf("2 GPUs, east's node 2 free, west 3 free on three nodes: dispatched to %q (%s), %v; want east", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("a system job is counted on each region's own nodes", func(t *testing.T) {
		seq, west := regions()
		for _, n := range []string{"w2", "w3", "w4", "w5"} {
			west.ObserveNode(testbuild.Node(n, "H100", 4, 0))
		}
		// One GPU on each node: 1 in east, 5 in west, above vision's limit of 4.
		r, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc+`dispatch = "best_fit"`), request(t, auto("s", 1).Type("system")), &versions{})
		if err != nil || r.Dispatched != "east" || !strings.Contains(r.Dispatch, "not west: ") {
			t.Errorf("west freer but its 5 nodes above the limit: dispatched to %q (%s), %v; want east", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("ordered spills to the next region only once the job has waited spill_after", func(t *testing.T) {
		seq, _ := regions()
		capped := strings.Replace(policySrc, "  limit      = 4\n}", "  limit      = 4\n  region \"east\" {\n    limit = 0\n  }\n}", 1) + `spill_after = "30m"`
		p := testbuild.Policy(t, capped)
		req := request(t, auto("a", 1))
		r, err := seq.Prepare(context.Background(), p, req, &versions{})
		if err != nil || r.Dispatched != "east" || !strings.HasPrefix(r.Dispatch, "region east to wait in") ||
			!strings.Contains(r.Dispatch, "west: admits it once it has waited 30m0s for the regions before it (spill_after 30m0s)") {
			t.Errorf("at the gate: dispatched to %q (%s), %v; want to wait in east, west's spill told", r.Dispatched, r.Dispatch, err)
		}
		for _, c := range []struct {
			waited time.Duration
			want   string
		}{{29 * time.Minute, "east"}, {30 * time.Minute, "west"}} {
			req := request(t, auto("a", 1))
			req.QueuedAt = seq.Clock.Now().Add(-c.waited)
			if r, err := seq.Prepare(context.Background(), p, req, &versions{}); err != nil || r.Dispatched != c.want {
				t.Errorf("queued %s ago: dispatched to %q (%s), %v; want %s", c.waited, r.Dispatched, r.Dispatch, err, c.want)
			}
		}
	})
	t.Run("a queue's region = auto makes its jobs that name no region auto", func(t *testing.T) {
		seq, _ := regions()
		p := testbuild.Policy(t, strings.Replace(policySrc, `workload = "training"`, `workload = "training"`+"\n  region = \"auto\"", 1)+`dispatch = "best_fit"`)
		job := testbuild.Job("vision", "a").Group("g", 1, 1, "nvidia/gpu")
		if r, err := seq.Prepare(context.Background(), p, request(t, job), &versions{}); err != nil || r.Dispatched != "west" {
			t.Errorf("no region named: dispatched to %q (%s), %v; want west (best_fit)", r.Dispatched, r.Dispatch, err)
		}
		req := request(t, job)
		req.Region = "east"
		if r, err := seq.Prepare(context.Background(), p, req, &versions{}); err != nil || r.Dispatched != "" {
			t.Errorf("east named: dispatched to %q (%s), %v; want east, not dispatched", r.Dispatched, r.Dispatch, err)
		}
		// Queued (every region drained), it waits in east; the copy the
		// queue keeps names east, and is still dispatched at the next pass.
		seq.Cluster.(*cluster.Regions).SetDrained(map[string]string{"east": "by ops", "west": "by ops"})
		r, err := seq.Prepare(context.Background(), p, request(t, job), &versions{})
		if err != nil || r.Dispatched != "east" {
			t.Fatalf("both drained: dispatched to %q (%s), %v; want to wait in east", r.Dispatched, r.Dispatch, err)
		}
		seq.Cluster.(*cluster.Regions).SetDrained(nil)
		queued, err := nomadjob.ReadRequest(nomadjob.Register, r.Body(), url.Values{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := seq.Prepare(context.Background(), p, queued, &versions{}); err != nil || r.Dispatched != "west" {
			t.Errorf("the queued copy: dispatched to %q (%s), %v; want west (best_fit), dispatched again", r.Dispatched, r.Dispatch, err)
		}
	})
	t.Run("only auto is read", func(t *testing.T) {
		seq, _ := regions()
		job := testbuild.Job("vision", "a").Meta(nomadjob.MetaRegion, "west").Group("g", 1, 1, "nvidia/gpu")
		_, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc), request(t, job), &versions{})
		if !decide.IsJobError(err) || !strings.Contains(err.Error(), `meta nomad-gpu.region = "west": its one value is "auto"`) {
			t.Errorf("meta nomad-gpu.region = west: %v", err)
		}
	})
	t.Run("a job naming its region is not dispatched", func(t *testing.T) {
		seq, _ := regions()
		r, err := seq.Prepare(context.Background(), testbuild.Policy(t, policySrc), request(t, testbuild.Job("vision", "a").Group("g", 1, 1, "nvidia/gpu")), &versions{})
		if err != nil || r.Dispatched != "" || r.Dispatch != "" {
			t.Errorf("no meta: dispatched to %q (%s), %v; want not dispatched", r.Dispatched, r.Dispatch, err)
		}
	})
}
