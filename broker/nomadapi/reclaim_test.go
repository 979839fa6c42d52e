package nomadapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

func TestStopsAreDoneOnceAndNotForWhatStoppedAlready(t *testing.T) {
	running := api.Allocation{ID: "a1", Namespace: "vision", DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusRunning}
	done := running
	done.ID, done.ClientStatus = "a2", api.AllocClientStatusComplete
	c, f := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/job/live":           answer(http.StatusOK, api.Job{ID: ptr("live")}),
		"GET /v1/job/stopped":        answer(http.StatusOK, api.Job{ID: ptr("stopped"), Stop: ptr(true)}),
		"DELETE /v1/job/live":        answer(http.StatusOK, api.JobDeregisterResponse{EvalID: "e1"}),
		"GET /v1/allocation/a1":      answer(http.StatusOK, running),
		"GET /v1/allocation/a2":      answer(http.StatusOK, done),
		"PUT /v1/allocation/a1/stop": answer(http.StatusOK, api.AllocStopResponse{EvalID: "e2"}),
	})
	ctx := context.Background()
	for _, c := range []struct {
		do   func() (string, error)
		want string
	}{
		{func() (string, error) { return c.StopJob(ctx, "vision", "live") }, "job stopped, evaluation e1"},
		{func() (string, error) { return c.StopJob(ctx, "vision", "stopped") }, "already stopped"},
		{func() (string, error) { return c.StopJob(ctx, "vision", "purged") }, "already stopped"},
		{func() (string, error) { return c.StopAlloc(ctx, "a1") }, "allocation stopped, evaluation e2"},
		{func() (string, error) { return c.StopAlloc(ctx, "a2") }, "already stopped"},
		{func() (string, error) { return c.StopAlloc(ctx, "gone") }, "already gone"},
	} {
		if got, err := c.do(); err != nil || got != c.want {
			t.Errorf("%q %v, want %q", got, err, c.want)
		}
	}
	deletes := 0
	for _, r := range f.requests {
		if strings.HasPrefix(r, "DELETE /v1/job/live?") {
			deletes++
			if strings.Contains(r, "purge=true") {
				t.Errorf("purged: %s", r)
			}
		}
	}
	if deletes != 1 {
		t.Errorf("%d stops of the job", deletes)
	}
}

// view is the cluster view as the observer reads it.
type view struct {
	allocs     []cluster.Alloc
	gpus       map[string]map[string]cluster.GPU
	undeclared map[[2]string]string
}

func (v view) Synced() bool                                { return true }
func (v view) GPUAllocs() []cluster.Alloc                  { return v.allocs }
func (v view) EndedAllocs() []cluster.Alloc                { return nil }
func (v view) NodeGPUs(node string) map[string]cluster.GPU { return v.gpus[node] }
func (v view) GPUNodes() []string                          { return []string{"n1"} }
func (v view) UndeclaredJobs() map[[2]string]string        { return v.undeclared }

// A job that would use GPUs it does not ask for holds none in Nomad's
// accounting: its running allocations are read from Nomad and observed as
// unadmitted, with how, unless the broker admitted the job.
func TestTheObserverSeesJobsUsingGPUsTheyDoNotAskFor(t *testing.T) {
	running := api.AllocationListStub{ID: "a1", TaskGroup: "g", ClientStatus: api.AllocClientStatusRunning}
	done := api.AllocationListStub{ID: "a2", TaskGroup: "g", ClientStatus: api.AllocClientStatusComplete}
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/job/sneaky":             answer(http.StatusOK, api.Job{ID: ptr("sneaky"), JobModifyIndex: ptr(uint64(3))}),
		"GET /v1/job/sneaky/allocations": answer(http.StatusOK, []api.AllocationListStub{running, done}),
		"GET /v1/job/warned":             answer(http.StatusOK, api.Job{ID: ptr("warned"), Meta: map[string]string{"ok": "1"}}),
		"GET /v1/client/stats":           answer(http.StatusOK, api.HostStats{}),
	})
	v := view{undeclared: map[[2]string]string{{"vision", "sneaky"}: `task "t" sets NVIDIA_VISIBLE_DEVICES`, {"vision", "warned"}: "runs privileged"}}
	o := &nomadapi.Observer{Client: c, View: v, Verify: func(_ context.Context, j *api.Job) (bool, bool) { return j.Meta["ok"] == "1", false }}
	allocs, _, err := o.Observe(context.Background())
	if err != nil || len(allocs) != 1 || allocs[0].ID != "a1" || allocs[0].Admitted || allocs[0].Undeclared != `task "t" sets NVIDIA_VISIBLE_DEVICES` {
		t.Errorf("%+v %v", allocs, err)
	}
}

func TestTheObserverReadsEachJobVersionOnceAndEachNodesStats(t *testing.T) {
	util := 3.0
	jobReads := 0
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/job/dev": func(w http.ResponseWriter, r *http.Request) {
			jobReads++
			answer(http.StatusOK, api.Job{ID: ptr("dev"), JobModifyIndex: ptr(uint64(10)),
				Meta: map[string]string{nomadjob.MetaTenant: "vision", nomadjob.MetaQueue: "dev", nomadjob.MetaBorrowed: "true", nomadjob.MetaTTL: "2h"}})(w, r)
		},
		"GET /v1/client/stats": answer(http.StatusOK, api.HostStats{DeviceStats: []*api.DeviceGroupStats{{Vendor: "nvidia", Type: "gpu", Name: "H100",
			InstanceStats: map[string]*api.DeviceStats{"g0": {Summary: &api.StatValue{FloatNumeratorVal: &util}, Timestamp: time.Unix(100, 0)}}}}}),
	})
	v := view{allocs: []cluster.Alloc{{ID: "a1", Namespace: "vision", JobID: "dev", NodeID: "n1", JobIndex: 10, GPUs: []string{"g0"}}},
		gpus: map[string]map[string]cluster.GPU{"n1": {"g0": {Model: "H100", Healthy: true}, "g1": {Model: "H100", Healthy: false}}}}
	var samples map[string]cluster.Sample
	o := &nomadapi.Observer{Client: c, View: v, Verify: func(_ context.Context, j *api.Job) (bool, bool) { return true, j.Meta[nomadjob.MetaBorrowed] == "true" },
		Samples: func(s map[string]cluster.Sample) { samples = s }}
	for pass := 0; pass < 2; pass++ {
		allocs, gpus, err := o.Observe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		a := allocs[0]
		if len(allocs) != 1 || !a.Admitted || !a.Borrowed || a.Tenant != "vision" || a.Workload != "" || a.TTL != 2*time.Hour {
			t.Errorf("pass %d: %+v", pass, allocs)
		}
		if gpus["g0"].Utilization != 3 || gpus["g1"].Utilization != 100 || gpus["g1"].Healthy {
			t.Errorf("pass %d: a GPU without a sample is busy, not idle: %+v", pass, gpus)
		}
	}
	if jobReads != 1 {
		t.Errorf("the same job version read %d times", jobReads)
	}
	if s := samples["g0"]; s.Node != "n1" || s.Utilization == nil || *s.Utilization != 3 || fmt.Sprint(s.At.Unix()) != "100" {
		t.Errorf("samples: %+v", samples)
	}
}

// A job version that did not verify is verified again on each pass, from
// the copy read, since the broker's records of it may change while the
// version stays (Nomad's own revert, recorded as the broker's write). One
// that verified is not.
func TestTheObserverVerifiesAnUnadmittedVersionAgainWithoutReadingIt(t *testing.T) {
	jobReads := 0
	c, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
		"GET /v1/job/web": func(w http.ResponseWriter, r *http.Request) {
			jobReads++
			answer(http.StatusOK, api.Job{ID: ptr("web"), JobModifyIndex: ptr(uint64(10))})(w, r)
		},
		"GET /v1/client/stats": answer(http.StatusOK, api.HostStats{}),
	})
	v := view{allocs: []cluster.Alloc{{ID: "a1", Namespace: "vision", JobID: "web", Group: "g", JobIndex: 10, GPUs: []string{"g0"}}}}
	recorded, verifies := false, 0
	o := &nomadapi.Observer{Client: c, View: v, Verify: func(context.Context, *api.Job) (bool, bool) { verifies++; return recorded, false }}
	for pass, want := range []bool{false, true, true} {
		allocs, _, err := o.Observe(context.Background())
		if err != nil || len(allocs) != 1 || allocs[0].Admitted != want {
			t.Errorf("pass %d: %+v %v, want admitted %t", pass, allocs, err, want)
		}
		recorded = true
	}
	if jobReads != 1 || verifies != 2 {
		t.Errorf("%d reads of the job from Nomad, %d verifications; want 1 read, 2 verifications (none once it verified)", jobReads, verifies)
	}
}

// A borrowed job the broker moved to another sub-band in place (a new
// version, its allocation kept) and Nomad then preempted is still to be
// requeued. What deals with a preemption is a registration after it, not
// one after the allocation was created. Stopped, or registered again since,
// it is not.
func TestTheObserverKeepsAPreemptionAfterAnInPlaceMove(t *testing.T) {
	for _, c := range []struct {
		index   uint64
		stopped bool
		want    bool
	}{{30, false, true}, {50, false, false}, {30, true, false}} {
		cl, _ := newClient(t, map[string]func(http.ResponseWriter, *http.Request){
			"GET /v1/job/train": answer(http.StatusOK, api.Job{ID: ptr("train"), JobModifyIndex: ptr(c.index), Stop: ptr(c.stopped),
				Meta: map[string]string{nomadjob.MetaTenant: "vision", nomadjob.MetaQueue: "training", nomadjob.MetaBorrowed: "true"}}),
			"GET /v1/client/stats": answer(http.StatusOK, api.HostStats{}),
		})
		// Created at 10, its job moved in place at 30, preempted at 40.
		v := view{allocs: []cluster.Alloc{{ID: "a1", Namespace: "vision", JobID: "train", NodeID: "n1", CreateIndex: 10, JobIndex: c.index,
			Preempted: true, PreemptedAt: 40, GPUs: []string{"g0"}}}}
		o := &nomadapi.Observer{Client: cl, View: v, Verify: func(context.Context, *api.Job) (bool, bool) { return true, true }}
		allocs, _, err := o.Observe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := len(allocs) == 1 && allocs[0].Preempted && allocs[0].Borrowed; got != c.want {
			t.Errorf("job at index %d, stopped %t: preemption kept %t, want %t (%+v)", c.index, c.stopped, got, c.want, allocs)
		}
	}
}
