package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/server"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// The route-by-state test of the gate: every job-scoped write of the
// broker's route table (server.JobWrites), on a job in every state Nomad
// has, sent through the broker. From Nomad's own allocations, the GPUs the
// job and its children hold never rise unless the broker's answer carries
// its admission. A route added to the table without a case here fails.

const routesNS = "diff-b"

// jobState is a state of a job: make registers job id and brings it there.
type jobState struct {
	name string
	make func(t *testing.T, e *diffEnv, id string)
}

// routeCase is one write: its body for job id as Nomad has it.
type routeCase struct {
	name   string
	method string
	path   func(id string) string
	body   func(t *testing.T, e *diffEnv, id string) string
}

func (e *diffEnv) routesOnStates(t *testing.T) {
	var cases []routeCase
	for _, w := range server.JobWrites() {
		cs, ok := routeCases[w.Method+" "+w.Sub]
		if !ok {
			t.Fatalf("the route table has %s /v1/job/<id>%s (decided: %t), and this test no case for it: add one", w.Method, w.Sub, w.Decided)
		}
		cases = append(cases, cs...)
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for _, st := range jobStates {
		for _, c := range cases {
			id := "rt-" + st.name + "-" + c.name
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				t.Run(st.name+"/"+c.name, func(t *testing.T) {
					e := e.in(t)
					st.make(t, e, id)
					e.noRiseWithoutDecision(t, st.name, c, id)
				})
			}()
		}
	}
	wg.Wait()
}

// noRiseWithoutDecision sends c on job id and counts the GPUs of every
// allocation Nomad places for the job and its children after it, for as
// long as Nomad takes to place. Whatever they did since (a failing task
// ends within moments), placed without the broker's admission they are a
// rise no decision covers.
func (e *diffEnv) noRiseWithoutDecision(t *testing.T, state string, c routeCase, id string) {
	_, meta, err := e.nomad.API.Allocations().List(&api.QueryOptions{Namespace: routesNS})
	if err != nil {
		t.Fatal(err)
	}
	status, answer := send(t, e.broker.Addr, c.method, c.path(id), c.body(t, e, id))
	time.Sleep(3 * time.Second)
	if placed := e.placedSince(t, id, meta.LastIndex); placed > 0 && !strings.Contains(answer, "nomad-gpu: admitted") {
		t.Errorf("%s on a %s job: Nomad placed %d GPUs for it after, without a decision; the broker answered %d %s\n%s",
			c.name, state, placed, status, answer, e.evaluations(routesNS, id))
	}
}

// placedSince is the GPUs of the allocations Nomad placed after index for
// job id and its children (dispatched, or launched).
func (e *diffEnv) placedSince(t *testing.T, id string, index uint64) int {
	ids := []string{id}
	kids, _, err := e.nomad.API.Jobs().List(&api.QueryOptions{Namespace: routesNS, Prefix: id + "/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		ids = append(ids, k.ID)
	}
	total := 0
	for _, job := range ids {
		stubs, _, err := e.nomad.API.Jobs().Allocations(job, true, &api.QueryOptions{Namespace: routesNS})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stubs {
			if s.CreateIndex <= index {
				continue
			}
			a, _, err := e.nomad.API.Allocations().Info(s.ID, &api.QueryOptions{Namespace: routesNS})
			if err != nil {
				t.Fatal(err)
			}
			for _, tr := range a.AllocatedResources.Tasks {
				for _, d := range tr.Devices {
					total += len(d.DeviceIDs)
				}
			}
		}
	}
	return total
}

// stored is job id as Nomad has it, for a body that sends it back.
func (e *diffEnv) stored(t *testing.T, id string) *api.Job {
	j, _, err := e.nomad.API.Jobs().Info(id, &api.QueryOptions{Namespace: routesNS})
	if err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	return j
}

func jobPath(sub string) func(string) string {
	return func(id string) string { return "/v1/job/" + url.PathEscape(id) + sub + "?namespace=" + routesNS }
}

func fixed(body string) func(*testing.T, *diffEnv, string) string {
	return func(*testing.T, *diffEnv, string) string { return body }
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// routeCases are the writes on each route, by method and sub-route.
var routeCases = map[string][]routeCase{
	"PUT /evaluate": {
		{name: "evaluate", method: http.MethodPut, path: jobPath("/evaluate"), body: func(_ *testing.T, _ *diffEnv, id string) string {
			return fmt.Sprintf(`{"JobID": %q}`, id)
		}},
		// E1: failed allocations forced to reschedule.
		{name: "evaluate-force", method: http.MethodPut, path: jobPath("/evaluate"), body: func(_ *testing.T, _ *diffEnv, id string) string {
			return fmt.Sprintf(`{"JobID": %q, "EvalOptions": {"ForceReschedule": true}}`, id)
		}},
	},
	"PUT /periodic/force": {{name: "periodic-force", method: http.MethodPut, path: jobPath("/periodic/force"), body: fixed(``)}},
	"PUT /plan": {{name: "plan", method: http.MethodPut, path: jobPath("/plan"), body: func(t *testing.T, e *diffEnv, id string) string {
		return jsonOf(t, map[string]any{"Job": e.stored(t, id)})
	}}},
	"PUT /dispatch": {{name: "dispatch", method: http.MethodPut, path: jobPath("/dispatch"), body: fixed(`{}`)}},
	"PUT /revert": {{name: "revert", method: http.MethodPut, path: jobPath("/revert"), body: func(t *testing.T, _ *diffEnv, id string) string {
		return fmt.Sprintf(`{"JobID": %q, "JobVersion": 0}`, id)
	}}},
	"PUT /stable": {{name: "stable", method: http.MethodPut, path: jobPath("/stable"), body: func(t *testing.T, _ *diffEnv, id string) string {
		return fmt.Sprintf(`{"JobID": %q, "JobVersion": 0, "Stable": true}`, id)
	}}},
	"PUT /scale": {{name: "scale", method: http.MethodPut, path: jobPath("/scale"), body: fixed(`{"Count": 2, "Target": {"Group": "g"}}`)}},
	// The job as Nomad has it, registered again (nomad job run of a stopped
	// job runs it again).
	"PUT ": {{name: "register", method: http.MethodPut, path: jobPath(""), body: func(t *testing.T, e *diffEnv, id string) string {
		j := e.stored(t, id)
		j.Stop = ptr(false)
		return jsonOf(t, map[string]any{"Job": j})
	}}},
	"DELETE ": {
		{name: "stop", method: http.MethodDelete, path: jobPath(""), body: fixed(``)},
		{name: "purge", method: http.MethodDelete, path: func(id string) string { return jobPath("")(id) + "&purge=true" }, body: fixed(``)},
	},
}

// oneGPU is job id of type typ: one group "g" of one allocation of one GPU.
func oneGPU(id, typ string, config map[string]any) *jobBuilder {
	tk := task(dev("nvidia/gpu", 1))
	if config != nil {
		tk.Config = config
	}
	jb := job(routesNS, id, typ).group("g", ptr(1), nil, tk)
	if typ == api.JobTypeBatch {
		jb.j.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{Attempts: ptr(0), Unlimited: ptr(false)}
	}
	return jb
}

// through registers jb through the broker, which must admit it.
func (e *diffEnv) through(t *testing.T, jb *jobBuilder) {
	t.Helper()
	if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(nil, canonical)); status != http.StatusOK || !strings.Contains(out, "nomad-gpu: admitted") {
		t.Fatalf("register %s through the broker: %d %s", *jb.j.ID, status, out)
	}
}

// straight registers jb straight in Nomad (what the broker refuses, or what
// it cannot be brought to through the broker).
func (e *diffEnv) straight(t *testing.T, jb *jobBuilder) {
	t.Helper()
	if _, _, err := e.nomad.API.Jobs().Register(jb.j, &api.WriteOptions{Namespace: routesNS}); err != nil {
		t.Fatalf("register %s straight in Nomad: %v", *jb.j.ID, err)
	}
}

// waitStatus waits until Nomad says job id is status.
func (e *diffEnv) waitStatus(t *testing.T, id, status string) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, id+" "+status, func() error {
		if j := e.stored(t, id); *j.Status != status {
			return fmt.Errorf("%s is %s", id, *j.Status)
		}
		return nil
	})
}

// waitHeld waits until job id holds want GPUs.
func (e *diffEnv) waitHeld(t *testing.T, id string, want int) {
	t.Helper()
	if got := e.waitAllocated(routesNS, id, want); got != want {
		t.Fatalf("%s holds %d GPUs, want %d", id, got, want)
	}
}

var jobStates = []jobState{
	{"running", func(t *testing.T, e *diffEnv, id string) {
		e.through(t, oneGPU(id, api.JobTypeService, nil))
		e.waitHeld(t, id, 1)
	}},
	{"complete", func(t *testing.T, e *diffEnv, id string) {
		e.through(t, oneGPU(id, api.JobTypeBatch, map[string]any{"run_for": "100ms"}))
		e.waitStatus(t, id, "dead")
	}},
	// E1's state: every allocation failed, its one reschedule too.
	{"dead", func(t *testing.T, e *diffEnv, id string) {
		jb := oneGPU(id, api.JobTypeBatch, map[string]any{"run_for": "100ms", "exit_code": 1})
		jb.j.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{Attempts: ptr(1), Interval: ptr(24 * time.Hour),
			Delay: ptr(5 * time.Second), DelayFunction: ptr("constant"), Unlimited: ptr(false)}
		e.through(t, jb)
		testcluster.WaitFor(t, 30*time.Second, id+" dead, its reschedule failed too", func() error {
			stubs, _, err := e.nomad.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: routesNS})
			if j := e.stored(t, id); err != nil || *j.Status != "dead" || len(stubs) != 2 {
				return fmt.Errorf("%s, %d allocations (%v)", *j.Status, len(stubs), err)
			}
			return nil
		})
	}},
	{"stopped", func(t *testing.T, e *diffEnv, id string) {
		e.through(t, oneGPU(id, api.JobTypeService, nil))
		e.waitHeld(t, id, 1)
		if _, _, err := e.nomad.API.Jobs().Deregister(id, false, &api.WriteOptions{Namespace: routesNS}); err != nil {
			t.Fatal(err)
		}
		e.waitHeld(t, id, 0)
	}},
	// No node meets its constraint: Nomad keeps it pending. The broker
	// refuses a job no node fits, so it is registered straight in Nomad.
	{"pending", func(t *testing.T, e *diffEnv, id string) {
		jb := oneGPU(id, api.JobTypeService, nil)
		jb.j.Constraints = []*api.Constraint{{LTarget: "${node.unique.name}", RTarget: "nowhere", Operand: "="}}
		e.straight(t, jb)
		e.waitStatus(t, id, "pending")
	}},
	// Version 2, made by a revert to version 0 through the broker.
	{"reverted", func(t *testing.T, e *diffEnv, id string) {
		for v := range 2 {
			jb := oneGPU(id, api.JobTypeService, nil)
			jb.j.Meta = map[string]string{"v": fmt.Sprint(v)}
			e.through(t, jb)
		}
		if status, out := send(t, e.broker.Addr, http.MethodPut, jobPath("/revert")(id), fmt.Sprintf(`{"JobID": %q, "JobVersion": 0}`, id)); status != http.StatusOK {
			t.Fatalf("revert %s to version 0: %d %s", id, status, out)
		}
		testcluster.WaitFor(t, 30*time.Second, id+" at version 2", func() error {
			if j := e.stored(t, id); *j.Version != 2 {
				return fmt.Errorf("version %d", *j.Version)
			}
			return nil
		})
		e.waitHeld(t, id, 1)
	}},
	// The broker refuses a periodic GPU job: straight in Nomad.
	{"periodic", func(t *testing.T, e *diffEnv, id string) {
		jb := oneGPU(id, api.JobTypeBatch, nil)
		jb.j.Periodic = &api.PeriodicConfig{Spec: ptr("0 0 1 1 *"), SpecType: ptr(api.PeriodicSpecCron), ProhibitOverlap: ptr(true)}
		e.straight(t, jb)
	}},
	{"parameterized", func(t *testing.T, e *diffEnv, id string) {
		jb := oneGPU(id, api.JobTypeBatch, nil)
		jb.j.ParameterizedJob = &api.ParameterizedJobConfig{}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("register the parameterized %s through the broker: %d %s", id, status, out)
		}
	}},
}
