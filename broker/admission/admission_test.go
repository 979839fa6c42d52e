package admission_test

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

const h100 = "NVIDIA H100 80GB HBM3"

func testPolicy(t testing.TB, borrowing bool) *policy.Policy {
	t.Helper()
	src := `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
gpu_class "h100" { models = ["NVIDIA H100*"] }
gpu_class "a100" { models = ["NVIDIA A100*"] }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 8
  limit      = 16
  region "west" { limit = 4 }
}
tenant "search" {
  namespaces = ["search", "search-canary"]
  queues     = ["inference"]
  guaranteed = 4
  limit      = 4
}
tenant "research" {
  namespaces = ["research"]
  queues     = ["dev"]
  guaranteed = { h100 = 2 }
  limit      = { h100 = 4 }
}
borrowing {
  enabled  = ` + map[bool]string{true: "true", false: "false"}[borrowing] + `
  priority = 20
}`
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
	if diags.HasErrors() {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	return p
}

// jobBuilder makes admission jobs in one line a case.
type jobBuilder struct{ admission.Job }

func job(ns string) *jobBuilder { return &jobBuilder{admission.Job{ID: "j", Namespace: ns}} }

func (b *jobBuilder) gpus(count, perAlloc int) *jobBuilder {
	b.Groups = append(b.Groups, admission.Group{Name: "g", Count: count, GPUsPerAlloc: perAlloc})
	return b
}

func (b *jobBuilder) model(m string) *jobBuilder {
	b.Groups[len(b.Groups)-1].Model = m
	return b
}

func (b *jobBuilder) queue(q string) *jobBuilder { b.Queue = q; return b }

func (b *jobBuilder) periodic() *jobBuilder { b.Periodic = true; return b }

// revertsTo names the version a failing deployment of the job goes back to.
func (b *jobBuilder) revertsTo(count, perAlloc int) *jobBuilder {
	b.RevertTo = append(b.RevertTo, admission.Group{Name: "g", Count: count, GPUsPerAlloc: perAlloc})
	return b
}

// shared makes the last group ask for time-sliced replicas only.
func (b *jobBuilder) shared() *jobBuilder {
	b.Groups[len(b.Groups)-1].Shared = true
	return b
}

// cluster is 16 GPUs (8 a node, all H100) with some held.
func cluster(idle float64, used map[string]float64) admission.Usage {
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{},
		Idle:     policy.Quota{"": idle, "h100": idle},
		MaxAlloc: policy.Quota{"": 8, "h100": 8}}
	for tenant, n := range used {
		u.Tenants[tenant] = admission.TenantUsage{Used: policy.Quota{"": n, "h100": n}}
	}
	return u
}

// inRegion puts the job in region name, drained by drainedBy (""; not
// drained), its tenant holding held GPUs there.
func inRegion(u admission.Usage, name, drainedBy string, running bool, held float64) admission.Usage {
	u.Region = admission.Region{Name: name, DrainedBy: drainedBy, Running: running, Held: held}
	return u
}

// unsettled gives tenant n GPUs in a region the broker lost.
func unsettled(u admission.Usage, tenant string, n float64) admission.Usage {
	tu := u.Tenants[tenant]
	tu.Unsettled = policy.Quota{"": n, "h100": n}
	u.Tenants[tenant] = tu
	return u
}

// overBudget marks tenant as having spent its GPU-hour budget.
func overBudget(u admission.Usage, tenant string) admission.Usage {
	tu := u.Tenants[tenant]
	tu.OverBudget = "spent its budget (resets soon)"
	u.Tenants[tenant] = tu
	return u
}

func TestDecide(t *testing.T) {
	// Queues inference 80, training 60 and dev 40 run guaranteed work at
	// their bands, within 9 of each other: 49, 45 and 40.
	cases := []struct {
		name      string
		borrowOff bool
		job       *jobBuilder
		usage     admission.Usage
		outcome   admission.Outcome
		priority  int
		rule      string
		reason    string
	}{
		{name: "no GPUs: admitted untouched", job: job("anything"), usage: cluster(16, nil), outcome: admission.Admit},
		{name: "a GPU group at count 0: decided like any other, in its queue's band", job: job("vision").gpus(0, 1), usage: cluster(0, map[string]float64{"vision": 16}),
			outcome: admission.Admit, priority: 45, reason: `within tenant "vision"'s guarantee`},
		{name: "a GPU group at count 0 in a namespace of no tenant", job: job("default").gpus(0, 1), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleUnmappedNamespace},
		{name: "a periodic GPU job, whatever its tenant", job: job("vision").gpus(1, 1).periodic(), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RulePeriodicGPU, reason: "periodic jobs launch GPU work on Nomad's schedule without admission"},
		{name: "a periodic job of no GPU", job: job("default").periodic(), usage: cluster(16, nil), outcome: admission.Admit, reason: "no GPU demand"},
		{name: "unmapped namespace", job: job("default").gpus(1, 1), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleUnmappedNamespace, reason: `namespace "default" belongs to no tenant`},
		{name: "queue not allowed", job: job("vision").gpus(1, 1).queue("inference"), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleQueueNotAllowed, reason: `tenant "vision" may not use queue "inference" (allowed: training, dev)`},
		{name: "above limit", job: job("vision").gpus(17, 1), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleAboveLimit, reason: `the job needs 17 GPUs, above tenant "vision"'s limit of 16`},
		{name: "no node fits", job: job("vision").gpus(1, 9), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleNoNodeFits, reason: `needs 9 GPUs in one allocation, but no node has more than 8`},
		{name: "unknown class for a per-class tenant", job: job("research").gpus(1, 1), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleUnknownClass, reason: `GPUs of no known class`},
		{name: "class the tenant has no quota for", job: job("research").gpus(1, 1).model("NVIDIA A100-SXM4-40GB"), usage: cluster(16, nil),
			outcome: admission.Reject, rule: admission.RuleUnknownClass, reason: `no quota for a100 GPUs`},
		{name: "within guarantee: queue band", job: job("vision").gpus(2, 4), usage: cluster(16, nil),
			outcome: admission.Admit, priority: 45},
		{name: "default queue vs chosen queue", job: job("vision").gpus(1, 1).queue("dev"), usage: cluster(16, nil),
			outcome: admission.Admit, priority: 40},
		{name: "second namespace of a tenant", job: job("search-canary").gpus(1, 1), usage: cluster(16, nil),
			outcome: admission.Admit, priority: 49},
		{name: "guarantee even with no idle GPUs (Nomad preempts borrowed work)", job: job("search").gpus(4, 1),
			usage: cluster(0, map[string]float64{"vision": 16}), outcome: admission.Admit, priority: 49},
		{name: "beyond guarantee on idle GPUs: borrowed", job: job("vision").gpus(1, 4), usage: cluster(8, map[string]float64{"vision": 8}),
			outcome: admission.AdmitBorrowed, priority: 20, reason: `beyond tenant "vision"'s guarantee on idle GPUs (it holds 12 of its limit of 16 with this job)`},
		{name: "beyond guarantee, not enough idle: queued", job: job("vision").gpus(1, 4), usage: cluster(2, map[string]float64{"vision": 8}),
			outcome: admission.Queue, reason: "only 2 GPUs are idle"},
		{name: "beyond guarantee, borrowing off: queued", borrowOff: true, job: job("vision").gpus(1, 4), usage: cluster(8, map[string]float64{"vision": 8}),
			outcome: admission.Queue, reason: "borrowing is off"},
		{name: "over limit with what it holds: queued", job: job("search").gpus(1, 1), usage: cluster(12, map[string]float64{"search": 4}),
			outcome: admission.Queue, reason: `tenant "search" would hold 5 of its limit of 4 GPUs`},
		{name: "a lost region's jobs, requeued, count against the limit, not the guarantee", job: job("vision").gpus(1, 2), usage: unsettled(cluster(8, map[string]float64{"vision": 6}), "vision", 9),
			outcome: admission.Queue, reason: `tenant "vision" would hold 17 of its limit of 16 GPUs, counting 9 of its jobs' in regions the broker cannot reach`},
		{name: "a lost region's jobs leave room up to the limit", job: job("vision").gpus(1, 2), usage: unsettled(cluster(8, map[string]float64{"vision": 6}), "vision", 8),
			outcome: admission.Admit, priority: 45},
		{name: "an update that may revert counts its stable version", job: job("search").gpus(1, 1).revertsTo(3, 1), usage: cluster(12, map[string]float64{"search": 2}),
			outcome: admission.Queue, reason: `tenant "search" would hold 5 of its limit of 4 GPUs; counted at the larger of two versions (this version 1, its stable version 3`},
		{name: "a stable version above the limit refuses an update that may revert to it", job: job("search").gpus(1, 1).revertsTo(5, 1), usage: cluster(12, nil),
			outcome: admission.Reject, rule: admission.RuleAboveLimit, reason: `the job needs 5 GPUs (this version 1, its stable version 5`},
		{name: "a smaller stable version changes nothing", job: job("search").gpus(2, 1).revertsTo(1, 1), usage: cluster(12, map[string]float64{"search": 2}),
			outcome: admission.Admit, priority: 49, reason: `within tenant "search"'s guarantee (it holds 4 of 4 GPUs with this job)`},
		{name: "per-class guarantee", job: job("research").gpus(2, 1).model(h100), usage: cluster(16, nil),
			outcome: admission.Admit, priority: 40},
		{name: "per-class borrowing", job: job("research").gpus(3, 1).model(h100), usage: cluster(16, nil),
			outcome: admission.AdmitBorrowed, priority: 20},
		{name: "over budget, within guarantee: borrowed", job: job("vision").gpus(1, 1), usage: overBudget(cluster(16, nil), "vision"),
			outcome: admission.AdmitBorrowed, priority: 20, rule: admission.RuleOverBudget, reason: "spent its budget (resets soon): within its guarantee, but borrowed"},
		{name: "a new job in a drained region: queued, saying who drained it", job: job("vision").gpus(1, 1), usage: inRegion(cluster(16, nil), "east", "by ops", false, 0),
			outcome: admission.Queue, reason: "region east is drained (by ops): no new work goes there; queued until it resumes"},
		{name: "a job running in a drained region: decided as ever", job: job("vision").gpus(1, 1), usage: inRegion(cluster(16, nil), "east", "by ops", true, 0),
			outcome: admission.Admit, priority: 45},
		{name: "a region drained holds back no rejection", job: job("default").gpus(1, 1), usage: inRegion(cluster(16, nil), "east", "by ops", false, 0),
			outcome: admission.Reject, rule: admission.RuleUnmappedNamespace},
		{name: "beyond the tenant's cap in a region, within its limit: queued", job: job("vision").gpus(1, 2), usage: inRegion(cluster(16, map[string]float64{"vision": 3}), "west", "", false, 3),
			outcome: admission.Queue, reason: `tenant "vision" would hold 5 of its limit of 4 GPUs in region west; queued until its own jobs there free GPUs`},
		{name: "up to the tenant's cap in a region", job: job("vision").gpus(1, 1), usage: inRegion(cluster(16, map[string]float64{"vision": 3}), "west", "", false, 3),
			outcome: admission.Admit, priority: 45},
		{name: "a cap is the region's alone", job: job("vision").gpus(1, 2), usage: inRegion(cluster(16, map[string]float64{"vision": 3}), "east", "", false, 3),
			outcome: admission.Admit, priority: 45},
		{name: "over budget, even with borrowing off", borrowOff: true, job: job("vision").gpus(1, 1), usage: overBudget(cluster(16, nil), "vision"),
			outcome: admission.AdmitBorrowed, priority: 20, rule: admission.RuleOverBudget},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := admission.Decide(testPolicy(t, !c.borrowOff), c.job.Job, c.usage)
			if d.Outcome != c.outcome || d.Priority != c.priority || d.Rule != c.rule || !strings.Contains(d.Reason, c.reason) {
				t.Errorf("got %s prio %d rule %q: %s\nwant %s prio %d rule %q, reason containing %q",
					d.Outcome, d.Priority, d.Rule, d.Reason, c.outcome, c.priority, c.rule, c.reason)
			}
		})
	}
}

func TestAJobsOwnLifetimeWithinTheRule(t *testing.T) {
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(`
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 8
}
reclaim "dev-ttl" {
  workload     = "dev"
  max_lifetime = "8h"
  max_extend   = "4h"
  action       = "stop"
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	for _, c := range []struct {
		queue, ttl, rule, reason string
	}{
		{"dev", "", "", ""},
		{"dev", "2h", "", ""},  // shorter: always
		{"dev", "12h", "", ""}, // longer: up to max_extend
		{"dev", "13h", "dev-ttl", "meta nomad-gpu.ttl = 13h0m0s is longer than reclaim rule dev-ttl allows: max_lifetime 8h0m0s + max_extend 4h0m0s"},
		{"training", "13h", "", ""}, // the rule selects dev work only
		{"dev", "soon", admission.RuleInvalidTTL, `meta nomad-gpu.ttl = "soon" is not a duration such as "2h"`},
		{"dev", "-1h", admission.RuleInvalidTTL, "is not a duration"},
	} {
		j := job("vision").gpus(1, 1).queue(c.queue)
		j.TTL = c.ttl
		d := admission.Decide(p, j.Job, cluster(16, nil))
		if d.Rule != c.rule || !strings.Contains(d.Reason, c.reason) || (c.rule == "") != (d.Outcome == admission.Admit) {
			t.Errorf("queue %s ttl %q: %s %s %q", c.queue, c.ttl, d.Outcome, d.Rule, d.Reason)
		}
	}
}

func TestWorkloadClasses(t *testing.T) {
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(`
queue "training" {
  priority = 60
}
queue "inference" { priority = 80 }
queue "dev" { priority = 40 }
workload "training" {
  gang = true
}
workload "inference" {
  require_update    = true
  protect_min_count = true
}
workload "dev" {
  max_gpus = 1
  shared   = true
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "inference", "dev"]
  guaranteed = 12
  limit      = 16
}
borrowing {
  enabled  = true
  priority = 20
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	// 2 nodes × 8 GPUs, 5 free on each (3 held by others on each).
	u := cluster(10, map[string]float64{"search": 6})
	u.Nodes = []admission.NodeRoom{{Free: 5}, {Free: 5}}
	gang := job("vision").gpus(2, 6)
	if d := admission.Decide(p, gang.Job, u); d.Outcome != admission.Queue || d.Rule != admission.RuleGang || d.WaitsFor != admission.WaitCapacity ||
		!strings.Contains(d.Reason, "its 2 allocations do not all fit the nodes at once (the most free GPUs on one node: 5)") {
		t.Errorf("2 × 6 GPUs on 5 + 5 free: %s %s: %s", d.Outcome, d.Rule, d.Reason)
	}
	if d := admission.Decide(p, job("vision").gpus(2, 5).Job, u); d.Outcome != admission.Admit {
		t.Errorf("2 × 5 GPUs on 5 + 5 free: %s: %s", d.Outcome, d.Reason)
	}
	// Within its guarantee, GPUs borrowed work holds count: Nomad preempts it.
	borrowed := []admission.Held{{GPUs: 3, Priority: 20}}
	u.Nodes = []admission.NodeRoom{{Free: 5, Borrowed: 3, Held: borrowed}, {Free: 5, Borrowed: 3, Held: borrowed}}
	if d := admission.Decide(p, gang.Job, u); d.Outcome != admission.Admit {
		t.Errorf("2 × 6 GPUs with borrowed work to preempt: %s: %s", d.Outcome, d.Reason)
	}
	if d := admission.Decide(p, job("vision").gpus(2, 1).queue("dev").Job, u); d.Outcome != admission.Reject || d.Rule != admission.RuleWorkloadMaxGPUs {
		t.Errorf("2 GPUs for dev: %s %s", d.Outcome, d.Rule)
	}
	inference := job("vision").gpus(2, 1).queue("inference")
	if d := admission.Decide(p, inference.Job, u); d.Outcome != admission.Reject || d.Rule != admission.RuleRequireUpdate {
		t.Errorf("inference without canary: %s %s", d.Outcome, d.Rule)
	}
	inference.CanaryAutoRevert = true
	if d := admission.Decide(p, inference.Job, u); d.Outcome != admission.Admit || d.Priority != 49 {
		t.Errorf("inference with canary: %s %d: %s", d.Outcome, d.Priority, d.Reason)
	}
	// Beyond its guarantee it would be borrowed: protected, it waits instead.
	full := cluster(10, map[string]float64{"vision": 12})
	if d := admission.Decide(p, inference.Job, full); d.Outcome != admission.Queue || d.Rule != admission.RuleProtectedMinCount || d.WaitsFor != admission.WaitLimit {
		t.Errorf("inference beyond guarantee: %s %s: %s", d.Outcome, d.Rule, d.Reason)
	}
	// Replicas only for a shared workload.
	u.Replicas = map[string]int{h100 + " (shared)": 4}
	if d := admission.Decide(p, job("vision").gpus(1, 1).shared().Job, u); d.Outcome != admission.Reject || d.Rule != admission.RuleWorkloadShared {
		t.Errorf("replicas for training: %s %s: %s", d.Outcome, d.Rule, d.Reason)
	}
	if d := admission.Decide(p, job("vision").gpus(1, 4).shared().queue("dev").Job, u); d.Outcome != admission.Admit {
		t.Errorf("4 replicas (one GPU) for dev, max_gpus 1: %s %s: %s", d.Outcome, d.Rule, d.Reason)
	}
}

// A time-sliced replica counts as 1/N of a GPU against guarantees, limits and
// idle GPUs, N the replicas per GPU its group is offered as.
func TestAReplicaCountsAsItsShareOfAGPU(t *testing.T) {
	p := testPolicy(t, true)
	shared := h100 + " (shared)"
	withReplicas := func(u admission.Usage, r map[string]int) admission.Usage { u.Replicas = r; return u }
	four := map[string]int{shared: 4}
	for _, c := range []struct {
		name    string
		job     *jobBuilder
		usage   admission.Usage
		outcome admission.Outcome
		demand  float64
	}{
		{"the last quarter of the guarantee", job("research").gpus(1, 1).model(shared).shared(),
			withReplicas(cluster(16, map[string]float64{"research": 1.75}), four), admission.Admit, 0.25},
		{"beyond the guarantee: borrowed", job("research").gpus(1, 1).model(shared).shared(),
			withReplicas(cluster(16, map[string]float64{"research": 2}), four), admission.AdmitBorrowed, 0.25},
		{"four replicas are one GPU", job("research").gpus(2, 2).model(shared).shared(),
			withReplicas(cluster(16, map[string]float64{"research": 3}), four), admission.AdmitBorrowed, 1},
		{"a quarter above the limit", job("research").gpus(1, 1).model(shared).shared(),
			withReplicas(cluster(16, map[string]float64{"research": 3.9}), four), admission.Queue, 0.25},
		{"any model's replicas: the largest share", job("vision").gpus(1, 1).shared(),
			withReplicas(cluster(16, nil), map[string]int{shared: 4, "NVIDIA A100-SXM4-80GB (shared)": 2}), admission.Admit, 0.5},
		{"no shared group known: a whole GPU", job("vision").gpus(1, 1).shared(), cluster(16, nil), admission.Admit, 1},
		{"the same model whole", job("research").gpus(1, 1).model(h100),
			withReplicas(cluster(16, map[string]float64{"research": 1.75}), four), admission.AdmitBorrowed, 1},
	} {
		d := admission.Decide(p, c.job.Job, c.usage)
		if d.Outcome != c.outcome || d.Demand[policy.AllGPUs] != c.demand {
			t.Errorf("%s: %s of %g GPUs (%s), want %s of %g", c.name, d.Outcome, d.Demand[policy.AllGPUs], d.Reason, c.outcome, c.demand)
		}
	}
	// Ten tenths fill a guarantee of one GPU, though in floating point the
	// tenths held in two namespaces (3 and 6) and one more sum past 1.
	tenth := 1 / float64(10)
	held := 3*tenth + 6*tenth
	u := withReplicas(cluster(16, map[string]float64{"solo": held}), map[string]int{shared: 10})
	if d := admission.Decide(soloPolicy(t), job("solo").gpus(1, 1).model(shared).shared().Job, u); d.Outcome != admission.Admit {
		t.Errorf("the tenth tenth (%.17g held): %s (%s)", held, d.Outcome, d.Reason)
	}
}

func soloPolicy(t *testing.T) *policy.Policy {
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(`
queue "dev" { priority = 40 }
tenant "solo" {
  namespaces = ["solo"]
  queues     = ["dev"]
  guaranteed = 1
}`)}, 0)
	if diags.HasErrors() {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	return p
}

func TestApprovalsRaiseTheLimitAndTheBandOfTheirJobOnly(t *testing.T) {
	p := testPolicy(t, true)
	u := cluster(16, map[string]float64{"search": 4})
	// search's limit is 4, all held: one more GPU waits for its own jobs.
	j := job("search").gpus(1, 1)
	if d := admission.Decide(p, j.Job, u); d.Outcome != admission.Queue || d.WaitsFor != admission.WaitLimit {
		t.Fatalf("without approval: %+v", d)
	}
	j.Granted = admission.Granted{ExtraGPUs: 1}
	d := admission.Decide(p, j.Job, u)
	if d.Outcome != admission.AdmitBorrowed || !strings.Contains(d.Reason, "limit raised for this job by approval") {
		t.Errorf("one extra GPU granted: %+v", d)
	}
	if p.TenantOf("search").Limit.Total() != 4 {
		t.Error("the policy itself was changed")
	}
	j.Granted = admission.Granted{ExtraGPUs: 1, Priority: 90}
	if d := admission.Decide(p, j.Job, u); d.Priority != 90 || !strings.Contains(d.Reason, "priority 90 by approval") {
		t.Errorf("band granted: %+v", d)
	}
	// A band lower than the queue's changes nothing; nor does any grant a refusal.
	within := job("vision").gpus(1, 1)
	within.Granted = admission.Granted{Priority: 30}
	if d := admission.Decide(p, within.Job, u); d.Priority != 45 || strings.Contains(d.Reason, "approval") {
		t.Errorf("lower band granted: %+v", d)
	}
	over := job("vision").gpus(1, 20)
	over.Granted = admission.Granted{ExtraGPUs: 1, Priority: 90}
	if d := admission.Decide(p, over.Job, u); d.Outcome != admission.Reject || d.Priority == 90 {
		t.Errorf("a refusal raised: %+v", d)
	}
}

// A job in its re-borrow backoff is not admitted borrowed: it waits, passed
// over (it holds no one up), with when it may borrow again; within its
// tenant's guarantee it is admitted as any other.
func TestABackoffHoldsBackBorrowingOnly(t *testing.T) {
	p := testPolicy(t, true)
	until := time.Date(2026, 12, 1, 14, 20, 0, 0, time.UTC)
	beyond := job("vision").gpus(10, 1) // vision holds none: its guarantee is 8, its limit 16
	beyond.Backoff = &admission.Backoff{Preemptions: 3, Until: until}
	d := admission.Decide(p, beyond.Job, cluster(16, nil))
	if d.Outcome != admission.Queue || d.Rule != admission.RuleBorrowBackoff || d.WaitsFor != admission.WaitLimit ||
		d.Reason != "borrowing again after 14:20 (preempted 3 times); queued until then, or until its tenant's guarantee has room" {
		t.Errorf("borrowed in its backoff: %+v", d)
	}
	var pass queue.Pass
	if pass.Admits(d); pass.HoldsBackBorrowers() {
		t.Error("a job in its backoff holds up the borrowers behind it")
	}
	within := job("vision").gpus(1, 2)
	within.Backoff = beyond.Backoff
	if d := admission.Decide(p, within.Job, cluster(16, nil)); d.Outcome != admission.Admit {
		t.Errorf("within its guarantee in its backoff: %+v", d)
	}
	// No GPU idle: it waits for its backoff, not for idle GPUs (it could not
	// take them), and so holds up no borrower behind it.
	if d := admission.Decide(p, beyond.Job, cluster(0, nil)); d.Rule != admission.RuleBorrowBackoff || d.WaitsFor != admission.WaitLimit {
		t.Errorf("no GPU idle, in its backoff: %+v", d)
	}
	beyond.Backoff = nil
	if d := admission.Decide(p, beyond.Job, cluster(16, nil)); d.Outcome != admission.AdmitBorrowed {
		t.Errorf("its backoff over: %+v", d)
	}
}

func TestTheBackoffDoublesUpToItsMost(t *testing.T) {
	b := policy.Borrowing{Backoff: 30 * time.Minute, MaxBackoff: 24 * time.Hour}
	for k, want := range map[int]time.Duration{0: 0, 1: 30 * time.Minute, 2: time.Hour, 3: 2 * time.Hour, 6: 16 * time.Hour, 7: 24 * time.Hour, 60: 24 * time.Hour} {
		if got := b.BackoffAfter(k); got != want {
			t.Errorf("after %d preemptions: %s, want %s", k, got, want)
		}
	}
}

// After max_preemptions evictions a job borrows no more: it runs only within
// its guarantee, and the user reads why.
func TestAJobEvictedMaxPreemptionsTimesBorrowsNoMore(t *testing.T) {
	b := policy.Borrowing{Backoff: 4 * time.Hour, MaxBackoff: 168 * time.Hour, MaxPreemptions: 5}
	if got := b.BackoffAfter(4); got != 32*time.Hour {
		t.Errorf("after 4 preemptions: %s, want 32h", got)
	}
	if got := b.BackoffAfter(5); got != policy.NoMoreBorrowing {
		t.Errorf("after 5 preemptions: %s, want no more borrowing", got)
	}
	if got := b.ForgetAfter(5); got != 672*time.Hour {
		t.Errorf("forgotten after %s, want 672h", got)
	}
	last := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	// However long ago: only the prune forgets a count, once the job no
	// longer waits.
	bo := admission.BackoffFor(b, 5, last, last.Add(2000*time.Hour))
	if bo == nil || !bo.NoMore || bo.Text() != "borrowing no more (preempted 5 times: borrowing.max_preemptions)" {
		t.Errorf("after 5 preemptions: %+v", bo)
	}
	p := testPolicy(t, true)
	beyond := job("vision").gpus(10, 1) // vision's guarantee is 8, its limit 16
	beyond.Backoff = bo
	if d := admission.Decide(p, beyond.Job, cluster(16, nil)); d.Outcome != admission.Queue || d.Rule != admission.RuleBorrowBackoff || d.WaitsFor != admission.WaitGuarantee ||
		d.Reason != "borrowing no more (preempted 5 times: borrowing.max_preemptions); queued until its tenant's guarantee has room, its tenant's newer work held behind it" {
		t.Errorf("borrowed, past max_preemptions: %+v", d)
	}
	b.MaxPreemptions = 0 // no cap
	if bo := admission.BackoffFor(b, 5, last, last.Add(200*time.Hour)); bo != nil {
		t.Errorf("without a cap, 200h after its 5th eviction: %+v", bo)
	}
}

// The metric of jobs held back from borrowing counts by the same rule, by
// the tenant the policy maps each namespace to.
func TestJobsInBackoffAreCountedByTenant(t *testing.T) {
	p := testPolicy(t, true)
	p.Borrowing.Backoff, p.Borrowing.MaxBackoff, p.Borrowing.MaxPreemptions = time.Hour, 4*time.Hour, 3
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got := admission.InBackoffByTenant(p, []admission.Evicted{
		{Namespace: "vision", Count: 1, Last: now.Add(-30 * time.Minute)}, // in its first hour
		{Namespace: "vision", Count: 2, Last: now.Add(-3 * time.Hour)},    // its 2 hours are over
		{Namespace: "vision", Count: 3, Last: now.Add(-1000 * time.Hour)}, // capped: no more
		{Namespace: "unmapped", Count: 1, Last: now.Add(-time.Minute)},    // no tenant
	}, now)
	if want := map[string]int{"vision": 2}; !maps.Equal(got, want) {
		t.Errorf("in backoff by tenant: %v, want %v", got, want)
	}
}

// A tenant's own order (issue 57): while its job queued since owed waits
// for room within its guarantee only, its work submitted after it is
// queued behind it, borrowing or within the guarantee. That job itself,
// and work queued before it, are decided as always. Other tenants are not
// held.
func TestATenantsWorkWaitsBehindItsJobOwedItsGuarantee(t *testing.T) {
	p := testPolicy(t, true)
	owed := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	u := cluster(16, map[string]float64{"vision": 4})
	tu := u.Tenants["vision"]
	tu.OwedSince = owed
	u.Tenants["vision"] = tu
	for _, c := range []struct {
		name      string
		ns        string
		submitted time.Time
		want      admission.Outcome
	}{
		{"a submission, within the guarantee", "vision", time.Time{}, admission.Queue},
		{"an entry queued after it", "vision", owed.Add(time.Minute), admission.Queue},
		{"the owed entry itself", "vision", owed, admission.Admit},
		{"an entry queued before it", "vision", owed.Add(-time.Minute), admission.Admit},
		{"another tenant's submission", "search", time.Time{}, admission.Admit},
	} {
		j := job(c.ns).gpus(2, 1)
		j.Submitted = c.submitted
		d := admission.Decide(p, j.Job, u)
		if d.Outcome != c.want || (c.want == admission.Queue && (d.Rule != admission.RuleTenantOrder ||
			!strings.Contains(d.Reason, `tenant "vision" has a job queued since 2026-12-01T10:00:00Z that runs only within its guarantee`))) {
			t.Errorf("%s: %s %s: %s; want %s", c.name, d.Outcome, d.Rule, d.Reason, c.want)
		}
	}
}
