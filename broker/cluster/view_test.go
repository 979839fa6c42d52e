package cluster

import (
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

const visionPolicy = `
queue "training" { priority = 60 }
gpu_class "h100" { models = ["NVIDIA H100*"] }
tenant "vision" {
  namespaces = ["vision", "vision-dev"]
  queues = ["training"]
  guaranteed = 4
  limit = 8
}
borrowing {
  enabled  = true
  priority = 20
}`

var stamper = nomadjob.Stamper{Key: []byte("k")}

// admitted is a job as the broker's admission leaves it: priority, meta, stamp.
func admitted(b *testbuild.JobBuilder, d admission.Decision) *api.Job {
	j := b.Priority(d.Priority).Build()
	for k, v := range nomadjob.BrokerMeta(d, stamper.Stamp(nomadjob.Namespace(j), j, d)) {
		j.Meta[k] = v
	}
	return j
}

// A node whose plugin offers each NVLink island as a group (island_groups)
// counts all its GPUs as capacity of their model's class, but a request
// gets at most its largest island: Nomad takes a request's GPUs from one
// group.
func TestIslandGroupsBoundWhatOneRequestGets(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(stamper.Verify)
	n := testbuild.Node("n1", testbuild.H100+" (island 0)", 4, 0)
	n.NodeResources.Devices[0].Attributes = map[string]*api.Attribute{"island": {IntVal: ptr(int64(0))}}
	n.NodeResources.Devices = append(n.NodeResources.Devices, &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu",
		Name: testbuild.H100 + " (island 1)", Attributes: map[string]*api.Attribute{"island": {IntVal: ptr(int64(1))}},
		Instances: []*api.NodeDevice{{ID: "i1-0", Healthy: true}, {ID: "i1-1", Healthy: true}, {ID: "i1-2", Healthy: false}}})
	v.ObserveNode(n)
	u := v.Usage(p)
	if u.Idle[policy.AllGPUs] != 6 || u.Idle["h100"] != 6 || u.MaxAlloc[policy.AllGPUs] != 4 || u.MaxAlloc["h100"] != 4 {
		t.Errorf("idle %v, most for one request %v; want 6 idle (h100), 4 at most", u.Idle, u.MaxAlloc)
	}
}

func TestUsageFollowsJobsAndNodes(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(stamper.Verify)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveNode(testbuild.Node("n2", testbuild.H100, 6, 2)) // two unhealthy GPUs are not capacity
	down := testbuild.Node("n3", testbuild.H100, 8, 0)
	down.Status = api.NodeStatusDown // a down node is not capacity
	v.ObserveNode(down)
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 2, 2, "nvidia/gpu").Build())
	borrowed := admission.Decision{Outcome: admission.AdmitBorrowed, Tenant: "vision", Queue: "training", Priority: 20}
	v.ObserveJob(admitted(testbuild.Job("vision-dev", "b").Group("g", 1, 3, "nvidia/gpu/"+testbuild.H100), borrowed))
	v.ObserveJob(testbuild.Job("other", "c").Group("g", 1, 1, "gpu").Build())

	u := v.Usage(p)
	vision := u.Tenants["vision"]
	if vision.Used[policy.AllGPUs] != 7 || vision.Used["h100"] != 3 || vision.Borrowed[policy.AllGPUs] != 3 {
		t.Errorf("vision usage wrong: %+v", vision)
	}
	if u.Idle[policy.AllGPUs] != 14-8 || u.MaxAlloc[policy.AllGPUs] != 8 || u.MaxAlloc["h100"] != 8 {
		t.Errorf("idle %v max %v", u.Idle, u.MaxAlloc)
	}
	if w := v.UsageWithout(p, "vision", "a"); w.Tenants["vision"].Used[policy.AllGPUs] != 3 || w.Idle[policy.AllGPUs] != 10 {
		t.Errorf("without job a: %+v idle %v", w.Tenants["vision"], w.Idle)
	}

	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 2, "nvidia/gpu").Build()) // a new version replaces the old demand
	v.ObserveJob(testbuild.Job("vision-dev", "b").Group("g", 1, 3, "nvidia/gpu").Stopped().Build())
	v.ForgetJob("other", "c")
	v.ObserveNode(testbuild.Node("n2", testbuild.H100, 8, 0))
	u = v.Usage(p)
	if got := u.Tenants["vision"]; got.Used[policy.AllGPUs] != 2 || got.Borrowed[policy.AllGPUs] != 0 || u.Idle[policy.AllGPUs] != 14 {
		t.Errorf("after updates: %+v idle %v", got, u.Idle)
	}
}

func TestBorrowedMetaWithoutAValidStampIsNotTrusted(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(stamper.Verify)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	// Written by hand, or copied from another job: not the broker's.
	v.ObserveJob(testbuild.Job("vision", "forged").Group("g", 1, 4, "gpu").Meta(nomadjob.MetaBorrowed, "true").
		Meta(nomadjob.MetaAdmission, "v2:forged").Build())
	if got := v.Usage(p).Tenants["vision"]; got.Used.Total() != 4 || got.Borrowed.Total() != 0 {
		t.Errorf("forged borrowed meta trusted: %+v", got)
	}
}

func TestStaleJobEventsAreIgnored(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 4, 1, "gpu").ModifyIndex(20).Build())
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 1, "gpu").ModifyIndex(10).Build()) // an older version, late
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Errorf("a late event of an older version replaced the newer one: %g", got)
	}
}

// An allocation seen before its job's event (the view then counts all it
// holds) and the job's reservation are the same GPUs: counted once. Under
// load the gate queued a tenant's second 1-GPU job "at 3 of its limit of 2".
func TestAReservationAndItsJobsFirstAllocationAreCountedOnce(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	job := admission.Job{ID: "a", Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}}
	d, res := v.Admit(p, job)
	if d.Outcome != admission.Admit {
		t.Fatalf("first: %+v", d)
	}
	res.Confirm(30)
	v.ObserveAlloc(testbuild.Alloc("a0", "vision", "a", "n1", 31, "n1-0").Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 1 {
		t.Fatalf("reserved and its allocation seen before its job: %g used, want 1", got)
	}
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 1, "gpu").ModifyIndex(30).Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 1 {
		t.Fatalf("then the job's event: %g used, want 1", got)
	}
	// An allocation of the job's stopped version, still stopping, is not the
	// new registration's: both count.
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 1, "gpu").ModifyIndex(40).Stopped().Build())
	_, res = v.Admit(p, job)
	res.Confirm(50)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 2 {
		t.Fatalf("registered again while the stopped version's allocation runs: %g used, want 2", got)
	}
}

func TestReservationsCountUntilTheJobsEventShowsThem(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v := NewView(nil)
	v.SetClock(clock.Func(func() time.Time { return now }))
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	job := func(id string, gpus int) admission.Job {
		return admission.Job{ID: id, Namespace: "vision", Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: gpus}}}
	}
	d, res := v.Admit(p, job("a", 4))
	if d.Outcome != admission.Admit || res == nil {
		t.Fatalf("first: %+v", d)
	}
	// Before Nomad's event, a second decision sees the first one's GPUs.
	if d, _ := v.Admit(p, job("b", 4)); d.Outcome != admission.AdmitBorrowed {
		t.Fatalf("second decision did not see the reservation: %+v", d)
	}
	if d, _ := v.Admit(p, job("c", 1)); d.Outcome != admission.Queue {
		t.Fatalf("third decision went above the limit of 8: %+v", d)
	}
	// A failed registration gives its GPUs back.
	res.Release()
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Fatalf("after release: %g, want 4 (job b's)", got)
	}
	// A confirmed one ends when the job's event shows it, not counted twice.
	_, res = v.Admit(p, job("a", 4))
	res.Confirm(30)
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 4, "gpu").ModifyIndex(30).Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 8 {
		t.Fatalf("after the event: %g, want 8", got)
	}
	v.ObserveJob(testbuild.Job("vision", "a").Group("g", 1, 4, "gpu").ModifyIndex(31).Stopped().Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Fatalf("a stopped job still counted through its old reservation: %g", got)
	}
	// Those never seen in an event (b, and lost) expire.
	v.Admit(p, job("lost", 2))
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 6 {
		t.Fatalf("before expiry: %g, want 6", got)
	}
	now = now.Add(ReservationHold)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 0 {
		t.Fatalf("expired reservations still count: %g", got)
	}
}

func TestCanariesOfAnUnpromotedDeploymentCount(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(testbuild.Job("vision", "web").Group("web", 2, 1, "gpu").Canary(1).Build())
	dep := &api.Deployment{Namespace: "vision", JobID: "web", Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {DesiredCanaries: 1}}}
	v.ObserveDeployment(dep)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 3 {
		t.Fatalf("while canarying: %g, want 3", got)
	}
	dep.TaskGroups["web"].Promoted = true
	v.ObserveDeployment(dep)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 2 {
		t.Fatalf("after promotion: %g, want 2", got)
	}
}

func TestSystemJobsCountOneAllocationPerFittingNode(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveNode(testbuild.Node("n2", testbuild.H100, 2, 0))
	v.ObserveNode(testbuild.Node("n3", testbuild.H100, 1, 0)) // too few GPUs: no allocation there
	v.ObserveJob(testbuild.Job("vision", "sys").Type(api.JobTypeSystem).Group("g", 1, 2, "gpu").Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Fatalf("system job: %g GPUs, want 2 nodes x 2", got)
	}
}

// A node's shared group counts each GPU once in capacity, and a job holding
// replicas holds their share of a GPU each.
func TestReplicasAreSharesOfTheirGPU(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(stamper.Verify)
	v.ObserveNode(testbuild.SharedGPUs(testbuild.Node("n1", testbuild.H100, 6, 0), testbuild.H100, 2, 4))
	v.ObserveJob(testbuild.Job("vision", "notebooks").Group("g", 3, 1, "nvidia/gpu/"+testbuild.H100+" (shared)").Build())
	u := v.Usage(p)
	if got := u.Tenants["vision"].Used; got[policy.AllGPUs] != 0.75 || got["h100"] != 0.75 {
		t.Errorf("3 replicas of 4 held: %v, want 0.75 GPUs", got)
	}
	if u.Idle[policy.AllGPUs] != 7.25 || u.MaxAlloc[policy.AllGPUs] != 8 || v.Capacity() != 8 {
		t.Errorf("6 whole GPUs and 2 shared: idle %v, max %v, capacity %d", u.Idle, u.MaxAlloc, v.Capacity())
	}
	if r := u.Replicas; len(r) != 1 || r[testbuild.H100+" (shared)"] != 4 {
		t.Errorf("replicas %v", r)
	}
}

func TestADispatchedChildIsReservedUntilItsOwnEventHoweverLate(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v := NewView(nil)
	v.SetClock(clock.Func(func() time.Time { return now }))
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	// The broker decides on the child under a key of its own; Nomad names it.
	_, res := v.Admit(p, admission.Job{ID: "parent/dispatch-broker-key", Namespace: "vision",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 4}}})
	res.ConfirmAs("parent/dispatch-1700000000-abcd", 40)
	now = now.Add(time.Minute) // Nomad's event is late
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Fatalf("before the child's event: %g, want 4", got)
	}
	v.ObserveJob(testbuild.Job("vision", "parent/dispatch-1700000000-abcd").Group("g", 1, 4, "gpu").ModifyIndex(40).Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 4 {
		t.Fatalf("after it: %g, want 4 (counted once)", got)
	}
	v.ObserveJob(testbuild.Job("vision", "parent/dispatch-1700000000-abcd").Group("g", 1, 4, "gpu").ModifyIndex(41).Stopped().Build())
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 0 {
		t.Fatalf("stopped: %g, want 0", got)
	}
}

func TestGPUsComingBackAreCountedEvenWhenTheyDippedBetweenTwoLooks(t *testing.T) {
	v := NewView(nil)
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0)}})
	start := v.GPUsCameBack()
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 7, 1)) // a GPU sick
	if v.GPUsCameBack() != start {
		t.Fatal("a GPU going sick counted as coming back")
	}
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0)) // and well again
	if v.GPUsCameBack() != start+1 {
		t.Fatalf("a recovery: %d, want %d", v.GPUsCameBack(), start+1)
	}
	// A listing of the same nodes is no recovery; one that shows a recovery is.
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0)}})
	if v.GPUsCameBack() != start+1 {
		t.Fatalf("a resync of unchanged nodes counted: %d", v.GPUsCameBack())
	}
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 6, 2))
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0)}})
	if v.GPUsCameBack() != start+2 {
		t.Fatalf("a recovery seen in a resync: %d, want %d", v.GPUsCameBack(), start+2)
	}
	v.ObserveNode(testbuild.Node("n2", testbuild.H100, 4, 0)) // a node joins
	if v.GPUsCameBack() != start+3 {
		t.Fatalf("a node joining: %d", v.GPUsCameBack())
	}
}

// While a deployment that reverts on failure is in flight, the job counts
// the larger of its new version and the stable one Nomad would go back to,
// and a listing (a restart) knows that stable version from Nomad's versions.
func TestADeploymentThatMayRevertCountsTheStableVersion(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	used := func(v *View) float64 { return v.Usage(p).Tenants["vision"].Used.Total() }
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(testbuild.Job("vision", "web").Group("web", 1, 4, "gpu").AutoRevert().Stable().ModifyIndex(1).Build())
	v1 := testbuild.Job("vision", "web").Group("web", 1, 1, "gpu").AutoRevert().ModifyIndex(2).Build()
	v.ObserveJob(v1)
	// From the new version on, before its deployment's first event (which
	// Nomad's scheduler creates later): a queue pass in between must not
	// take the GPUs it may revert to.
	if got := used(v); got != 4 {
		t.Fatalf("version 1 registered, its deployment not seen yet: %g, want 4", got)
	}
	dep := &api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", JobVersion: 1, Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {AutoRevert: true}}}
	v.ObserveDeployment(dep)
	if got := used(v); got != 4 {
		t.Fatalf("while version 1 (1 GPU) deploys and may revert to version 0 (4): %g, want 4", got)
	}

	restarted := NewView(nil)
	stable := testbuild.Job("vision", "web").Group("web", 1, 4, "gpu").AutoRevert().Stable().Build()
	restarted.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0)}, Jobs: []*api.Job{v1},
		Deployments: []*api.Deployment{dep}, Stable: []*api.Job{stable}})
	if got := used(restarted); got != 4 {
		t.Errorf("after a listing: %g, want 4", got)
	}
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n1", testbuild.H100, 8, 0)}, Jobs: []*api.Job{v1},
		Deployments: []*api.Deployment{dep}})
	if got := used(v); got != 4 {
		t.Errorf("after a listing without the stable version (it knew it already): %g, want 4", got)
	}

	done := *dep
	done.Status = api.DeploymentStatusSuccessful
	v.ObserveDeployment(&done)
	if got := used(v); got != 1 {
		t.Errorf("once the deployment succeeded: %g, want 1", got)
	}
}

// An update without GPUs still counts the GPUs of the stable version it
// may revert to.
func TestAnUpdateWithoutGPUsCountsTheStableVersionItMayRevertTo(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(testbuild.Job("vision", "web").Group("web", 2, 1, "gpu").AutoRevert().Stable().ModifyIndex(1).Build())
	v.ObserveJob(testbuild.Job("vision", "web").AutoRevert().ModifyIndex(2).Build())
	v.ObserveDeployment(&api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {AutoRevert: true}}})
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 2 {
		t.Errorf("a CPU-only version deploying, its stable one 2 GPUs: %g, want 2", got)
	}
}

// An admission that names the version it may revert to reserves the larger
// of the two, until the deployment's events show it.
func TestAnAdmissionReservesTheVersionItMayRevertTo(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	j := admission.Job{ID: "web", Namespace: "vision", Groups: []admission.Group{{Name: "web", Count: 1, GPUsPerAlloc: 1}},
		RevertTo: []admission.Group{{Name: "web", Count: 1, GPUsPerAlloc: 3}}}
	d, res := v.Admit(p, j)
	if d.Outcome != admission.Admit || res == nil {
		t.Fatalf("decision %+v", d)
	}
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 3 {
		t.Errorf("reserved: %g, want 3", got)
	}
}

// Every allocation of the deploying version failed, so Nomad calls the job
// dead: it still counts the stable version its deployment reverts to.
func TestADeadVersionWhoseDeploymentMayRevertCountsTheStableVersion(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := viewWithStableWeb()
	dead := testbuild.Job("vision", "web").Group("web", 1, 1, "gpu").AutoRevert().ModifyIndex(2).Dead().Build()
	v.ObserveJob(dead)
	dep := &api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {AutoRevert: true}}}
	v.ObserveDeployment(dep)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 2 {
		t.Errorf("dead while its deployment may revert: %g, want 2", got)
	}
	dep.Status = api.DeploymentStatusCancelled
	v.ObserveDeployment(dep)
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 0 {
		t.Errorf("dead, no deployment: %g, want 0", got)
	}
}

// A deployment fails and Nomad rolls back on its own: the rollback version
// arrives dead, with no allocation yet, and the failed deployment's event
// may come after it. The stable version's GPUs stay counted throughout,
// until the rollback's own deployment ends (N3).
func TestARollbackCountsTheStableVersionUntilItsOwnDeploymentEnds(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	used := func(v *View) float64 { return v.Usage(p).Tenants["vision"].Used.Total() }
	v := viewWithStableWeb()
	v.ObserveJob(testbuild.Job("vision", "web").Group("web", 1, 1, "gpu").AutoRevert().ModifyIndex(2).Build())
	dep := &api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", JobVersion: 1, Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {AutoRevert: true}}}
	v.ObserveDeployment(dep)
	rollback := testbuild.Job("vision", "web").Group("web", 1, 2, "gpu").AutoRevert().ModifyIndex(3).Build()
	rollback.Status = ptr("dead") // no allocation yet
	v.ObserveJob(rollback)
	failed := *dep
	failed.Status, failed.StatusDescription = api.DeploymentStatusFailed, "Failed due to unhealthy allocations - rolling back to job version 0"
	v.ObserveDeployment(&failed)
	if got := used(v); got != 2 {
		t.Fatalf("the rollback registered, dead, no allocation yet, its deployment failed: %g, want 2", got)
	}
	next := &api.Deployment{ID: "d2", Namespace: "vision", JobID: "web", JobVersion: 2, Status: api.DeploymentStatusSuccessful}
	running := testbuild.Job("vision", "web").Group("web", 1, 2, "gpu").AutoRevert().ModifyIndex(4).Build()
	v.ObserveJob(running)
	v.ObserveDeployment(next)
	if got := used(v); got != 2 {
		t.Errorf("the rollback running, its deployment done: %g, want its own 2", got)
	}
	cancelled := *dep
	cancelled.Status = api.DeploymentStatusCancelled
	w := NewView(nil)
	w.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	w.ObserveJob(testbuild.Job("vision", "web").Group("web", 1, 2, "gpu").AutoRevert().Stable().ModifyIndex(1).Build())
	dead := testbuild.Job("vision", "web").Group("web", 1, 1, "gpu").AutoRevert().ModifyIndex(2).Dead().Build()
	w.ObserveJob(dead)
	w.ObserveDeployment(&cancelled)
	if got := used(w); got != 0 {
		t.Errorf("a dead version whose deployment was cancelled (no rollback): %g, want 0", got)
	}
}

// The view keeps the broker's admissions Nomad stopped for the leader to
// record, until the broker registers them again; a version registered
// straight in Nomad does not end that.
func TestStoppedAdmissionsAreKeptUntilTheBrokerRegistersThemAgain(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(func(*api.Job) bool { return true })
	stamp := func(j *api.Job) *api.Job {
		if j.Meta == nil {
			j.Meta = map[string]string{}
		}
		j.Meta[nomadjob.MetaAdmission] = "v3:sig"
		return j
	}
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(5).Build()))
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(7).Stopped().Build()))
	if got := v.StoppedAdmitted(); got[[2]string{"vision", "train"}] != 7 {
		t.Fatalf("stopped: %v", got)
	}
	// Straight in Nomad; Nomad tells of it first as dead (at the index it
	// was registered at: its evaluation is stored next), then pending.
	replay := stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").Type(api.JobTypeBatch).ModifyIndex(9).Build())
	replay.ModifyIndex, replay.Status = ptr(uint64(9)), ptr("dead")
	v.ObserveJob(replay)
	if got := v.StoppedAdmitted(); got[[2]string{"vision", "train"}] != 7 {
		t.Errorf("a replay straight in Nomad, its first step, read as a finished batch job: %v", got)
	}
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 1 {
		t.Errorf("a replay straight in Nomad, its first step: %g GPUs used, want 1", got)
	}
	replay.Status = ptr("pending")
	v.ObserveJob(replay)
	if got := v.StoppedAdmitted(); got[[2]string{"vision", "train"}] != 7 {
		t.Errorf("a replay straight in Nomad ended the stop: %v", got)
	}
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(11).Stopped().Build()))
	d, res := v.Admit(p, admission.Job{ID: "train", Namespace: "vision", Queue: "training",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	if res == nil {
		t.Fatalf("not admitted: %+v", d)
	}
	if !v.Registering("vision", "train") {
		t.Errorf("the broker's registration in flight is not seen")
	}
	res.Confirm(13)
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(13).Build()))
	if got := v.StoppedAdmitted(); len(got) != 0 {
		t.Errorf("registered again through the broker: %v", got)
	}
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(15).Stopped().Build()))
	v.RecordedStop("vision", "train", 15)
	if got := v.StoppedAdmitted(); len(got) != 0 {
		t.Errorf("recorded by the leader: %v", got)
	}
	// A registration Nomad took whose own event never came (a listing in
	// between), then a stop: nothing of it is still being registered, and
	// the stop is kept for the leader. A reservation that expired is not a
	// registration either, before or after usage is read.
	now := time.Now()
	v.SetClock(clock.Func(func() time.Time { return now }))
	_, res = v.Admit(p, admission.Job{ID: "train", Namespace: "vision", Queue: "training",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	res.Confirm(16)
	v.ObserveJob(stamp(testbuild.Job("vision", "train").Group("g", 1, 1, "gpu").ModifyIndex(19).Stopped().Build()))
	if v.Registering("vision", "train") {
		t.Errorf("a registration Nomad took, the job stopped since: still read as registering")
	}
	if got := v.StoppedAdmitted(); got[[2]string{"vision", "train"}] != 19 {
		t.Errorf("stopped after a registration whose event never came: %v", got)
	}
	v.RecordedStop("vision", "train", 19)
	v.Admit(p, admission.Job{ID: "train", Namespace: "vision", Queue: "training",
		Groups: []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 1}}})
	now = now.Add(ReservationHold)
	if v.Registering("vision", "train") {
		t.Errorf("a reservation past ReservationHold: still read as registering")
	}
	// A batch job that finished is done with its admission too; a service
	// job Nomad calls dead may still be reverted by its deployment.
	done := testbuild.Job("vision", "batch").Group("g", 1, 1, "gpu").Type(api.JobTypeBatch).ModifyIndex(17).Dead().Build()
	failed := testbuild.Job("vision", "svc").Group("g", 1, 1, "gpu").ModifyIndex(18).Dead().Build()
	v.ObserveJob(stamp(done))
	v.ObserveJob(stamp(failed))
	if got := v.StoppedAdmitted(); len(got) != 1 || got[[2]string{"vision", "batch"}] != 17 {
		t.Errorf("a finished batch job and a dead service job: %v, want the batch job's", got)
	}
}

// An event about the deployment of a version the job has moved on from
// (late, under load) changes nothing of the deployment now running: it
// cleared the stable version's floor, and a queued job took its GPUs.
func TestAnOlderVersionsDeploymentDoesNotClearTheFloor(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := viewWithStableWeb()
	v1 := testbuild.Job("vision", "web").Group("web", 1, 1, "gpu").AutoRevert().ModifyIndex(2).Build()
	v1.Version = ptr(uint64(1))
	v.ObserveJob(v1)
	v.ObserveDeployment(&api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", JobVersion: 1, Status: api.DeploymentStatusRunning,
		TaskGroups: map[string]*api.DeploymentState{"web": {AutoRevert: true}}})
	v.ObserveDeployment(&api.Deployment{ID: "d0", Namespace: "vision", JobID: "web", JobVersion: 0, Status: api.DeploymentStatusSuccessful})
	if got := v.Usage(p).Tenants["vision"].Used.Total(); got != 2 {
		t.Errorf("version 0's deployment told late: %g, want 2 (version 1 may still revert)", got)
	}
}

// viewWithStableWeb is a view of one 8-GPU node and vision's job web, whose
// stable version (index 1) holds 2 GPUs and whose deployments auto-revert.
func viewWithStableWeb() *View {
	v := NewView(nil)
	v.ObserveNode(testbuild.Node("n1", testbuild.H100, 8, 0))
	v.ObserveJob(testbuild.Job("vision", "web").Group("web", 1, 2, "gpu").AutoRevert().Stable().ModifyIndex(1).Build())
	return v
}

// A listing tells the rollbacks its failed deployments show, each with the
// index Nomad registered the stable version at; a failure that did not
// roll back is not one.
func TestAListingTellsTheRollbacksItShows(t *testing.T) {
	v := NewView(nil)
	v.SetRegion("west")
	var told []Revert
	v.SetRollbacks(func(rv Revert) { told = append(told, rv) })
	rolled := &api.Deployment{ID: "d1", Namespace: "vision", JobID: "web", Status: api.DeploymentStatusFailed, ModifyIndex: 42,
		StatusDescription: "Failed due to unhealthy allocations - rolling back to job version 0"}
	plain := &api.Deployment{ID: "d2", Namespace: "vision", JobID: "api", Status: api.DeploymentStatusFailed, ModifyIndex: 50,
		StatusDescription: "Failed due to unhealthy allocations"}
	v.Reset(Snapshot{Failed: []*api.Deployment{rolled, plain}})
	if len(told) != 1 || told[0].JobID != "web" || told[0].Index != 42 || told[0].Region != "west" {
		t.Errorf("told %+v, want web's rollback at 42 in west", told)
	}
}
