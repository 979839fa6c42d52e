// Package admission decides what happens to a GPU job: admit it at its queue's
// priority, admit it as borrowed (preemptible) capacity, queue it, or reject it.
// It is pure: everything it needs comes in as arguments, nothing is read or written.
package admission

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Outcome is what the broker does with a job.
type Outcome string

const (
	Admit         Outcome = "admit"
	AdmitBorrowed Outcome = "admit-borrowed"
	Queue         Outcome = "queue"
	Reject        Outcome = "reject"
)

// Rules that refuse a job (over-budget: demote it), named in the answer a
// user sees.
const (
	RuleUnmappedNamespace = "unmapped-namespace"
	RuleQueueNotAllowed   = "queue-not-allowed"
	RuleAboveLimit        = "above-limit"
	RuleNoNodeFits        = "no-node-fits"
	RuleUnknownClass      = "unknown-gpu-class"
	RulePeriodicGPU       = "periodic-gpu-job"
	RuleInvalidTTL        = "invalid-ttl"
	// RuleOverBudget admits a tenant's job borrowed: it spent its budget.
	RuleOverBudget = "over-budget"
	// Workload rules.
	RuleWorkloadMaxGPUs   = "workload-max-gpus"
	RuleRequireUpdate     = "workload-require-update"
	RuleGang              = "workload-gang"
	RuleProtectedMinCount = "workload-protect-min-count"
	// RuleBorrowBackoff holds back from borrowing a job preempted while
	// borrowed, for its backoff (policy borrowing { backoff }).
	RuleBorrowBackoff = "borrow-backoff"
	// RuleTenantOrder holds a tenant's work behind its older job that runs
	// only within its guarantee (TenantUsage.OwedSince).
	RuleTenantOrder    = "tenant-order"
	RuleWorkloadShared = "workload-shared"
	// RuleUndeclaredGPUAccess refuses a job that would use GPUs it does not
	// ask for (nomadjob.UndeclaredGPUAccess).
	RuleUndeclaredGPUAccess = "undeclared-gpu-access"
)

// Job is the GPU demand of a job, as admission sees it.
type Job struct {
	ID        string
	Namespace string
	Queue     string // from the job meta; empty means the tenant's default
	// TTL is the lifetime the job asks for (meta nomad-gpu.ttl), as written.
	TTL    string
	Groups []Group
	// CanaryAutoRevert: every GPU group has an update block with canaries
	// and auto_revert (a workload's require_update asks for it).
	CanaryAutoRevert bool
	// RevertTo is the demand of the version Nomad goes back to when this
	// one's deployment fails (auto_revert): until the deployment ends the
	// job may hold either, so it is counted at the larger, per class.
	RevertTo []Group
	// Granted is what approvals in force grant this job.
	Granted Granted
	// Backoff, while it runs, holds the job back from borrowing (nil: none).
	Backoff *Backoff
	// Submitted is when it entered the broker's queue (zero: a submission
	// being decided now): its place behind its tenant's work owed its
	// guarantee (TenantUsage.OwedSince).
	Submitted time.Time
	// Where bounds the nodes its allocations may go to (zero: any node).
	Where Where
	// Periodic: Nomad launches it on its own schedule (RulePeriodicGPU).
	Periodic bool
}

// Where is where a job may run, as the broker reads it.
type Where struct {
	Datacenters []string // globs, as Nomad reads them (nil: any)
	Pool        string   // its node pool ("": any)
	// Region is the Nomad region it is registered in, as the broker names
	// it ("": the broker's own): its nodes, idle GPUs and preemptions are
	// that region's, its tenant's usage is counted over every region.
	Region string
	Nodes  []string // the node-id set it is pinned to (nil: any)
	// NoPin: the broker does not choose its nodes. A system job places on
	// every node it may. A service must stay free to scale and to be
	// rescheduled elsewhere (a scale cannot move a pin). A job with
	// constraints, affinities or spreads of its own places by rules the
	// broker does not read.
	NoPin bool
}

// Backoff is a job's re-borrow backoff: evicted Preemptions times while
// borrowed, it borrows again at Until (UTC). The adapter sets it only while
// Until is ahead: Decide reads no clock.
type Backoff struct {
	Preemptions int       `json:"preemptions"`
	Until       time.Time `json:"until"`
	// NoMore: evicted max_preemptions times, it borrows no more until its
	// count is forgotten (Until is zero).
	NoMore bool `json:"no_more,omitempty"`
}

// Preemptions tells how often job namespace/id was evicted while borrowed,
// and when last (the store of the counts; nil: none kept).
type Preemptions func(namespace, id string) (count int, last time.Time)

// Backoff is the job's backoff under b at now (nil: none running).
func (f Preemptions) Backoff(b policy.Borrowing, namespace, id string, now time.Time) *Backoff {
	if f == nil {
		return nil
	}
	count, last := f(namespace, id)
	return BackoffFor(b, count, last, now)
}

// BackoffFor is the backoff of a job evicted count times while borrowed, the
// last at last, as it stands at now under b (nil: none running).
func BackoffFor(b policy.Borrowing, count int, last, now time.Time) *Backoff {
	switch {
	case !b.InBackoff(count, now.Sub(last)):
		return nil
	case b.BorrowsNoMore(count):
		return &Backoff{Preemptions: count, NoMore: true}
	}
	return &Backoff{Preemptions: count, Until: last.Add(b.BackoffAfter(count)).UTC()}
}

// Evicted is one job's evictions while borrowed: how many, and the last.
type Evicted struct {
	Namespace string
	Count     int
	Last      time.Time
}

// InBackoffByTenant counts, by tenant of p, the jobs of evicted in their
// re-borrow backoff at now.
func InBackoffByTenant(p *policy.Policy, evicted []Evicted, now time.Time) map[string]int {
	out := map[string]int{}
	for _, e := range evicted {
		if t := p.TenantOf(e.Namespace); t != nil && p.Borrowing.InBackoff(e.Count, now.Sub(e.Last)) {
			out[t.Name]++
		}
	}
	return out
}

// Text is how a user reads it: "borrowing again after 14:20 (preempted 3 times)".
func (b Backoff) Text() string {
	times := "times"
	if b.Preemptions == 1 {
		times = "time"
	}
	if b.NoMore {
		return fmt.Sprintf("borrowing no more (preempted %d %s: borrowing.max_preemptions)", b.Preemptions, times)
	}
	return fmt.Sprintf("borrowing again after %s (preempted %d %s)", b.Until.UTC().Format("15:04"), b.Preemptions, times)
}

// Granted is what approvals in force grant one job: GPUs above its tenant's
// limit, and the least band it runs at once admitted (0: none).
type Granted struct {
	ExtraGPUs int
	Priority  int
}

// Group is one task group's GPU demand.
type Group struct {
	Name         string
	Count        int    // allocations
	GPUsPerAlloc int    // GPUs each allocation asks for, all tasks together
	Model        string // the device name asked for, if the job names a model
	// Shared: only time-sliced replicas can meet the request; each counts
	// as 1/N of a GPU, N the replicas per GPU (Usage.Replicas).
	Shared bool
}

// Usage is the cluster as the broker sees it when deciding.
type Usage struct {
	Tenants  map[string]TenantUsage
	Idle     policy.Quota // healthy GPUs nobody holds, by class and in all
	MaxAlloc policy.Quota // most healthy GPUs on any one node, by class and in all
	// Nodes are the schedulable nodes' device groups: borrowed work and
	// gangs are admitted only where their allocations fit them, and the
	// nodes of admitted work are chosen on them (nil: not known, not
	// checked node by node).
	Nodes []NodeRoom
	// Now is when the decision is made: how long borrowed work has run,
	// for what a preemption would lose (read only with Nodes).
	Now time.Time
	// Replicas is, per shared device group ("<model> (shared)"), how many
	// replicas each of its GPUs is offered as (the fewest where nodes differ).
	Replicas map[string]int
	// Region is the job's region as it holds work back (zero: it holds
	// none back).
	Region Region
}

// Region is what a job's region holds back: a drained region takes no new
// work, and a tenant's region block caps what it holds there.
type Region struct {
	Name string // as Nomad names it
	// DrainedBy says who drained it and when ("": it takes work).
	DrainedBy string
	// Running: the job runs there already, so a drain lets it finish there.
	Running bool
	// Held is what the job's tenant holds there, without the job.
	Held float64
}

// UsedBy is every tenant's GPUs held, in all.
func (u Usage) UsedBy() map[string]float64 {
	out := make(map[string]float64, len(u.Tenants))
	for t, tu := range u.Tenants {
		out[t] = tu.Used.Total()
	}
	return out
}

// Share is the part of a GPU one device of g is: 1, or 1/N for a replica.
// A request for replicas of no named model takes the fewest replicas of any
// shared group (the largest share it could get).
func (u Usage) Share(g Group) float64 {
	if !g.Shared {
		return 1
	}
	n, ok := u.Replicas[g.Model]
	if g.Model == "" {
		for _, r := range u.Replicas {
			if !ok || r < n {
				n, ok = r, true
			}
		}
	}
	if !ok || n < 2 {
		return 1
	}
	return 1 / float64(n)
}

// TenantUsage is what a tenant holds now.
type TenantUsage struct {
	Used     policy.Quota // every GPU it holds, borrowed ones included
	Borrowed policy.Quota // of which held at the borrowing band
	// OverBudget says why the tenant has spent its GPU-hour budget ("" if
	// it has not, or has none): its jobs then run borrowed.
	OverBudget string
	// OwedSince is when the oldest of its queued jobs that run only within
	// its guarantee (admission.WaitGuarantee) entered the queue, as the
	// last queue pass found it (zero: none waits so). Its work submitted
	// after that waits behind it: borrowing, or taking room within the
	// guarantee, that work would keep the job from ever starting.
	OwedSince time.Time
	// Unsettled are the GPUs of its jobs in regions the broker lost and
	// requeued them from. They are not in Used (nor its guarantee, nor its
	// GPU-hours), but they may run there still, so they count against its
	// limit until the region answers and a copy that runs twice is stopped.
	Unsettled policy.Quota
}

// Decision is the outcome and everything needed to apply and explain it.
type Decision struct {
	Outcome  Outcome
	Tenant   string
	Queue    string
	Workload string
	Priority int // Nomad job priority for an admitted job
	Demand   policy.Quota
	Rule     string // for Reject
	WaitsFor string // for Queue: WaitLimit or WaitCapacity
	Reason   string // one sentence a user can act on
	// Cause is, for Queue, what holds the job back, without what the queue
	// then does: the reason a call that cannot wait (scale, dispatch,
	// revert) is refused for.
	Cause string
	// Placed is, for an admission under placement mode broker, the node of
	// each allocation per task group: the broker pins the job there (nil:
	// Nomad chooses).
	Placed Placed
}

// Queued makes d a Queue outcome: cause holds the job back, and then says
// what waiting does about it.
func Queued(d Decision, waitsFor, cause, then string) Decision {
	d.Outcome, d.WaitsFor, d.Cause = Queue, waitsFor, cause
	d.Reason = cause + "; " + then
	return d
}

// What a queued job waits for.
const (
	WaitLimit    = "limit"    // its tenant's own jobs to free quota
	WaitCapacity = "capacity" // GPUs to become idle
	// WaitGuarantee: room within its tenant's guarantee, the only way it
	// may run (evicted max_preemptions times): the tenant's newer work
	// does not take that room meanwhile (queue.Pass).
	WaitGuarantee = "guarantee"
)

// Demand sums GPUs per class (and in all) over the job's groups, a replica
// counting as its share of a GPU.
func Demand(p *policy.Policy, job Job, u Usage) (policy.Quota, []string) {
	d := policy.Quota{}
	var unclassified []string
	for _, g := range job.Groups {
		n := float64(g.Count*g.GPUsPerAlloc) * u.Share(g)
		if n == 0 {
			continue
		}
		d[policy.AllGPUs] += n
		if g.Model == "" {
			unclassified = append(unclassified, g.Name)
			continue
		}
		if c := p.ClassOf(g.Model); c != "" {
			d[c] += n
		} else {
			unclassified = append(unclassified, g.Name)
		}
	}
	return d, unclassified
}

// Decide applies the policy to a job. It rejects a job with no tenant, a
// queue not allowed, a group no node can hold, above the limit or of an
// unknown class. Else it admits within the guarantee, else borrowed within
// the limit when enough GPUs are idle, else it queues. What approvals
// granted the job (job.Granted) raises its tenant's limit for it and the
// band it is admitted at. Every decision the broker makes comes
// from here: registrations, plans, scale, dispatch and revert, the queue's
// passes, `job check` and the simulator.
func Decide(p *policy.Policy, job Job, u Usage) Decision {
	raised := p
	if t := p.TenantOf(job.Namespace); t != nil && job.Granted.ExtraGPUs > 0 {
		raised = p.WithExtraLimit(t.Name, job.Granted.ExtraGPUs)
	}
	d := decide(raised, job, u)
	if d.Outcome != Admit && d.Outcome != AdmitBorrowed {
		return d
	}
	if raised != p {
		d.Reason += "; the tenant's limit raised for this job by approval"
	}
	if job.Granted.Priority > d.Priority {
		d.Priority = job.Granted.Priority
		d.Reason += fmt.Sprintf("; priority %d by approval", job.Granted.Priority)
	}
	return heldInRegion(p, job, u.Region, d)
}

// heldInRegion is admitted d as the job's region holds it back. It is
// queued, and passed over by the queue, while the region is drained, unless
// it runs there already (its work finishes there). It is queued too while
// its tenant would hold more there than its region block allows.
func heldInRegion(p *policy.Policy, job Job, r Region, d Decision) Decision {
	if r.DrainedBy != "" && !r.Running {
		d.Priority, d.Placed = 0, nil
		return Queued(d, WaitLimit, fmt.Sprintf("region %s is drained (%s): no new work goes there", r.Name, r.DrainedBy),
			"queued until it resumes (gpu-broker region resume)")
	}
	t := p.TenantOf(job.Namespace)
	if t == nil {
		return d
	}
	if limit, ok := t.RegionLimits[r.Name]; ok && r.Held+d.Demand.Total() > limit+1e-9 {
		d.Priority, d.Placed = 0, nil
		return Queued(d, WaitLimit, fmt.Sprintf("tenant %q would hold %g of its limit of %g GPUs in region %s",
			t.Name, r.Held+d.Demand.Total(), limit, r.Name), "queued until its own jobs there free GPUs")
	}
	return d
}

// Long: the decision's rules in the order they apply, each returning; the order is the policy.
func decide(p *policy.Policy, job Job, u Usage) Decision {
	demand, unclassified := Demand(p, job, u)
	var reverts string // why the job counts more than it asks for
	if len(job.RevertTo) > 0 {
		back, _ := Demand(p, Job{Groups: job.RevertTo}, u)
		if larger(back, demand) {
			reverts = fmt.Sprintf(" (this version %g, its stable version %g: Nomad reverts to that if the deployment fails, so it is counted until the deployment ends)",
				demand[policy.AllGPUs], back[policy.AllGPUs])
			for class, n := range back {
				demand[class] = max(demand[class], n)
			}
		}
	}
	d := Decision{Demand: demand}
	if len(job.Groups) == 0 {
		d.Outcome, d.Reason = Admit, "no GPU demand"
		return d
	}
	if job.Periodic {
		// Each run would take GPUs when Nomad launches it, past the broker.
		return reject(d, RulePeriodicGPU, "periodic jobs launch GPU work on Nomad's schedule without admission; "+
			"submit each run through the broker, or dispatch a parameterized job")
	}
	// A GPU group at count 0 holds nothing yet, but is decided (tenant,
	// queue, priority) like any other: its scale-up is decided against that.
	tenant := p.TenantOf(job.Namespace)
	if tenant == nil {
		return reject(d, RuleUnmappedNamespace, fmt.Sprintf("namespace %q belongs to no tenant, so it may not use GPUs", job.Namespace))
	}
	d.Tenant = tenant.Name
	d.Queue = job.Queue
	if d.Queue == "" {
		d.Queue = tenant.DefaultQueue()
	}
	if !tenant.Allows(d.Queue) {
		return reject(d, RuleQueueNotAllowed, fmt.Sprintf("tenant %q may not use queue %q (allowed: %s)",
			tenant.Name, d.Queue, strings.Join(tenant.Queues, ", ")))
	}
	q := p.Queues[d.Queue]
	d.Workload = q.Workload
	w := p.Workloads[q.Workload]
	if w != nil && w.MaxGPUs > 0 && exceeds(demand[policy.AllGPUs], float64(w.MaxGPUs)) {
		return reject(d, RuleWorkloadMaxGPUs, fmt.Sprintf("workload %q jobs take at most %d GPUs; this one asks for %g", w.Name, w.MaxGPUs, demand[policy.AllGPUs]))
	}
	if w != nil && w.RequireUpdate && !job.CanaryAutoRevert {
		return reject(d, RuleRequireUpdate, fmt.Sprintf("workload %q jobs need an update block with canary > 0 and auto_revert = true in every GPU task group (or the job)", w.Name))
	}
	if w != nil && !w.Shared {
		for _, g := range job.Groups {
			if g.Shared {
				return reject(d, RuleWorkloadShared, fmt.Sprintf("workload %q takes whole GPUs, but task group %q asks for time-sliced replicas (a workload with shared = true may)", w.Name, g.Name))
			}
		}
	}
	if rule, why := ttlRefused(p, job.TTL, d); why != "" {
		return reject(d, rule, why)
	}
	if len(unclassified) > 0 && !hasKey(tenant.Limit, policy.AllGPUs) {
		return reject(d, RuleUnknownClass, fmt.Sprintf("task group %q asks for GPUs of no known class, and tenant %q has quotas per class only (%s): ask for a model such as nvidia/gpu/<model>",
			unclassified[0], tenant.Name, strings.Join(keys(tenant.Limit), ", ")))
	}
	for _, class := range keys(demand) {
		if class != policy.AllGPUs && !hasKey(tenant.Limit, class) && !hasKey(tenant.Limit, policy.AllGPUs) {
			return reject(d, RuleUnknownClass, fmt.Sprintf("tenant %q has no quota for %s", tenant.Name, gpus(class)))
		}
	}
	for _, g := range job.Groups {
		class := p.ClassOf(g.Model)
		if class == "" {
			class = policy.AllGPUs
		}
		if need := float64(g.GPUsPerAlloc) * u.Share(g); exceeds(need, u.MaxAlloc[class]) {
			return reject(d, RuleNoNodeFits, fmt.Sprintf("task group %q needs %g %s in one allocation, but no node has more than %g",
				g.Name, need, gpus(class), u.MaxAlloc[class]))
		}
	}

	for _, class := range keys(demand) {
		if limit, ok := tenant.Limit[class]; ok && exceeds(demand[class], limit) {
			return reject(d, RuleAboveLimit, fmt.Sprintf("the job needs %g %s%s, above tenant %q's limit of %g",
				demand[class], gpus(class), reverts, tenant.Name, limit))
		}
	}
	d = placeGate(p, w, job, u, workloadGate(w, decideQuota(p, u, d, tenant, q, demand, job)))
	if reverts != "" {
		note := "; counted at the larger of two versions" + reverts
		if then, ok := strings.CutPrefix(d.Reason, d.Cause); ok && d.Cause != "" {
			d.Cause += note
			d.Reason = d.Cause + then
		} else {
			d.Reason += note
		}
	}
	return d
}

// larger reports whether a holds more than b of any class.
func larger(a, b policy.Quota) bool {
	for class, n := range a {
		if exceeds(n, b[class]) {
			return true
		}
	}
	return false
}

// decideQuota admits within the guarantee, borrowed within the limit on
// idle GPUs, or queues. A job in its re-borrow backoff (backoff) is not
// borrowed. It waits for its backoff to end or its tenant's guarantee to
// have room, passed over by the queue's pass: it holds no one up, as one
// waiting for idle GPUs would.
func decideQuota(p *policy.Policy, u Usage, d Decision, tenant *policy.Tenant, q *policy.Queue, demand policy.Quota, job Job) Decision {
	backoff := job.Backoff
	used, over := u.Tenants[tenant.Name].Used, u.Tenants[tenant.Name].OverBudget
	if lost := u.Tenants[tenant.Name].Unsettled; len(lost) > 0 && !within(used.Plus(lost), demand, tenant.Limit, false) {
		return Queued(d, WaitLimit, fmt.Sprintf("tenant %q would hold %g of its limit of %g GPUs, counting %g of its jobs' in regions the broker cannot reach",
			tenant.Name, used[policy.AllGPUs]+lost.Total()+demand[policy.AllGPUs], tenant.Limit.Total(), lost.Total()),
			"queued until those regions answer or its own jobs free GPUs")
	}
	if owed := u.Tenants[tenant.Name].OwedSince; !owed.IsZero() && (job.Submitted.IsZero() || job.Submitted.After(owed)) {
		d.Rule = RuleTenantOrder
		return Queued(d, WaitLimit, fmt.Sprintf("tenant %q has a job queued since %s that runs only within its guarantee (%s)",
			tenant.Name, owed.UTC().Format(time.RFC3339), "evicted borrowing.max_preemptions times"),
			"queued behind it, in the tenant's own order")
	}
	if within(used, demand, tenant.Guaranteed, true) {
		if over != "" {
			d.Outcome, d.Priority, d.Rule = AdmitBorrowed, p.Borrowing.Priority, RuleOverBudget
			d.Reason = fmt.Sprintf("%s: within its guarantee, but borrowed, preemptible at priority %d until then", over, p.Borrowing.Priority)
			return d
		}
		d.Outcome, d.Priority = Admit, q.Band
		// What it counted, said: a user sees why, an operator what the
		// broker's view held when it decided.
		d.Reason = fmt.Sprintf("within tenant %q's guarantee (it holds %g of %g GPUs with this job)",
			tenant.Name, used[policy.AllGPUs]+demand[policy.AllGPUs], tenant.Guaranteed.Total())
		return d
	}
	if !within(used, demand, tenant.Limit, false) {
		return Queued(d, WaitLimit, fmt.Sprintf("tenant %q would hold %g of its limit of %g GPUs",
			tenant.Name, used[policy.AllGPUs]+demand[policy.AllGPUs], tenant.Limit.Total()), "queued until its own jobs free GPUs")
	}
	if p.Borrowing.Enabled && backoff != nil {
		d.Rule = RuleBorrowBackoff
		if backoff.NoMore {
			return Queued(d, WaitGuarantee, backoff.Text(), "queued until its tenant's guarantee has room, its tenant's newer work held behind it")
		}
		return Queued(d, WaitLimit, backoff.Text(), "queued until then, or until its tenant's guarantee has room")
	}
	if p.Borrowing.Enabled && within(policy.Quota{}, demand, u.Idle, true) {
		d.Outcome, d.Priority = AdmitBorrowed, p.Borrowing.Priority
		d.Reason = fmt.Sprintf("beyond tenant %q's guarantee on idle GPUs (it holds %g of its limit of %g with this job): borrowed, preemptible at priority %d",
			tenant.Name, used[policy.AllGPUs]+demand[policy.AllGPUs], tenant.Limit.Total(), p.Borrowing.Priority)
		return d
	}
	if !p.Borrowing.Enabled {
		return Queued(d, WaitCapacity, fmt.Sprintf("beyond tenant %q's guarantee and borrowing is off", tenant.Name), "queued until its own jobs free GPUs")
	}
	return Queued(d, WaitCapacity, fmt.Sprintf("beyond tenant %q's guarantee and only %g GPUs are idle", tenant.Name, u.Idle[policy.AllGPUs]), "queued until GPUs free")
}

// workloadGate holds back an admission its workload does not allow yet:
// borrowed work whose minimum replicas must not be preemptible.
func workloadGate(w *policy.Workload, d Decision) Decision {
	if w != nil && w.ProtectMinCount && d.Outcome == AdmitBorrowed {
		d.Priority, d.Rule = 0, RuleProtectedMinCount
		return Queued(d, WaitLimit, fmt.Sprintf("workload %q is never admitted borrowed (its minimum replicas must not be preempted)", w.Name),
			"queued until its tenant's guarantee has room")
	}
	return d
}

// placeGate places an admission on the nodes (when they are known).
// Borrowed work goes only where every allocation fits free GPUs now: it
// cannot preempt, and waiting inside Nomad it would count against its
// tenant. A gang goes only where all its allocations fit at once, by
// preemption too when it is within a guarantee. Work within a guarantee is admitted whether or
// not it fits now: Nomad preempts borrowed work for it. Under placement mode
// broker the decision carries the nodes chosen.
func placeGate(p *policy.Policy, w *policy.Workload, job Job, u Usage, d Decision) Decision {
	if u.Nodes == nil || (d.Outcome != Admit && d.Outcome != AdmitBorrowed) || d.Demand.Total() == 0 {
		return d
	}
	placed, ok := Place(job, u.Nodes, d.Outcome == Admit, d.Priority, u.Now)
	gang := w != nil && w.Gang && allocations(job) > 1
	switch {
	case !ok && gang:
		d.Priority, d.Rule = 0, RuleGang
		return Queued(d, WaitCapacity, fmt.Sprintf("workload %q is a gang: its %d allocations do not all fit the nodes at once (%s)",
			w.Name, allocations(job), roomText(job, u.Nodes)), "queued, not placed in part")
	case !ok && d.Outcome == AdmitBorrowed:
		d.Priority, d.Rule = 0, ""
		return Queued(d, WaitCapacity, fmt.Sprintf("beyond tenant %q's guarantee, and no node has room for its allocations now (%s)",
			d.Tenant, roomText(job, u.Nodes)), "queued until a node has")
	case ok && p.Placement.Mode == policy.PlaceBroker && !job.Where.NoPin:
		d.Placed = placed
	}
	return d
}

// allocations counts a job's allocations.
func allocations(job Job) int {
	n := 0
	for _, g := range job.Groups {
		n += g.Count
	}
	return n
}

// within reports whether used+demand stays inside quota for every class the
// quota names. With strict, GPUs the quota does not cover (a class it lacks, or
// GPUs of no class) fail unless the quota counts all GPUs.
func within(used, demand, quota policy.Quota, strict bool) bool {
	total := hasKey(quota, policy.AllGPUs)
	classified := 0.0
	for class, n := range demand {
		if class != policy.AllGPUs {
			classified += n
		}
		limit, ok := quota[class]
		if !ok {
			if strict && !total && class != policy.AllGPUs {
				return false
			}
			continue
		}
		if exceeds(used[class]+n, limit) {
			return false
		}
	}
	return !strict || total || !exceeds(demand[policy.AllGPUs], classified)
}

// exceeds compares GPU counts that may hold sums of replica shares (thirds,
// say), which floating point gets only nearly right.
func exceeds(n, limit float64) bool { return n > limit+1e-9 }

func reject(d Decision, rule, reason string) Decision {
	d.Outcome, d.Rule, d.Reason = Reject, rule, reason
	return d
}

func hasKey(q policy.Quota, k string) bool {
	_, ok := q[k]
	return ok
}

func keys(q policy.Quota) []string {
	out := make([]string, 0, len(q))
	for k := range q {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func gpus(class string) string {
	if class == policy.AllGPUs {
		return "GPUs"
	}
	return class + " GPUs"
}

// ttlRefused is the rule that refuses the lifetime a job asks for, and why:
// shorter than a lifetime rule that selects the job is always allowed,
// longer only up to its max_extend.
func ttlRefused(p *policy.Policy, ttl string, d Decision) (string, string) {
	if ttl == "" {
		return "", ""
	}
	want, err := time.ParseDuration(ttl)
	if err != nil || want <= 0 {
		return RuleInvalidTTL, fmt.Sprintf("meta nomad-gpu.ttl = %q is not a duration such as \"2h\"", ttl)
	}
	for _, r := range p.ReclaimRules() {
		if r.Condition != policy.CondLifetime || (r.Workload != "" && r.Workload != d.Workload) ||
			(r.Queue != "" && r.Queue != d.Queue) || (r.Tenant != "" && r.Tenant != d.Tenant) {
			continue
		}
		if most := r.MaxLifetime + r.MaxExtend; want > most {
			return r.Name, fmt.Sprintf("meta nomad-gpu.ttl = %s is longer than reclaim rule %s allows: max_lifetime %s + max_extend %s",
				want, r.Name, r.MaxLifetime, r.MaxExtend)
		}
	}
	return "", ""
}
