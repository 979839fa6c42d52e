package reclaimer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// promoteJobs is Nomad as the bander reads and registers jobs. Each job it
// sends has a field of a newer Nomad, which must come back as it was sent.
type promoteJobs struct {
	jobs       map[string]*api.Job
	registered []api.JobRegisterRequest
}

const newerField = `"FutureField":{"Kept":[1,"two"]}`

func (n *promoteJobs) JobDoc(_ context.Context, _, id string) (*jsondoc.Doc, *api.Job, error) {
	j := n.jobs[id]
	if j == nil {
		return nil, nil, nil
	}
	b, err := json.Marshal(j)
	if err != nil {
		return nil, nil, err
	}
	var job api.Job
	doc, err := jsondoc.Parse(append(b[:len(b)-1:len(b)-1], ","+newerField+"}"...), &job)
	return doc, &job, err
}

func (n *promoteJobs) RegisterAt(_ context.Context, _ string, job []byte, index uint64) (uint64, error) {
	req := api.JobRegisterRequest{EnforceIndex: true, JobModifyIndex: index}
	if err := json.Unmarshal(job, &req.Job); err != nil {
		return 0, err
	}
	if !strings.Contains(string(job), newerField) {
		return 0, fmt.Errorf("a field of a newer Nomad was lost: %s", job)
	}
	n.registered = append(n.registered, req)
	return 0, nil
}

// grants keeps scale grants by job id.
type grants map[string]nomadjob.ScaleGrant

func (g grants) Get(_ context.Context, job nomadjob.Ref) (nomadjob.ScaleGrant, bool, error) {
	v, ok := g[job.ID]
	return v, ok, nil
}
func (g grants) Put(_ context.Context, job nomadjob.Ref, v nomadjob.ScaleGrant) error {
	g[job.ID] = v
	return nil
}

type usageOf admission.Usage

func (u usageOf) UsageWithout(*policy.Policy, string, string) admission.Usage {
	return admission.Usage(u)
}

// bandPolicy is one tenant, guaranteed 4 GPUs, that borrows; borrowing's
// other settings follow.
func bandPolicy(t *testing.T, borrowing string) *policy.Policy {
	return testbuild.Policy(t, `
queue "training" { priority = 60 }
borrowing {
  enabled = true
  `+borrowing+`
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 8
}
`)
}

// borrowedJob is a job as Nomad returns it once the broker admitted it
// borrowed at 20: 1 allocation of 2 GPUs, at index 7.
func borrowedJob(st nomadjob.Stamper, id string) *api.Job {
	return admittedBorrowed(st, testbuild.Job("vision", id).Priority(20).Group("g", 1, 2, "nvidia/gpu").ModifyIndex(7).Build())
}

// admittedBorrowed is j with the meta and stamp of vision's borrowed
// admission at 20.
func admittedBorrowed(st nomadjob.Stamper, j *api.Job) *api.Job {
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 20, Outcome: admission.AdmitBorrowed}
	for k, v := range nomadjob.BrokerMeta(d, st.Stamp("vision", j, d)) {
		j.Meta[k] = v
	}
	return j
}

func TestThePromoterRunsBorrowedWorkOnAtItsBandInPlace(t *testing.T) {
	p := bandPolicy(t, "promote_below = 1\n  sub_bands = false")
	st := nomadjob.Stamper{Key: []byte("k")}
	borrowed := func(id string) *api.Job { return borrowedJob(st, id) }
	nomad := &promoteJobs{jobs: map[string]*api.Job{"big": borrowed("big"), "small": borrowed("small"), "changed": borrowed("changed")}}
	nomad.jobs["changed"].Meta[nomadjob.MetaBorrowed] = "false" // registered again since, within the guarantee
	g := grants{}
	pr := &reclaimer.Bander{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, Jobs: nomad, Grants: g, Stamper: st,
		Lock:  func(string, string) func() { return func() {} },
		Usage: usageOf{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: 6}, Borrowed: policy.Quota{policy.AllGPUs: 6}}}}}
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	alloc := func(job string, at time.Duration, gpus ...string) reclaim.Alloc {
		return reclaim.Alloc{ID: job + "-a", Namespace: "vision", JobID: job, Admitted: true, Borrowed: true, Tenant: "vision", Queue: "training",
			StartedAt: t0.Add(at), GPUs: gpus}
	}
	allocs := []reclaim.Alloc{alloc("small", time.Hour, "g2", "g3"), alloc("big", 0, "g4", "g5"), alloc("changed", -time.Hour, "g6", "g7")}
	gpus := map[string]reclaim.GPU{}
	for _, id := range []string{"g2", "g3", "g4", "g5", "g6", "g7"} {
		gpus[id] = reclaim.GPU{Healthy: true}
	}
	if err := pr.Observed(context.Background(), t0.Add(2*time.Hour), allocs, gpus); err != nil {
		t.Fatal(err)
	}
	// Nothing held within the guarantee of 4: changed (the oldest) takes 2
	// of it but is no longer borrowed in Nomad, big (2) comes next, small
	// (2) would pass 4.
	if len(nomad.registered) != 1 || *nomad.registered[0].Job.ID != "big" || *nomad.registered[0].Job.Priority != p.Queues["training"].Band ||
		!nomad.registered[0].EnforceIndex || nomad.registered[0].JobModifyIndex != 7 {
		t.Fatalf("registered %+v, want big at priority %d, at its index", nomad.registered, p.Queues["training"].Band)
	}
	promoted := nomad.registered[0].Job
	if grant := g["big"]; grant.StampedPriority != p.Borrowing.Priority || !st.VerifyScaled(promoted, grant) || !grant.Promoted(promoted) {
		t.Errorf("the grant %+v does not keep the promoted job verifiable", grant)
	}
	// Promoted already (as the next pass reads Nomad): not again.
	nomad.jobs["big"] = promoted
	nomad.registered = nil
	if err := pr.Observed(context.Background(), t0.Add(3*time.Hour), allocs[1:2], gpus); err != nil || len(nomad.registered) != 0 {
		t.Errorf("promoted twice: %v %+v", err, nomad.registered)
	}
}

// A workload's own promote_below promotes its work where the borrowing block
// promotes none: the leader weighs the same rule as the simulator.
func TestThePromoterFollowsAWorkloadsOwnPromoteBelow(t *testing.T) {
	p := bandPolicy(t, "sub_bands = false")
	p.Workloads = map[string]*policy.Workload{"training": {Name: "training", PromoteBelow: new(float64)}}
	*p.Workloads["training"].PromoteBelow = 1
	st := nomadjob.Stamper{Key: []byte("k")}
	nomad := &promoteJobs{jobs: map[string]*api.Job{"serve": borrowedJob(st, "serve")}}
	pr := &reclaimer.Bander{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, Jobs: nomad, Grants: grants{}, Stamper: st,
		Lock:  func(string, string) func() { return func() {} },
		Usage: usageOf{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: 2}, Borrowed: policy.Quota{policy.AllGPUs: 2}}}}}
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	allocs := []reclaim.Alloc{{ID: "serve-a", Namespace: "vision", JobID: "serve", Admitted: true, Borrowed: true, Tenant: "vision",
		Queue: "training", StartedAt: t0, GPUs: []string{"g0", "g1"}}}
	gpus := map[string]reclaim.GPU{"g0": {Healthy: true}, "g1": {Healthy: true}}
	if err := pr.Observed(context.Background(), t0.Add(time.Hour), allocs, gpus); err != nil {
		t.Fatal(err)
	}
	if len(nomad.registered) != 1 || *nomad.registered[0].Job.Priority != p.Queues["training"].Band {
		t.Fatalf("registered %+v, want serve at its band %d", nomad.registered, p.Queues["training"].Band)
	}
}

// A borrowed job running in another region the broker governs is promoted
// there, through that region's client.
func TestThePromoterPromotesInTheRegionTheJobRunsIn(t *testing.T) {
	p := bandPolicy(t, "promote_below = 1\n  sub_bands = false")
	st := nomadjob.Stamper{Key: []byte("k")}
	home, west := &promoteJobs{jobs: map[string]*api.Job{}}, &promoteJobs{jobs: map[string]*api.Job{"far": borrowedJob(st, "far")}}
	pr := &reclaimer.Bander{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, Jobs: home, Elsewhere: map[string]reclaimer.PromoteJobs{"west": west},
		Grants: grants{}, Stamper: st, Lock: func(string, string) func() { return func() {} },
		Usage: usageOf{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: 2}, Borrowed: policy.Quota{policy.AllGPUs: 2}}}}}
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	allocs := []reclaim.Alloc{{ID: "far-a", Namespace: "vision", JobID: "far", Region: "west", Admitted: true, Borrowed: true, Tenant: "vision",
		Queue: "training", StartedAt: t0, GPUs: []string{"w0", "w1"}}}
	gpus := map[string]reclaim.GPU{"w0": {Healthy: true}, "w1": {Healthy: true}}
	if err := pr.Observed(context.Background(), t0.Add(time.Hour), allocs, gpus); err != nil {
		t.Fatal(err)
	}
	if len(home.registered) != 0 || len(west.registered) != 1 || *west.registered[0].Job.Priority != p.Queues["training"].Band {
		t.Fatalf("registered %d in the broker's own region, %d in west; want far once, in west, at its band", len(home.registered), len(west.registered))
	}
}

// With sub-bands, a borrowed job moves up as the GPU time a preemption would
// lose grows, in place, and stays verifiable (as borrowed) at each step.
func TestTheBanderMovesBorrowedWorkUpItsSubBands(t *testing.T) {
	p := bandPolicy(t, "sub_bands = true")
	st := nomadjob.Stamper{Key: []byte("k")}
	borrowed := func(id string) *api.Job { return borrowedJob(st, id) }
	nomad := &promoteJobs{jobs: map[string]*api.Job{"old": borrowed("old"), "new": borrowed("new")}}
	g := grants{}
	b := &reclaimer.Bander{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, Jobs: nomad, Grants: g, Stamper: st,
		Lock: func(string, string) func() { return func() {} }}
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	gpus := map[string]reclaim.GPU{"g0": {Healthy: true}, "g1": {Healthy: true}, "g2": {Healthy: true}, "g3": {Healthy: true}}
	pass := func(at time.Duration) []string {
		t.Helper()
		nomad.registered = nil
		var allocs []reclaim.Alloc
		for id, started := range map[string]time.Duration{"old": 0, "new": at - 5*time.Minute} {
			devs := map[string][]string{"old": {"g0", "g1"}, "new": {"g2", "g3"}}[id]
			allocs = append(allocs, reclaim.Alloc{ID: id + "-a", Namespace: "vision", JobID: id, Admitted: true, Borrowed: true, Tenant: "vision",
				Queue: "training", StartedAt: t0.Add(started), GPUs: devs, Priority: *nomad.jobs[id].Priority})
		}
		if err := b.Observed(context.Background(), t0.Add(at), allocs, gpus); err != nil {
			t.Fatal(err)
		}
		var moved []string
		for _, r := range nomad.registered {
			if !r.EnforceIndex || r.JobModifyIndex != 7 {
				t.Errorf("%s registered without its index", *r.Job.ID)
			}
			nomad.jobs[*r.Job.ID] = r.Job
			moved = append(moved, fmt.Sprintf("%s:%d", *r.Job.ID, *r.Job.Priority))
		}
		return moved
	}
	// 2 GPUs for 2 h: 240 GPU-minutes at stake, 15 doubled 4 times: 20 + 5.
	// new has 10 at stake: below the first step, where it is.
	if moved := pass(2 * time.Hour); !slices.Equal(moved, []string{"old:25"}) {
		t.Fatalf("after 2 h: moved %v, want [old:25]", moved)
	}
	if moved := pass(3 * time.Hour); len(moved) != 0 {
		t.Fatalf("after 3 h (360 GPU-minutes, below 480): moved %v", moved)
	}
	if moved := pass(4 * time.Hour); !slices.Equal(moved, []string{"old:26"}) {
		t.Fatalf("after 4 h: moved %v, want [old:26]", moved)
	}
	job, grant := nomad.jobs["old"], g["old"]
	if grant.StampedPriority != 20 || grant.From != 25 || grant.Priority != 26 || !grant.SubBand || grant.Promoted(job) || !st.VerifyScaled(job, grant) {
		t.Errorf("grant %+v: want stamped at 20, from 25 to 26, a sub-band (not promoted), verifying the job", grant)
	}
	for prio, want := range map[int]bool{25: true, 26: true, 27: false, 60: false} {
		j := *job
		j.Priority = &prio
		if st.VerifyScaled(&j, grant) != want {
			t.Errorf("at priority %d: verified %t, want %t (the broker set 25, then 26)", prio, !want, want)
		}
	}
}
