package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// A GPU task under exec or raw_exec is told, in the answer `nomad job run`
// prints, on which GPU nodes it cannot open its GPUs: those running Nomad
// before 1.8 on cgroups v2. Under docker, or where no node is such, it is
// told nothing; a queued job is told too.
func TestAGPUTaskIsToldWhereItsDriverCannotOpenItsGPUs(t *testing.T) {
	s, _, _, _ := newTestServer(t)
	node := func(id, version, cgroups string) *api.Node {
		n := testbuild.Node(id, "H100", 2, 0)
		n.Name, n.Attributes = id, map[string]string{"nomad.version": version, "unique.cgroup.version": cgroups}
		return n
	}
	view := cluster.NewView(nil)
	for _, n := range []*api.Node{node("old-v2", "1.6.3", "v2"), node("old-v1", "1.7.7", "v1"), node("new-v2", "1.8.0", "v2")} {
		view.ObserveNode(n)
	}
	s.set(func(o *Options, a *gpuapi.Options) { o.Cluster, a.Cluster = view, view })
	warnings := func(job string) string {
		t.Helper()
		rec := do(s, http.MethodPut, "/v1/jobs", job)
		var resp api.JobRegisterResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != http.StatusOK || err != nil {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		return resp.Warnings
	}
	raw := strings.Replace(gpuJob, `"Name":"t",`, `"Name":"t","Driver":"raw_exec",`, 1)
	want := `task "t" of group "g" (driver raw_exec) cannot open its GPUs on 1 of the 3 GPU nodes (old-v2): they run Nomad before 1.8 on cgroups v2`
	if w := warnings(raw); !strings.Contains(w, want) || !strings.Contains(w, "admitted") {
		t.Errorf("a raw_exec GPU task is told %q, want %q", w, want)
	}
	queued := strings.Replace(strings.Replace(raw, `"train"`, `"train-2"`, 1), `"raw_exec"`, `"exec"`, 1)
	if w := warnings(queued); !strings.Contains(w, `(driver exec) cannot open its GPUs on 1 of the 3`) || !strings.Contains(w, "queued") {
		t.Errorf("a queued exec GPU task is told %q", w)
	}
	docker := strings.Replace(strings.Replace(raw, `"train"`, `"train-3"`, 1), `"raw_exec"`, `"docker"`, 1)
	if w := warnings(docker); strings.Contains(w, "cannot open its GPUs") {
		t.Errorf("a docker GPU task is told %q", w)
	}
}

// The queue keeps at most max_queue_bytes of requests in all: a job that
// would take it past is refused with 429, saying so, and nothing is queued.
func TestTheQueueKeepsAtMostMaxQueueBytes(t *testing.T) {
	s, _, q, _ := newTestServer(t)
	ids := 0
	newID := func() string { ids++; return fmt.Sprintf("00000000-0000-4000-8000-%012d", ids) }
	s.set(func(o *Options, a *gpuapi.Options) {
		o.NewID, a.NewID, o.MaxQueueBytes = newID, newID, int64(2*len(gpuJob)+50)
	}) // two fit, not three
	do(s, http.MethodPut, "/v1/jobs", gpuJob) // vision's 2 GPUs: what follows queues
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		job := strings.Replace(gpuJob, `"train"`, fmt.Sprintf(`"wait-%d"`, i), 1)
		rec := do(s, http.MethodPut, "/v1/jobs", job)
		if rec.Code != want {
			t.Fatalf("job %d: %d %s, want %d", i, rec.Code, rec.Body, want)
		}
		if want == http.StatusTooManyRequests && !strings.Contains(rec.Body.String(), "above the broker's max_queue_bytes of ") {
			t.Errorf("the refusal does not say why: %s", rec.Body)
		}
	}
	if entries, _ := q.List(context.Background()); len(entries) != 2 {
		t.Errorf("%d entries queued, want 2", len(entries))
	}
}
