package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// gatePolicy gives each of TestGate's scenarios a tenant of its own, limited
// to 2 GPUs, in a namespace of its own: they run side by side on one cluster.
const gatePolicy = `
queue "training" { priority = 60 }
tenant "probe" {
  namespaces = ["gate-probe"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "revert" {
  namespaces = ["gate-revert"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "dispatch" {
  namespaces = ["gate-dispatch"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "stop" {
  namespaces = ["gate-stop"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "zero" {
  namespaces = ["gate-zero"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "race" {
  namespaces = ["gate-race"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "invalid" {
  namespaces = ["gate-invalid"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 1
}
tenant "purge" {
  namespaces = ["gate-purge"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "deploy" {
  namespaces = ["gate-deploy"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "garbage" {
  namespaces = ["gate-garbage"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "autorevert" {
  namespaces = ["gate-autorevert"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "sysbatch" {
  namespaces = ["gate-sysbatch"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "scaleblock" {
  namespaces = ["gate-scaleblock"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "stable" {
  namespaces = ["gate-stable"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "replay" {
  namespaces = ["gate-replay"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "evaluate" {
  namespaces = ["gate-evaluate"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "revive" {
  namespaces = ["gate-revive"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "bypass" {
  namespaces = ["gate-bypass"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
tenant "retype" {
  namespaces = ["gate-retype"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
reclaim_settings {
  period = "1s"
}
# Proposed only: what the broker takes for its admission shows in
# gpu-broker reclaim list, and nothing is stopped.
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  grace      = "1h"
  mode       = "dry-run"
}
`

// gateGPUs is the cluster's GPUs: more than all the scenarios' limits
// together (18 tenants of 2, and a job or two registered straight in
// Nomad), so that only tenant limits, never capacity, decide.
const gateGPUs = 46

// TestGate runs the gate's scenarios against one cluster they share (Consul,
// a Nomad agent with gateGPUs fake GPUs, a broker in front), each with its
// own tenant and namespace, in parallel. In each a tenant limited to 2 GPUs
// tries to hold more, and Nomad must run no more than 2 of them.
func TestGate(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "gate", gateGPUs, "gate-probe", "gate-revert", "gate-dispatch", "gate-stop", "gate-zero", "gate-race", "gate-invalid", "gate-purge", "gate-deploy", "gate-autorevert", "gate-garbage", "gate-stable", "gate-sysbatch", "gate-scaleblock", "gate-replay", "gate-evaluate", "gate-revive", "gate-retype", "gate-bypass")
	// A listing every second replaces the event stream many times in each
	// scenario: what the view counts, and the stops and reverts the leader
	// records, must be the same whichever of the two told them.
	e := brokerEnv(t, n, consul, gatePolicy, "gate-probe", gateGPUs, testcluster.BrokerOptions{Config: `body_read_timeout = "3s"
resync = "1s"`})

	// Nomad reads the namespace of a revert's or a dispatch's body when the
	// query has none; the broker must decide on that one, not on a job of
	// the same id in the default namespace.
	t.Run("revert: the namespace in the body is the one decided on", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-revert"
		if out, err := e.run(ns, "rv", 1, 2, "", true); err != nil || !strings.Contains(out, "2 GPUs") {
			t.Fatalf("version 0 (2 GPUs): %v\n%s", err, out)
		}
		waitAllocsRunning(t, e.nomad, ns, "rv", 1)
		if out, err := e.run(ns, "rv", 1, 1, "", true); err != nil || !strings.Contains(out, "1 GPUs") {
			t.Fatalf("version 1 (1 GPU): %v\n%s", err, out)
		}
		e.waitUsed("revert", 1) // version 0's allocation ended
		if out, err := e.run(ns, "other", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("a second job of 1 GPU: %v\n%s", err, out)
		}
		if out, err := e.run("default", "rv", 1, 0, "", true); err != nil {
			t.Fatalf("a CPU job of the same id in the default namespace: %v\n%s", err, out)
		}
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/revert",
			fmt.Sprintf(`{"JobID": "rv", "JobVersion": 0, "Namespace": %q}`, ns))
		if status != http.StatusForbidden || !strings.Contains(out, `revert of "rv" refused: tenant "revert" would hold 3 of its limit of 2 GPUs. Nothing was queued`) {
			t.Errorf("revert to 2 GPUs beside 1 more, limit 2: want 403 above the limit, nothing queued; got %d %s", status, out)
		}
		job, _, err := e.nomad.API.Jobs().Info("rv", &api.QueryOptions{Namespace: ns})
		if err != nil || *job.Version != 1 || gpusOf(job) != 1 {
			t.Errorf("Nomad reverted the job: version %d, %d GPUs (%v)", *job.Version, gpusOf(job), err)
		}
	})

	t.Run("dispatch: the namespace in the body is the one decided on", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-dispatch"
		parent := job(ns, "p", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 2)))
		parent.j.ParameterizedJob = &api.ParameterizedJobConfig{}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", parent.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("the parameterized job (2 GPUs a child): %d %s", status, out)
		}
		decoy := job("default", "p", api.JobTypeBatch).group("g", ptr(1), nil, task())
		decoy.j.ParameterizedJob = &api.ParameterizedJobConfig{}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", decoy.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("a CPU job of the same id in the default namespace: %d %s", status, out)
		}
		dispatch := fmt.Sprintf(`{"Namespace": %q}`, ns)
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/p/dispatch?idempotency_token=retry-1", dispatch)
		var first api.JobDispatchResponse
		if status != http.StatusOK || json.Unmarshal([]byte(out), &first) != nil {
			t.Fatalf("the first child (2 GPUs, limit 2): %d %s", status, out)
		}
		// A retry with the same idempotency token: Nomad answers with the
		// same child, creating nothing, so the broker passes it through.
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/p/dispatch?idempotency_token=retry-1", dispatch)
		var retry api.JobDispatchResponse
		if status != http.StatusOK || json.Unmarshal([]byte(out), &retry) != nil || retry.DispatchedJobID != first.DispatchedJobID {
			t.Errorf("a retry of the first dispatch: %d %s, want the same child %s", status, out, first.DispatchedJobID)
		}
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/p/dispatch", dispatch)
		if status != http.StatusForbidden || !strings.Contains(out, `dispatch of "p" refused: tenant "dispatch" would hold 4 of its limit of 2 GPUs. Nothing was queued`) {
			t.Errorf("a second child, 4 GPUs against a limit of 2: want 403 above the limit, nothing queued; got %d %s", status, out)
		}
		jobs, _, err := e.nomad.API.Jobs().List(&api.QueryOptions{Namespace: ns, Prefix: "p/dispatch-"})
		if err != nil || len(jobs) != 1 {
			t.Errorf("Nomad has %d children of p in %s, want 1 (%v)", len(jobs), ns, err)
		}
	})

	// E1: a batch job whose allocations all failed is dead, and holds
	// nothing; its tenant fills its limit with another job. An evaluation
	// forcing failed allocations to reschedule (nomad job eval
	// -force-reschedule) revived it past the limit, passed as neutral. It
	// is decided on the job's whole demand: refused at the limit, admitted
	// once the other job is gone.
	t.Run("evaluate: a dead job revived only within the limit", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-evaluate"
		failing := job(ns, "ev", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 2)))
		failing.j.TaskGroups[0].Tasks[0].Config = map[string]any{"run_for": "100ms", "exit_code": 1}
		failing.j.TaskGroups[0].ReschedulePolicy = &api.ReschedulePolicy{Attempts: ptr(1), Interval: ptr(24 * time.Hour),
			Delay: ptr(5 * time.Second), DelayFunction: ptr("constant"), Unlimited: ptr(false)}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", failing.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("a failing job of 2 GPUs: %d %s", status, out)
		}
		testcluster.WaitFor(t, 60*time.Second, "the failing job dead", func() error {
			j, _, err := e.nomad.API.Jobs().Info("ev", &api.QueryOptions{Namespace: ns})
			if err != nil {
				return err
			}
			if *j.Status != "dead" {
				return errors.New(*j.Status)
			}
			return nil
		})
		e.waitUsed("evaluate", 0)
		if out, err := e.run(ns, "fill", 1, 2, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("another job of 2 GPUs: %v\n%s", err, out)
		}
		force := `{"JobID": "ev", "EvalOptions": {"ForceReschedule": true}}`
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/ev/evaluate?namespace="+ns, force)
		if status != http.StatusForbidden || !strings.Contains(out, `evaluate of "ev" refused: tenant "evaluate" would hold 4 of its limit of 2 GPUs. Nothing was queued`) {
			t.Errorf("a forced reschedule of the dead job beside 2 GPUs, limit 2: want 403, nothing queued; got %d %s", status, out)
		}
		time.Sleep(2 * time.Second) // an evaluation let through places within this
		if allocs, _, err := e.nomad.API.Jobs().Allocations("ev", true, &api.QueryOptions{Namespace: ns}); err != nil || len(allocs) != 2 {
			t.Errorf("the dead job has %d allocations, want its 2 failed ones (%v)", len(allocs), err)
		}
		e.stop(ns, "fill")
		e.waitUsed("evaluate", 0)
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/ev/evaluate?namespace="+ns, force)
		if status != http.StatusOK || !strings.Contains(out, "EvalID") {
			t.Fatalf("the same with the limit free: %d %s", status, out)
		}
		testcluster.WaitFor(t, 30*time.Second, "the dead job revived", func() error {
			if allocs, _, err := e.nomad.API.Jobs().Allocations("ev", true, &api.QueryOptions{Namespace: ns}); err != nil || len(allocs) != 3 {
				return fmt.Errorf("%d allocations (%v)", len(allocs), err)
			}
			return nil
		})
	})

	// D1: a revert through the broker of a job stopped earlier is a
	// registration: admitted, it must not be read as unadmitted afterwards
	// (enforce would stop it), as a job run again through the broker is not.
	t.Run("revert: a stopped job reverted through the broker is its admission", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-revive"
		for _, gpus := range []int{1, 2} {
			if out, err := e.run(ns, "rv", 1, gpus, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("version of %d GPUs: %v\n%s", gpus, err, out)
			}
		}
		if out, err := e.nomadCLI("job", "stop", "-namespace", ns, "-detach", "rv"); err != nil {
			t.Fatalf("stop through the broker: %v\n%s", err, out)
		}
		stopsRecorded(t, consul, ns, "rv")
		// Its allocation holds its 2 GPUs until it has stopped: a revert
		// to 1 GPU before then is refused for the limit of 2.
		e.waitUsed("revive", 0)
		if out, err := e.nomadCLI("job", "revert", "-namespace", ns, "-detach", "rv", "0"); err != nil {
			t.Fatalf("revert to version 0 (1 GPU) through the broker: %v\n%s", err, out)
		}
		waitAllocsRunning(t, e.nomad, ns, "rv", 1)
		admittedAgain(t, e, consul, ns, "rv")
	})

	// P6: an admitted batch job, purged straight in Nomad and registered
	// again straight in Nomad as another type, with its stamp. As sysbatch,
	// on a pinned multi-node job, it multiplies; here it is a service, as
	// the purged job's ended allocation keeps a sysbatch copy off the one
	// node. The stamp binds the job's type, so it is not the broker's
	// admission.
	t.Run("a batch job's stamp on a job of another type is not an admission", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-retype"
		if out, err := e.run(ns, "sb", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("sb (batch, 1 GPU): %v\n%s", err, out)
		}
		stored, _, err := e.nomad.API.Jobs().Info("sb", &api.QueryOptions{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.nomad.API.Jobs().Deregister("sb", true, &api.WriteOptions{Namespace: ns}); err != nil {
			t.Fatal(err)
		}
		testcluster.WaitFor(t, 30*time.Second, "sb purged", func() error {
			if _, _, err := e.nomad.API.Jobs().Info("sb", &api.QueryOptions{Namespace: ns}); err == nil {
				return errors.New("still there")
			}
			return nil
		})
		stored.Type = ptr(api.JobTypeService)
		stored.ID, stored.Name = ptr("sb"), ptr("sb")
		if _, _, err := e.nomad.API.Jobs().Register(stored, nil); err != nil {
			t.Fatalf("sb again, straight in Nomad, as a service: %v", err)
		}
		testcluster.WaitFor(t, 30*time.Second, "the service copy read as unadmitted", func() error {
			if !e.unadmitted(ns, "sb") {
				allocs, _, err := e.nomad.API.Jobs().Allocations("sb", true, &api.QueryOptions{Namespace: ns})
				var seen []string
				for _, a := range allocs {
					seen = append(seen, a.ClientStatus+"/"+a.DesiredStatus)
				}
				return fmt.Errorf("no unadmitted decision on sb; its allocations: %v (%v)", seen, err)
			}
			return nil
		})

		// P1: the same, the copy unchanged: a purge is a stop, recorded.
		if out, err := e.run(ns, "pp", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("pp (1 GPU): %v\n%s", err, out)
		}
		waitAllocsRunning(t, e.nomad, ns, "pp", 1)
		kept, _, err := e.nomad.API.Jobs().Info("pp", &api.QueryOptions{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.nomad.API.Jobs().Deregister("pp", true, &api.WriteOptions{Namespace: ns}); err != nil {
			t.Fatal(err)
		}
		stopsRecorded(t, consul, ns, "pp")
		if _, _, err := e.nomad.API.Jobs().Register(kept, nil); err != nil {
			t.Fatalf("pp again, straight in Nomad: %v", err)
		}
		testcluster.WaitFor(t, 30*time.Second, "pp's copy read as unadmitted", func() error {
			if !e.unadmitted(ns, "pp") {
				return errors.New("no unadmitted decision on pp")
			}
			return nil
		})
	})

	// P2-P4: a stamp binds the version the broker wrote. A revert, a scale
	// or a stable made straight in Nomad, back to what a stamp or grant
	// covers, is not the broker's admission; the broker's own writes of the
	// same jobs are.
	t.Run("a revert, scale or stable straight in Nomad is unadmitted", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-bypass"
		q := &api.WriteOptions{Namespace: ns}
		admitted := func(id string) {
			t.Helper()
			waitPasses(t, e.broker, metrics.LoopReclaim, 3)
			if e.unadmitted(ns, id) {
				t.Fatalf("%s, written through the broker only, read as unadmitted", id)
			}
		}
		unadmitted := func(id, what string) {
			t.Helper()
			testcluster.WaitFor(t, 30*time.Second, what+" read as unadmitted", func() error {
				if !e.unadmitted(ns, id) {
					return errors.New("no unadmitted decision on " + id)
				}
				return nil
			})
		}

		// P2: version 0 of 2 GPUs, version 1 of 1, then a revert to 0
		// straight in Nomad.
		for _, gpus := range []int{2, 1} {
			if out, err := e.run(ns, "rb", 1, gpus, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("rb of %d GPUs: %v\n%s", gpus, err, out)
			}
		}
		waitAllocsRunning(t, e.nomad, ns, "rb", 1)
		admitted("rb")
		if _, _, err := e.nomad.API.Jobs().Revert("rb", 0, nil, q, "", ""); err != nil {
			t.Fatalf("revert straight in Nomad: %v", err)
		}
		unadmitted("rb", "P2: rb reverted straight in Nomad")
		e.stop(ns, "rb")
		e.waitUsed("bypass", 0)

		// P3: 2 x 1 GPU, scaled to 1 through the broker, back to 2 straight
		// in Nomad: the stamp verifies on those counts again.
		if out, err := e.run(ns, "rs", 2, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("rs, 2 x 1 GPU: %v\n%s", err, out)
		}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/rs/scale?namespace="+ns, `{"Count": 1, "Target": {"Group": "g"}}`); status != http.StatusOK {
			t.Fatalf("scale to 1 through the broker: %d %s", status, out)
		}
		e.waitUsed("bypass", 1)
		admitted("rs")
		if _, _, err := e.nomad.API.Jobs().Scale("rs", "g", ptr(2), "", false, nil, q); err != nil {
			t.Fatalf("scale back to 2 straight in Nomad: %v", err)
		}
		unadmitted("rs", "P3: rs scaled back straight in Nomad")
		e.stop(ns, "rs")
		e.waitUsed("bypass", 0)

		// P4: stopped, then version 0 marked stable straight in Nomad (Nomad
		// makes it the current one, with its old JobModifyIndex, running
		// again), then evaluated.
		for _, gpus := range []int{1, 2} {
			if out, err := e.run(ns, "rt", 1, gpus, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("rt of %d GPUs: %v\n%s", gpus, err, out)
			}
		}
		e.stop(ns, "rt")
		stopsRecorded(t, consul, ns, "rt")
		if _, _, err := e.nomad.API.Jobs().Stable("rt", 0, true, q); err != nil {
			t.Fatalf("stable on version 0 straight in Nomad: %v", err)
		}
		if _, _, err := e.nomad.API.Jobs().EvaluateWithOpts("rt", api.EvalOptions{}, q); err != nil {
			t.Fatalf("evaluate straight in Nomad: %v", err)
		}
		waitAllocsRunning(t, e.nomad, ns, "rt", 1)
		unadmitted("rt", "P4: rt run again by stable and evaluate straight in Nomad")
	})

	// A job stopped (or purged) through the broker must not start later from
	// the queue: Nomad answers 200 for a job it does not have.
	t.Run("stop: a queued job is taken out of the queue", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-stop"
		for _, id := range []string{"st", "other"} {
			if out, err := e.run(ns, id, 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("%s (1 GPU): %v\n%s", id, err, out)
			}
		}
		update := e.queuedIn(ns, "st", 2, true) // 1 + 2 GPUs against a limit of 2
		if out, err := e.nomadCLI("job", "stop", "-namespace", ns, "-detach", "st"); err != nil {
			t.Fatalf("nomad job stop of a running job whose update is queued: %v\n%s", err, out)
		}
		queueOnly := e.queuedIn(ns, "qo", 2, true)
		req, _ := http.NewRequest(http.MethodDelete, e.broker.Addr+"/v1/job/qo?purge=true&namespace="+ns, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("X-Nomad-Gpu-Dequeued") != queueOnly {
			t.Fatalf("purge of a job only queued: %v %+v", err, resp)
		}
		resp.Body.Close()
		for _, id := range []string{update, queueOnly} {
			if status, out := send(t, e.broker.Addr, http.MethodGet, "/v1/gpu/queue/"+id, ""); status != http.StatusNotFound {
				t.Errorf("queue entry %s of a stopped job: %d %s", id, status, out)
			}
		}
		from := passes(t, e.broker, metrics.LoopQueue)
		e.stop(ns, "other") // the limit has room: nothing stopped may start now
		waitPassesSince(t, e.broker, metrics.LoopQueue, from, 1)
		if j, _, err := e.nomad.API.Jobs().Info("st", &api.QueryOptions{Namespace: ns}); err != nil || !*j.Stop || gpusOf(j) != 1 {
			t.Errorf("the stopped job runs again: stop=%t, %d GPUs (%v)", *j.Stop, gpusOf(j), err)
		}
		if _, _, err := e.nomad.API.Jobs().Info("qo", &api.QueryOptions{Namespace: ns}); err == nil {
			t.Errorf("the purged queued job was registered")
		}
	})

	// A GPU group registered at count 0 is admitted and stamped like any
	// other, so that its scale-ups are decided (and not all refused).
	t.Run("count 0: admitted and stamped, then scaled within the limit", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-zero"
		out, err := e.run(ns, "z", 0, 1, "", true)
		if err != nil || !strings.Contains(out, "admitted: tenant zero, queue training, priority 60, 0 GPUs") {
			t.Fatalf("a GPU group at count 0: %v\n%s", err, out)
		}
		j, _, err := e.nomad.API.Jobs().Info("z", &api.QueryOptions{Namespace: ns})
		if err != nil || *j.Priority != 60 || j.Meta[nomadjob.MetaAdmission] == "" {
			t.Fatalf("Nomad has it at priority %d, stamp %q (%v)", *j.Priority, j.Meta[nomadjob.MetaAdmission], err)
		}
		if out, err := e.nomadCLI("job", "scale", "-namespace", ns, "-detach", "z", "g", "2"); err != nil {
			t.Errorf("scale to 2 GPUs, limit 2: %v\n%s", err, out)
		}
		out, err = e.nomadCLI("job", "scale", "-namespace", ns, "-detach", "z", "g", "3")
		if err == nil || !strings.Contains(out, "above-limit") {
			t.Errorf("scale to 3 GPUs, limit 2, must be refused: %v\n%s", err, out)
		}
		if j, _, err := e.nomad.API.Jobs().Info("z", &api.QueryOptions{Namespace: ns}); err != nil || *j.TaskGroups[0].Count != 2 {
			t.Errorf("Nomad's count: %d (%v), want 2", *j.TaskGroups[0].Count, err)
		}
	})

	// Five scales of five groups of one job at once, each to 1 GPU: the
	// tenant's limit of 2 admits two of them, whatever the order.
	t.Run("concurrent scales of one job: decided one after another", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-race"
		jb := job(ns, "five", api.JobTypeBatch) // a service job's scale starts a deployment, and Nomad blocks the next
		for i := 0; i < 5; i++ {
			jb.group(fmt.Sprintf("g%d", i), ptr(0), nil, task(dev("nvidia/gpu", 1)))
		}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("five GPU groups at count 0: %d %s", status, out)
		}
		var wg sync.WaitGroup
		statuses, answers := make([]int, 5), make([]string, 5)
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i], answers[i] = send(t, e.broker.Addr, http.MethodPut, "/v1/job/five/scale?namespace="+ns,
					fmt.Sprintf(`{"Count": 1, "Target": {"Group": "g%d"}}`, i))
			}()
		}
		wg.Wait()
		admitted := 0
		for _, s := range statuses {
			if s == http.StatusOK {
				admitted++
			}
		}
		j, _, err := e.nomad.API.Jobs().Info("five", &api.QueryOptions{Namespace: ns})
		if err != nil || admitted != 2 || gpusOf(j) != 2 {
			t.Errorf("%d scales admitted (answers %q), Nomad's job asks for %d GPUs (%v); the limit is 2", admitted, answers, gpusOf(j), err)
		}
	})

	// A job that would wait, but that Nomad would never take: the user's
	// error (400), with what Nomad's validator says, not a gateway error.
	t.Run("a job that would be queued: refused when invalid or too large, with the reason", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-invalid"
		if out, err := e.run(ns, "hold", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("the tenant's 1 GPU: %v\n%s", err, out)
		}
		spaced := job(ns, "has space", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", spaced.body(nil, canonical))
		if status != http.StatusBadRequest || !strings.Contains(out, `job "has space" not queued: the job is invalid: `) || !strings.Contains(out, "Job ID contains a space") {
			t.Errorf("a job id with a space, to be queued: %d %s", status, out)
		}

		// The default max_queued_request_bytes (256 KiB) fits one Consul
		// value: a request just below it is queued, one above is refused
		// with the limit named (not Consul's 413 as a 503).
		padded := func(id string, size int) string {
			jb := job(ns, id, api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
			jb.j.Meta = map[string]string{"pad": ""}
			jb.j.Meta["pad"] = strings.Repeat("x", size-len(jb.body(nil, canonical)))
			return jb.body(nil, canonical)
		}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", padded("near-limit", 255<<10)); status != http.StatusOK || !strings.Contains(out, "queued as") {
			t.Errorf("a request of 255 KiB: %d %.300s", status, out)
		}
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", padded("above-limit", 600<<10))
		if status != http.StatusTooManyRequests || !strings.Contains(out, `above tenant "invalid"'s max_queued_request_bytes of 262144`) {
			t.Errorf("a request of 600 KiB: %d %.300s", status, out)
		}
	})

	// Four uploads that stall from one client (127.0.0.2) hold two slots for
	// large bodies, and those for body_read_timeout only: another client's
	// chunked registration goes through meanwhile.
	t.Run("slow bodies: one client's stalled uploads do not block the others", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		type answer struct {
			client string
			status int
			body   string
			after  time.Duration
		}
		answers := make(chan answer, 6)
		start := time.Now()
		// stall sends n uploads from address ip that stop after their first
		// bytes.
		stall := func(ip string, n int) {
			from := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}}
			for i := 0; i < n; i++ {
				body, w := io.Pipe()
				t.Cleanup(func() { w.Close() })
				go w.Write([]byte(`{"Job": {"ID": "stalled"`)) // and then nothing
				go func() {
					req, _ := http.NewRequest(http.MethodPut, e.broker.Addr+"/v1/jobs", body)
					resp, err := from.Do(req)
					if err != nil {
						answers <- answer{client: ip, body: err.Error(), after: time.Since(start)}
						return
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					answers <- answer{ip, resp.StatusCode, string(b), time.Since(start)}
				}()
			}
		}
		stall("127.0.0.2", 4)
		time.Sleep(300 * time.Millisecond) // its two are in
		stall("127.0.0.3", 2)              // a second client: one more, not the last slot
		time.Sleep(300 * time.Millisecond)
		cpu := job("default", "chunked-cpu", api.JobTypeBatch).group("g", ptr(1), nil, task()).body(nil, canonical)
		req, _ := http.NewRequest(http.MethodPut, e.broker.Addr+"/v1/jobs", io.MultiReader(strings.NewReader(cpu))) // chunked
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("a chunked registration from a third client while two stall their uploads: %v %+v", err, resp)
		} else {
			resp.Body.Close()
		}
		got := map[string]int{}
		for i := 0; i < 6; i++ {
			a := <-answers
			got[fmt.Sprint(a.client, " ", a.status)]++
			switch a.status {
			case http.StatusServiceUnavailable:
				if !strings.Contains(a.body, "too many large requests") {
					t.Errorf("503: %s", a.body)
				}
			case http.StatusRequestTimeout:
				// A trickle is refused once it falls below the rate, not at the
				// body read timeout (D8: slots held for 30 s, renewed).
				if a.after > 3*time.Second || !strings.Contains(a.body, "slower than 64 KiB/s") {
					t.Errorf("408 after %s: %s", a.after, a.body)
				}
			}
		}
		want := map[string]int{"127.0.0.2 503": 2, "127.0.0.2 408": 2, "127.0.0.3 503": 1, "127.0.0.3 408": 1}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("the stalled uploads were answered %v, want %v", got, want)
		}
	})

	// A purge straight in Nomad sends no Job event: the broker reads it from
	// the purge's evaluation, not at its next full listing (a minute).
	t.Run("purge straight in Nomad: its GPUs count no more within seconds", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-purge"
		if out, err := e.run(ns, "first", 1, 2, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("2 GPUs of 2: %v\n%s", err, out)
		}
		e.waitRunning(ns, "first")
		if _, _, err := e.nomad.API.Jobs().Deregister("first", true, &api.WriteOptions{Namespace: ns}); err != nil {
			t.Fatal(err)
		}
		purged := time.Now()
		out, err := e.run(ns, "next", 1, 2, "", true)
		if err != nil {
			t.Fatalf("the next job of 2 GPUs: %v\n%s", err, out)
		}
		e.waitAdmitted(t, ns, "next", 15*time.Second) // the full listing comes after a minute
		t.Logf("the next job was in Nomad %s after the purge", time.Since(purged).Round(10*time.Millisecond))
	})

	// GPUs used without a device request are charged to no tenant: refused
	// (the policy's default), with the fix in the answer.
	t.Run("undeclared GPU access: refused by rule undeclared-gpu-access", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		byHand := job("default", "by-hand", api.JobTypeBatch).group("g", ptr(1), nil, task())
		byHand.j.TaskGroups[0].Tasks[0].Env = map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}
		privileged := job("default", "privileged", api.JobTypeBatch).group("g", ptr(1), nil, task())
		privileged.j.TaskGroups[0].Tasks[0].Driver = "docker"
		privileged.j.TaskGroups[0].Tasks[0].Config = map[string]any{"image": "nvidia/cuda", "privileged": true}
		// N9: the same read as the drivers decode it.
		docker := func(id string, config map[string]any, devs ...*api.RequestedDevice) *jobBuilder {
			jb := job("default", id, api.JobTypeBatch).group("g", ptr(1), nil, task(devs...))
			jb.j.TaskGroups[0].Tasks[0].Driver = "docker"
			jb.j.TaskGroups[0].Tasks[0].Config = config
			return jb
		}
		templated := job("default", "templated", api.JobTypeBatch).group("g", ptr(1), nil, task())
		templated.j.TaskGroups[0].Tasks[0].Templates = []*api.Template{{EmbeddedTmpl: ptr("NVIDIA_VISIBLE_DEVICES=all\n"),
			DestPath: ptr("local/gpu.env"), Envvars: ptr(true)}}
		refused := map[string]*jobBuilder{"by-hand": byHand, "privileged": privileged,
			"privileged-string": docker("privileged-string", map[string]any{"image": "nvidia/cuda", "privileged": "true"}),
			"double-slash":      docker("double-slash", map[string]any{"image": "nvidia/cuda", "devices": []any{map[string]any{"host_path": "/dev//nvidia0"}}}),
			"major-number":      docker("major-number", map[string]any{"image": "nvidia/cuda", "devices": []any{map[string]any{"host_path": "/dev/char/195:0"}}}),
			"runtime-count-0":   docker("runtime-count-0", map[string]any{"image": "nvidia/cuda", "runtime": "nvidia"}, dev("nvidia/gpu", 0)),
			"templated":         templated,
		}
		for id, jb := range refused {
			status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(nil, canonical))
			if status != http.StatusForbidden || !strings.Contains(out, fmt.Sprintf("job %q rejected by rule undeclared-gpu-access", id)) ||
				!strings.Contains(out, `ask for GPUs with a device block`) {
				t.Errorf("%s: %d %s", id, status, out)
			}
			if _, _, err := e.nomad.API.Jobs().Info(id, nil); err == nil {
				t.Errorf("%s: Nomad has it", id)
			}
		}
		// D3: hiding GPUs is not using them, and a task that asks for GPUs
		// gets the device plugin's variables, which replace its own.
		hiding := func(ns, id string, env map[string]string, devs ...*api.RequestedDevice) *jobBuilder {
			jb := job(ns, id, api.JobTypeBatch).group("g", ptr(1), nil, task(devs...))
			jb.j.TaskGroups[0].Tasks[0].Env = env
			return jb
		}
		for id, jb := range map[string]*jobBuilder{
			"void":      hiding("default", "void", map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}),
			"minus-one": hiding("default", "minus-one", map[string]string{"CUDA_VISIBLE_DEVICES": "-1"}),
			"empty":     hiding("default", "empty", map[string]string{"CUDA_VISIBLE_DEVICES": ""}),
			"selects":   hiding("gate-probe", "selects", map[string]string{"CUDA_VISIBLE_DEVICES": "0"}, dev("nvidia/gpu", 1)),
		} {
			status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", jb.body(nil, canonical))
			if status != http.StatusOK || strings.Contains(out, "undeclared") {
				t.Errorf("%s: %d %s", id, status, out)
			}
		}
	})

	// Failing a deployment with auto_revert makes Nomad run the last stable
	// version again: the broker decides it as that revert. The tenant's
	// other job was registered straight in Nomad (passthrough mode allows
	// it; reclaim would flag it), so that the revert does not fit.
	t.Run("deployment fail: decided as the revert it leads to", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-deploy"
		stableVersion0(t, e, ns)
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", deploying(ns, 1, time.Hour, false)); status != http.StatusOK {
			t.Fatalf("version 1, 1 GPU: %d %s", status, out)
		}
		if _, _, err := e.nomad.API.Jobs().Register(job(ns, "other", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1))).j, nil); err != nil {
			t.Fatalf("another job of 1 GPU, straight in Nomad: %v", err)
		}
		// Version 0's allocation ends as version 1's runs: svc counts its
		// stable version (2) while the deployment may revert, other 1.
		e.waitUsed("deploy", 3)
		var deployment *api.Deployment
		testcluster.WaitFor(t, 30*time.Second, "version 1's deployment", func() error {
			d, _, err := e.nomad.API.Jobs().LatestDeployment("svc", &api.QueryOptions{Namespace: ns})
			if err != nil || d == nil || d.JobVersion != 1 {
				return fmt.Errorf("deployment %+v (%v)", d, err)
			}
			deployment = d
			return nil
		})
		// D7: un-marking a version while its deployment may revert would
		// leave that deployment nothing to revert to.
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/svc/stable?namespace="+ns, `{"JobID": "svc", "JobVersion": 1, "Stable": false}`)
		if status != http.StatusForbidden || !strings.Contains(out, "reverts on failure") {
			t.Errorf("un-marking version 1 while its deployment may revert: %d %s", status, out)
		}
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/deployment/fail/"+deployment.ID, "")
		if status != http.StatusForbidden || !strings.Contains(out, `revert of "svc" refused: tenant "deploy" would hold 3 of its limit of 2 GPUs`) {
			t.Errorf("failing the deployment, which reverts to 2 GPUs beside 1 more (limit 2): %d %s", status, out)
		}
		if j, _, err := e.nomad.API.Jobs().Info("svc", &api.QueryOptions{Namespace: ns}); err != nil || *j.Version != 1 || gpusOf(j) != 1 {
			t.Errorf("Nomad reverted the job: version %d, %d GPUs (%v)", *j.Version, gpusOf(j), err)
		}
	})

	// A deployment that fails on its own makes Nomad revert with no call to
	// the broker: the stable version is counted from the deployment's start,
	// so no other job takes its GPUs meanwhile, and the revert is recorded.
	t.Run("a deployment that fails and reverts on its own: counted from its start, recorded", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-autorevert"
		stableVersion0(t, e, ns)
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", deploying(ns, 1, 2*time.Second, true))
		if status != http.StatusOK || !strings.Contains(out, "counted at the larger of two versions (this version 1, its stable version 2") {
			t.Fatalf("version 1, 1 GPU, failing: %d %s", status, out)
		}
		if out, err := e.run(ns, "other", 1, 1, "", true); err != nil || !strings.Contains(out, "queued as") {
			t.Errorf("another job of 1 GPU while version 1 deploys (it may revert to 2): %v\n%s", err, out)
		}
		testcluster.WaitFor(t, 90*time.Second, "Nomad's revert to version 0", func() error {
			j, _, err := e.nomad.API.Jobs().Info("svc", &api.QueryOptions{Namespace: ns})
			if err != nil || *j.Version < 2 || gpusOf(j) != 2 {
				return fmt.Errorf("version %d, %d GPUs (%v)", *j.Version, gpusOf(j), err)
			}
			return nil
		})
		if _, _, err := e.nomad.API.Jobs().Info("other", &api.QueryOptions{Namespace: ns}); err == nil {
			t.Errorf("Nomad has the other job beside the reverted one: the tenant holds 3 GPUs of its limit of 2")
		}
		// Nomad's own revert is not a write past the broker: the version it
		// makes is the broker's admission.
		waitPasses(t, e.broker, metrics.LoopReclaim, 3)
		if e.unadmitted(ns, "svc") {
			t.Errorf("the job Nomad reverted on its own reads as unadmitted")
		}
		testcluster.WaitFor(t, 30*time.Second, "the revert's record", func() error {
			out, err := exec.Command(testcluster.BrokerBinary(t), "audit", "-json", "-job", "svc", "-address", e.broker.Addr).CombinedOutput()
			if err != nil || !strings.Contains(string(out), `"what":"auto-revert"`) ||
				!strings.Contains(string(out), `admit: deployment`) || !strings.Contains(string(out), `tenant \"autorevert\" holds 2 of its limit of 2 GPUs`) {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	})

	// A record in Consul KV that cannot be read (a hand edit) is set aside
	// and counted; it stops neither queueing nor the queue's admissions.
	t.Run("a garbage record in Consul stops nobody", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-garbage"
		kv := consulKV(consul)
		bad := "nomad-gpu/queue/" + queue.NewID()
		for _, key := range []string{bad, "nomad-gpu/reclaim/" + queue.NewID(), "nomad-gpu/approvals/" + queue.NewID()} {
			if _, err := kv.Put(&consulapi.KVPair{Key: key, Value: []byte(`{"id": "hand-edited`)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := e.run(ns, "hold", 1, 2, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("2 GPUs: %v\n%s", err, out)
		}
		if out, err := e.run(ns, "waiter", 1, 1, "", true); err != nil || !strings.Contains(out, "queued as") {
			t.Fatalf("a job to queue beside a garbage entry: %v\n%s", err, out)
		}
		if _, _, err := e.nomad.API.Jobs().Deregister("hold", false, &api.WriteOptions{Namespace: ns}); err != nil {
			t.Fatal(err)
		}
		e.waitAdmitted(t, ns, "waiter", 60*time.Second)
		status, out := send(t, e.broker.Addr, http.MethodGet, "/v1/gpu/quarantine", "")
		if moved := strings.Replace(bad, "queue/", "quarantine/queue/", 1); status != http.StatusOK || !strings.Contains(out, moved) {
			t.Errorf("the records set aside: %d %s, want %s", status, out, moved)
		}
		if p, _, _ := kv.Get(bad, nil); p != nil {
			t.Errorf("the garbage entry is still in the queue")
		}
		for _, kind := range []string{"queue", "approvals"} {
			if n := e.broker.Scrape()[`nomadgpu_kv_unreadable_total{kind="`+kind+`"}`]; n < 1 {
				t.Errorf("nomadgpu_kv_unreadable_total{kind=%q} = %g", kind, n)
			}
		}
	})

	// Nomad writes the version a stability call names back as the job's
	// current one, with no evaluation and no event: on an older version it
	// is a revert (N1). The next evaluation would place it.
	t.Run("stable on an older version: refused as the revert it is", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-stable"
		if out, err := e.run(ns, "sw", 1, 2, "", true); err != nil || !strings.Contains(out, "2 GPUs") {
			t.Fatalf("version 0 (2 GPUs): %v\n%s", err, out)
		}
		waitAllocsRunning(t, e.nomad, ns, "sw", 1)
		if out, err := e.run(ns, "sw", 1, 1, "", true); err != nil || !strings.Contains(out, "1 GPUs") {
			t.Fatalf("version 1 (1 GPU): %v\n%s\n%s", err, out, e.holders("stable"))
		}
		e.waitUsed("stable", 1) // version 0's allocation ended
		if out, err := e.run(ns, "fill", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("a second job of 1 GPU: %v\n%s", err, out)
		}
		for _, stable := range []bool{true, false} {
			body := fmt.Sprintf(`{"JobID": "sw", "JobVersion": 0, "Stable": %t}`, stable)
			status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/sw/stable?namespace="+ns, body)
			if status != http.StatusForbidden || !strings.Contains(out, "revert to it instead (nomad job revert sw 0)") {
				t.Errorf("stable=%t on version 0 (2 GPUs) beside 1 more, limit 2: want 403 naming the revert; got %d %s", stable, status, out)
			}
		}
		if out, err := e.nomadCLI("job", "eval", "-namespace", ns, "sw"); err != nil {
			t.Fatalf("nomad job eval: %v\n%s", err, out)
		}
		if j, _, err := e.nomad.API.Jobs().Info("sw", &api.QueryOptions{Namespace: ns}); err != nil || *j.Version != 1 || gpusOf(j) != 1 {
			t.Errorf("Nomad's current sw: version %d, %d GPUs (%v); want version 1, 1 GPU", *j.Version, gpusOf(j), err)
		}
		// The current version's own stability changes no demand: passed on.
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/sw/stable?namespace="+ns, `{"JobID": "sw", "JobVersion": 1, "Stable": true}`)
		if status != http.StatusOK {
			t.Errorf("stable on the current version: %d %s", status, out)
		}
	})

	// Nomad places a sysbatch group's count on every node (N2): a count of
	// 3 on the one GPU node is 3 GPUs, and so is a scale to 3.
	t.Run("sysbatch: its count on every node is charged, at register and at scale", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-sysbatch"
		three := job(ns, "sb3", api.JobTypeSysbatch).group("g", ptr(3), nil, task(dev("nvidia/gpu", 1)))
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", three.body(nil, canonical))
		if status == http.StatusOK {
			t.Errorf("sysbatch count 3 × 1 GPU on 1 node, limit 2: admitted (%s)", out)
		}
		one := job(ns, "sb", api.JobTypeSysbatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", 1)))
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", one.body(nil, canonical)); status != http.StatusOK {
			t.Fatalf("sysbatch count 1 × 1 GPU: %d %s", status, out)
		}
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/sb/scale?namespace="+ns, `{"Count": 3, "Target": {"Group": "g"}}`)
		if status != http.StatusForbidden || !strings.Contains(out, "needs 3 GPUs") {
			t.Errorf("scale of the sysbatch job to 3 (3 GPUs, limit 2): %d %s", status, out)
		}
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/sb/scale?namespace="+ns, `{"Count": 2, "Target": {"Group": "g"}}`)
		if status != http.StatusOK {
			t.Errorf("scale of the sysbatch job to 2 (2 GPUs, limit 2): %d %s", status, out)
		}
		if _, _, err := e.nomad.API.Jobs().Info("sb3", &api.QueryOptions{Namespace: ns}); err == nil {
			t.Errorf("Nomad has sb3")
		}
	})

	// A scale Nomad refuses (its deployment is active) leaves the job's
	// grant as it was: the job stays the broker's admission as it runs
	// (D1: the grant said 2, Nomad ran 1, and unadmitted stopped it).
	t.Run("a scale Nomad refuses leaves the grant as Nomad runs the job", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-scaleblock"
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", deploying(ns, 1, time.Hour, false)); status != http.StatusOK {
			t.Fatalf("svc, 1 GPU, a deployment healthy after an hour: %d %s", status, out)
		}
		testcluster.WaitFor(t, 30*time.Second, "svc's deployment", func() error {
			d, _, err := e.nomad.API.Jobs().LatestDeployment("svc", &api.QueryOptions{Namespace: ns})
			if err != nil || d == nil || d.Status != api.DeploymentStatusRunning {
				return fmt.Errorf("deployment %+v (%v)", d, err)
			}
			return nil
		})
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/svc/scale?namespace="+ns, `{"Count": 2, "Target": {"Group": "g"}}`)
		if status == http.StatusOK || !strings.Contains(out, "active deployment") {
			t.Fatalf("a scale during the deployment: %d %s, want Nomad's refusal", status, out)
		}
		pair, _, err := consulKV(consul).Get(jobRecord("scaled", ns, "svc"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if pair != nil {
			var g nomadjob.ScaleGrant
			if err := json.Unmarshal(pair.Value, &g); err != nil || g.Admitted["g"] != 1 {
				t.Errorf("svc's grant after the refused scale: %s (%v); want admitted g = 1, as Nomad runs it", pair.Value, err)
			}
		}
	})

	// A stamp says "admitted", not "admitted for this run" (N6): a job
	// stopped, then registered again straight in Nomad with its stamp, is
	// not the broker's admission; stopped and run again through the broker,
	// it is.
	t.Run("a stopped job registered again straight in Nomad is unadmitted", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		const ns = "gate-replay"
		for _, id := range []string{"rp", "again"} {
			if out, err := e.run(ns, id, 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("%s: %v\n%s", id, err, out)
			}
			if out, err := e.nomadCLI("job", "stop", "-detach", "-namespace", ns, id); err != nil {
				t.Fatalf("stop %s through the broker: %v\n%s", id, err, out)
			}
		}
		e.waitUsed("replay", 0) // their allocations ended
		stopsRecorded(t, consul, ns, "rp", "again")
		replay, _, err := e.nomad.API.Jobs().Info("rp", &api.QueryOptions{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		replay.Stop = ptr(false)
		if _, _, err := e.nomad.API.Jobs().Register(replay, nil); err != nil {
			t.Fatalf("rp again, straight in Nomad: %v", err)
		}
		if out, err := e.run(ns, "again", 1, 1, "", true); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("again, through the broker: %v\n%s", err, out)
		}
		waitAllocsRunning(t, e.nomad, ns, "rp", 1)
		waitAllocsRunning(t, e.nomad, ns, "again", 1)
		testcluster.WaitFor(t, 30*time.Second, "rp read as unadmitted", func() error {
			if !e.unadmitted(ns, "rp") {
				// What the rule reads, for a failure to say which was off.
				p, _, _ := consulKV(consul).Get(jobRecord("stopped", ns, "rp"), nil)
				j, _, _ := e.nomad.API.Jobs().Info("rp", &api.QueryOptions{Namespace: ns})
				var record string
				if p != nil {
					record = string(p.Value)
				}
				var index uint64
				if j != nil && j.JobModifyIndex != nil {
					index = *j.JobModifyIndex
				}
				return fmt.Errorf("no unadmitted decision on rp (its stop record %s; Nomad's JobModifyIndex %d)", record, index)
			}
			return nil
		})
		admittedAgain(t, e, consul, ns, "again")
	})

	// A write the broker's route table does not know is passed through
	// without exclusive enforcement, logged and counted by its route's
	// pattern, never by the caller's path.
	t.Run("an unknown write: passed through and counted by route", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		status, _ := send(t, e.broker.Addr, http.MethodPut, "/v1/nodes", `{}`)
		if status != http.StatusMethodNotAllowed {
			t.Errorf("PUT /v1/nodes (Nomad: reads only): %d, want Nomad's 405", status)
		}
		send(t, e.broker.Addr, http.MethodPost, "/v1/made-up-route-x1", `{}`)
		scrape := e.broker.Scrape()
		if n := scrape[`nomadgpu_unclassified_writes_total{route="/v1/nodes"}`]; n < 1 {
			t.Errorf("nomadgpu_unclassified_writes_total{route=\"/v1/nodes\"} = %g, want at least 1", n)
		}
		if n := scrape[`nomadgpu_unclassified_writes_total{route="/"}`]; n < 1 {
			t.Errorf("nomadgpu_unclassified_writes_total{route=\"/\"} = %g, want at least 1", n)
		}
		for name := range scrape {
			if strings.Contains(name, "made-up-route") {
				t.Errorf("a label holds the caller's path: %s", name)
			}
		}
		// A refused route is refused whatever the mode.
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/operator/snapshot", ""); status != http.StatusForbidden ||
			!strings.Contains(out, "restoring a snapshot brings back every job") {
			t.Errorf("a snapshot restore through the broker: %d %s", status, out)
		}
	})

	t.Run("metrics: a queue the policy does not name is labelled other", func(t *testing.T) {
		t.Parallel()
		e := e.in(t)
		for i := 0; i < 5; i++ {
			out, err := e.run("gate-probe", fmt.Sprintf("label-%d", i), 1, 1, fmt.Sprintf("made-up-%d", i), true)
			if err == nil || !strings.Contains(out, "queue-not-allowed") {
				t.Fatalf("a job in a queue the policy does not have: %v\n%s", err, out)
			}
		}
		for name := range e.broker.Scrape() {
			if strings.Contains(name, "made-up-") {
				t.Errorf("a label holds the caller's text: %s", name)
			}
		}
		key := `nomadgpu_admissions_total{outcome="reject",queue="other",rule="queue-not-allowed",source="submit"}`
		if n := e.broker.Scrape()[key]; n < 5 {
			t.Errorf("%s = %g, want at least 5", key, n)
		}
	})
}

// deploying is a register request of service job svc in ns: one
// allocation of gpus GPUs, whose deployments revert on failure, healthy after
// healthy; a failing one's task never starts.
func deploying(ns string, gpus int, healthy time.Duration, failing bool) string {
	tk := task(dev("nvidia/gpu", uint64(gpus)))
	if failing {
		tk.Config = map[string]any{"start_error": "version 1 is broken"}
	}
	jb := job(ns, "svc", api.JobTypeService).group("g", ptr(1), nil, tk)
	if !failing {
		jb.j.TaskGroups[0].RestartPolicy = nil
	}
	jb.j.Update = &api.UpdateStrategy{AutoRevert: ptr(true), MinHealthyTime: ptr(healthy),
		HealthyDeadline: ptr(2 * healthy), ProgressDeadline: ptr(3 * healthy)}
	return jb.body(nil, canonical)
}

// stableVersion0 registers version 0 of svc in ns (2 GPUs, deployments
// that revert on failure) through the broker and waits until it is stable.
func stableVersion0(t *testing.T, e *env, ns string) {
	t.Helper()
	if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", deploying(ns, 2, 2*time.Second, false)); status != http.StatusOK {
		t.Fatalf("version 0, 2 GPUs: %d %s", status, out)
	}
	testcluster.WaitFor(t, 60*time.Second, "svc stable", func() error {
		j, _, err := e.nomad.API.Jobs().Info("svc", &api.QueryOptions{Namespace: ns})
		if err != nil || j.Stable == nil || !*j.Stable {
			return fmt.Errorf("not stable yet (%v)", err)
		}
		return nil
	})
}

// in is e for a subtest t of the test e was made for.
func (e *env) in(t *testing.T) *env {
	c := *e
	c.t, c.dir = t, t.TempDir()
	return &c
}

// gpusOf is the GPUs a job's groups ask for at their counts.
func gpusOf(j *api.Job) int {
	n := 0
	for _, tg := range j.TaskGroups {
		for _, task := range tg.Tasks {
			for _, d := range task.Resources.Devices {
				n += *tg.Count * int(*d.Count)
			}
		}
	}
	return n
}

// stopsRecorded waits until the leader recorded the stops of jobs ids in ns.
func stopsRecorded(t *testing.T, consul *testcluster.Consul, ns string, ids ...string) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, "the stops recorded", func() error {
		for _, id := range ids {
			if p, _, err := consulKV(consul).Get(jobRecord("stopped", ns, id), nil); err != nil || p == nil {
				return fmt.Errorf("no record of %s's stop (%v)", id, err)
			}
		}
		return nil
	})
}

// admittedAgain checks that job ns/id, stopped and run again through the
// broker, is its admission: after reclaim passes it is not read as
// unadmitted, and its stop record is gone.
func admittedAgain(t *testing.T, e *env, consul *testcluster.Consul, ns, id string) {
	t.Helper()
	waitPasses(t, e.broker, metrics.LoopReclaim, 3)
	if e.unadmitted(ns, id) {
		t.Errorf("%s, run again through the broker, read as unadmitted", id)
	}
	if p, _, err := consulKV(consul).Get(jobRecord("stopped", ns, id), nil); err != nil || p != nil {
		t.Errorf("%s's stop record after it ran again through the broker: %v %v", id, p, err)
	}
}

// send makes an HTTP request to addr and returns the answer's status and
// body; redirects are answers too.
func send(t testing.TB, addr, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestASystemJobDoesNotGrowOntoANodeThatJoins: a system job admitted for the
// one GPU node there is (1 GPU, its tenant's limit 1) stays there when a
// second GPU node joins. The broker pinned it to the nodes it counted, so
// Nomad places nothing on the new node, and the tenant is charged 1 GPU.
// (A cluster of its own: a node joins it.)
func TestASystemJobDoesNotGrowOntoANodeThatJoins(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "join-1", 2, "daemons")
	e := brokerEnv(t, n, consul, `
queue "training" { priority = 60 }
tenant "daemons" {
  namespaces = ["daemons"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 1
}
reclaim_settings {
  period = "1s"
}
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  grace      = "1h"
  mode       = "dry-run"
}
`, "daemons", 2, testcluster.BrokerOptions{})
	monitor := job("daemons", "monitor", api.JobTypeSystem).group("g", nil, nil, task(dev("nvidia/gpu", 1)))
	if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/jobs", monitor.body(nil, canonical)); status != http.StatusOK || !strings.Contains(out, "1 GPUs") {
		t.Fatalf("a system job of 1 GPU a node, on one node: %d %s", status, out)
	}
	waitAllocsRunning(t, n, "daemons", "monitor", 1)

	testcluster.StartNomad(t, testcluster.NomadOptions{Name: "join-2", Client: true, Join: []string{n.RPCAddr},
		PluginConfig: "\n    backend = \"fake\"\n    fake {\n      count     = 2\n      id_prefix = \"join-2\"\n    }"})
	n.WaitForNodes(t, 2)
	// Nomad evaluates its system jobs for a node that joins.
	testcluster.WaitFor(t, 60*time.Second, "the system job evaluated for the new node", func() error {
		evals, _, err := n.API.Jobs().Evaluations("monitor", &api.QueryOptions{Namespace: "daemons"})
		if err != nil {
			return err
		}
		for _, ev := range evals {
			if ev.TriggeredBy == "node-update" && ev.Status == api.EvalStatusComplete {
				return nil
			}
		}
		return fmt.Errorf("evaluations %d", len(evals))
	})
	allocs, _, err := n.API.Jobs().Allocations("monitor", false, &api.QueryOptions{Namespace: "daemons"})
	live := 0
	for _, a := range allocs {
		if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
			live++
		}
	}
	if err != nil || live != 1 {
		t.Errorf("the system job runs %d allocations after a node joined, its tenant's limit is 1 GPU (%v)", live, err)
	}
	if used := e.usedBy("daemons"); used != 1 {
		t.Errorf("the broker charges tenant daemons %g GPUs, want 1", used)
	}

	// The same job, its stamp kept and its pin taken out, registered straight
	// in Nomad (passthrough) grows onto the new node. Its stamp binds the
	// pin, so it is not the broker's admission any more (N7); as work nobody
	// admitted over its tenant's limit of 1 it is requeued at once.
	unpinned, _, err := n.API.Jobs().Info("monitor", &api.QueryOptions{Namespace: "daemons"})
	if err != nil {
		t.Fatal(err)
	}
	unpinned.TaskGroups[0].Constraints = nil
	if _, _, err := n.API.Jobs().Register(unpinned, nil); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 60*time.Second, "the unpinned copy read as unadmitted, and requeued", func() error {
		var recs []reclaim.Record
		if err := json.Unmarshal([]byte(e.brokerCLI("reclaim", "list", "-json")), &recs); err != nil {
			return err
		}
		rules := map[string]bool{}
		for _, r := range recs {
			if r.Job == "monitor" && (r.Rule != "over-limit" || strings.Contains(r.Evidence, "no decision of the broker's covers")) {
				rules[r.Rule] = true
			}
		}
		if !rules["unadmitted"] || !rules["over-limit"] {
			return fmt.Errorf("decisions on monitor: %v", rules)
		}
		return nil
	})
}

// jobRecord is the key of the broker's record of kind (stopped, scaled,
// registered) of job ns/id in the tests' one region.
func jobRecord(kind, ns, id string) string {
	return "nomad-gpu/" + kind + "/" + api.GlobalRegion + "/" + ns + "/" + id
}
