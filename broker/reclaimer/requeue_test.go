package reclaimer_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// nomadJobs is Nomad's jobs as the requeue reads them.
type nomadJobs map[string]*api.Job

func (j nomadJobs) Job(_ context.Context, ns, id string) (*api.Job, error) { return j[ns+"/"+id], nil }

func TestARequeuedJobGoesBackToTheQueueAsNomadHasItThenStops(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 2
  limit      = 8
}`)
	submitted := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	train := testbuild.Job("vision", "train").Group("g", 2, 2, "gpu").Meta("nomad-gpu.queue", "dev").ModifyIndex(41).Build()
	train.SubmitTime = ptr(submitted.UnixNano())
	stopped := testbuild.Job("vision", "done").Group("g", 1, 1, "gpu").Stopped().Build()
	q, act := queuetest.NewMem(), &actor{}
	counted := map[string]int{} // by decision: a decision carried out again counts once
	r := &reclaimer.Requeue{Jobs: nomadJobs{"vision/train": train, "vision/done": stopped}, Actor: act, Queue: q, Policies: testbuild.Fixed{P: p},
		Preempted: func(_ context.Context, ns, id, decision string, at time.Time) (int, error) {
			if _, ok := counted[decision]; !ok {
				counted[decision] = len(counted) + 1
			}
			return counted[decision], nil
		}}
	rec := reclaim.Record{ID: "11111111-2222-4333-8444-555555555555", Rule: "preempted-borrowed", Namespace: "vision", Job: "train",
		Evidence: "preempted by Nomad while borrowing", ProposedAt: t0}

	out, err := r.Requeue(context.Background(), rec)
	if err != nil || !strings.Contains(out, "requeued as "+rec.ID) || !strings.Contains(out, "evaluation e1") {
		t.Fatalf("%q %v", out, err)
	}
	e, err := q.Get(context.Background(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Tenant != "vision" || e.Queue != "dev" || e.Demand != 4 || !e.SubmittedAt.Equal(submitted) || e.Stopping != 41 || !e.StoppingSince.Equal(t0) ||
		!strings.Contains(e.Reason, "requeued by rule preempted-borrowed: preempted by Nomad") ||
		!strings.HasSuffix(e.Reason, "; borrowing again after "+t0.Add(policy.DefaultBorrowBackoff).UTC().Format("15:04")+" (preempted 1 time)") {
		t.Errorf("entry %+v", e)
	}
	var body struct{ Job api.Job }
	if err := json.Unmarshal(e.Request, &body); err != nil || *body.Job.ID != "train" || *body.Job.TaskGroups[0].Count != 2 {
		t.Errorf("the stored request is not the job as Nomad has it: %v %s", err, e.Request)
	}
	if len(act.did) != 1 || act.did[0] != "stop job vision/train" {
		t.Errorf("stops %v", act.did)
	}
	// A job stopped or gone since: nothing queued again, nothing stopped.
	for _, id := range []string{"done", "gone"} {
		rec.ID, rec.Job = "22222222-2222-4333-8444-55555555555"+id[:1], id
		if out, err := r.Requeue(context.Background(), rec); err != nil || strings.Contains(out, "; ") {
			t.Errorf("%s: %q %v", id, out, err)
		}
	}
	if all, _ := q.List(context.Background()); len(all) != 1 || len(act.did) != 1 {
		t.Errorf("after stopped and gone jobs: %d entries, stops %v", len(all), act.did)
	}
	// Work requeued to make room goes to the back of the queue: with its
	// age it would be admitted again before the job it made room for.
	rec.ID, rec.Rule, rec.Job = "33333333-2222-4333-8444-555555555555", "make-room", "train"
	if _, err := r.Requeue(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if e, err := q.Get(context.Background(), rec.ID); err != nil || !e.SubmittedAt.Equal(t0) {
		t.Errorf("make-room's entry submitted at %v (%v), want the decision's time %v", e.SubmittedAt, err, t0)
	}
}

func ptr[T any](v T) *T { return &v }

// The fifth eviction while borrowed (borrowing.max_preemptions) says so in
// the requeued entry's reason.
func TestARequeueAtMaxPreemptionsSaysItBorrowsNoMore(t *testing.T) {
	p := testbuild.Policy(t, `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
  guaranteed = 2
  limit      = 8
}`)
	train := testbuild.Job("vision", "train").Group("g", 2, 2, "gpu").Meta("nomad-gpu.queue", "dev").ModifyIndex(41).Build()
	q := queuetest.NewMem()
	r := &reclaimer.Requeue{Jobs: nomadJobs{"vision/train": train}, Actor: &actor{}, Queue: q, Policies: testbuild.Fixed{P: p},
		Preempted: func(context.Context, string, string, string, time.Time) (int, error) {
			return policy.DefaultMaxPreemptions, nil
		}}
	rec := reclaim.Record{ID: "11111111-2222-4333-8444-555555555555", Rule: "preempted-borrowed", Namespace: "vision", Job: "train",
		Evidence: "preempted by Nomad while borrowing", ProposedAt: t0}
	if _, err := r.Requeue(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	e, err := q.Get(context.Background(), rec.ID)
	want := "; borrowing no more (preempted 5 times: borrowing.max_preemptions)"
	if err != nil || !strings.HasSuffix(e.Reason, want) {
		t.Errorf("reason %q (%v), want it to end %q", e.Reason, err, want)
	}
}
