package decide_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

const policySrc = `
queue "training" {
  priority = 60
  workload = "training"
}
workload "training" {
  checkpoint_grace = "2m"
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
}
`

// versions answers the lookups Prepare makes, and counts them.
type versions struct {
	current, stable *api.Job
	err             error
	asked           []string
}

func (v *versions) Job(_ context.Context, ns, id string) (*api.Job, error) {
	v.asked = append(v.asked, "job "+ns+"/"+id)
	return v.current, v.err
}

func (v *versions) StableJob(_ context.Context, ns, id string) (*api.Job, error) {
	v.asked = append(v.asked, "stable "+ns+"/"+id)
	return v.stable, v.err
}

func sequence(t *testing.T) (*decide.Sequence, *cluster.View) {
	view := cluster.NewView(nil)
	view.ObserveNode(testbuild.Node("n", "H100", 4, 0))
	return &decide.Sequence{Cluster: view, Enricher: enrich.Enricher{Clock: clock.Fixed(time.Now())}}, view
}

func request(t *testing.T, b *testbuild.JobBuilder) *nomadjob.Request {
	req, err := nomadjob.ReadRequest(nomadjob.Register, []byte(b.Register()), url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Prepare reads Nomad only where counts depend on it (canaries, a revert),
// pins what it counted and writes the workload in.
func TestPrepareReadsNomadOnlyWhereTheCountsDependOnIt(t *testing.T) {
	p := testbuild.Policy(t, policySrc)
	seq, _ := sequence(t)
	for name, c := range map[string]struct {
		job   *testbuild.JobBuilder
		asked string
	}{
		"plain":       {testbuild.Job("vision", "a").Meta(nomadjob.MetaQueue, "training").Group("g", 1, 1, "nvidia/gpu"), "[]"},
		"canaries":    {testbuild.Job("vision", "b").Group("g", 1, 1, "nvidia/gpu").Canary(1), "[job vision/b]"},
		"auto-revert": {testbuild.Job("vision", "c").Group("g", 1, 1, "nvidia/gpu").AutoRevert(), "[stable vision/c]"},
	} {
		v := &versions{}
		r, err := seq.Prepare(context.Background(), p, request(t, c.job), v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := "[" + strings.Join(v.asked, " ") + "]"; got != c.asked {
			t.Errorf("%s: asked %s, want %s", name, got, c.asked)
		}
		if len(r.Groups) != 1 || r.Groups[0].Count != 1 || !strings.Contains(string(r.Body()), `"Count":1`) {
			t.Errorf("%s: groups %+v, body %s", name, r.Groups, r.Body())
		}
	}
	r, _ := seq.Prepare(context.Background(), p, request(t, testbuild.Job("vision", "a").Meta(nomadjob.MetaQueue, "training").Group("g", 1, 1, "nvidia/gpu")), &versions{})
	if len(r.Wrote) == 0 || !strings.Contains(string(r.Body()), `"KillTimeout":120000000000`) {
		t.Errorf("the workload was not written: %q %s", r.Wrote, r.Body())
	}
}

// A job that cannot be admitted as it stands is the job's error (400, or
// parked); a lookup that failed is not (try again).
func TestPrepareTellsTheJobsErrorsFromLookups(t *testing.T) {
	p := testbuild.Policy(t, policySrc)
	seq, _ := sequence(t)
	_, err := seq.Prepare(context.Background(), p, request(t, testbuild.Job("vision", "x").Group("g", nomadjob.MaxGroupCount+1, 1, "nvidia/gpu")), &versions{})
	if !decide.IsJobError(err) {
		t.Errorf("an absurd count: %v, want the job's error", err)
	}
	down := errors.New("Nomad is unreachable")
	_, err = seq.Prepare(context.Background(), p, request(t, testbuild.Job("vision", "b").Group("g", 1, 1, "nvidia/gpu").Canary(1)), &versions{err: down})
	if !errors.Is(err, down) || decide.IsJobError(err) {
		t.Errorf("a failed lookup: %v, want it as it came", err)
	}
}

// A preview holds nothing; a reservation holds the GPUs it admits until
// released; both decide under the approvals in force.
func TestAPreviewReservesNothingAndBothSeeApprovals(t *testing.T) {
	p := testbuild.Policy(t, policySrc)
	seq, view := sequence(t)
	now := time.Now()
	granted := approval.Approval{ID: "a1", Namespace: "vision", Job: "big", Reason: "deadline", Priority: 90, For: "1h"}
	granted.Grant("ops", now.Add(-time.Minute))
	seq.Approvals = func() []approval.Approval { return []approval.Approval{granted} }
	big := admission.Job{ID: "big", Namespace: "vision", Queue: "training", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 4}}}
	free := func() float64 { return view.UsageWithout(p, "", "").Idle.Total() }
	if d, _ := seq.Decide(p, big, decide.Preview); d.Outcome != admission.Admit || d.Priority != 90 || free() != 4 {
		t.Fatalf("preview: %s (%s), %g GPUs free", d.Outcome, d.Reason, free())
	}
	d, res := seq.Decide(p, big, decide.Reserve)
	if d.Outcome != admission.Admit || d.Priority != 90 || free() != 0 {
		t.Fatalf("reserve: %s (%s), %g GPUs free", d.Outcome, d.Reason, free())
	}
	res.Release()
	if free() != 4 {
		t.Errorf("released: %g GPUs free", free())
	}
	seq.Approvals = nil
	if d, _ := seq.Decide(p, big, decide.Preview); d.Priority != 60 {
		t.Errorf("without the approval: priority %d, want the queue's 60", d.Priority)
	}
}
