// Package cluster keeps the broker's view of the cluster current from Nomad's
// event stream: schedulable GPUs per node and model, and the GPU demand of every
// live job, from which it derives each tenant's usage.
package cluster

import (
	"maps"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// View is safe for concurrent use. It keeps aggregates up to date as events
// arrive, so that a usage snapshot costs per namespace and model, not per job.
type View struct {
	verify     func(*api.Job) bool
	now        func() time.Time
	overBudget func(tenant string) string
	allocEvent func(AllocEvent)

	mu       sync.RWMutex
	nodes    map[string]node
	jobs     map[jobKey]job
	canaries map[jobKey]map[string]int // unpromoted canaries of a job's active deployment, by group
	held     map[string]*byModel       // GPUs live jobs hold, by namespace
	total    map[string]int            // GPUs live jobs hold, by model, all namespaces
	reserved map[jobKey]reservation    // admitted, maybe not seen in an event yet
	allocs   map[string]Alloc          // allocations holding GPUs, by id
	samples  map[string]Sample         // the GPUs' latest telemetry, by device id (the leader's)
	// What running and pending allocations hold beyond their job's demand
	// (all they hold once the job is stopped): counted as used until Nomad
	// stops them, so that GPUs a stop or scale-down frees are not admitted
	// twice in between.
	holds  map[string]hold           // by allocation id
	heldBy map[jobKey]map[string]int // GPUs by model, of a job's live allocations
	excess map[jobKey]map[string]int // of which beyond its demand, in the totals
	// excessBorrowed: the excess was counted as borrowed (its job\'s flag then).
	excessBorrowed map[jobKey]bool
	nextRes        uint64
	changed        chan struct{}
	synced         bool // a full listing has been applied

	index    atomic.Uint64 // of the last event or listing applied
	relisted atomic.Uint64 // full listings made

	// Derived from nodes under one policy; recomputed when either changes.
	nodesDirty bool
	capPolicy  *policy.Policy
	capacity   policy.Quota
	maxAlloc   policy.Quota
	replicas   map[string]int // replicas per GPU of each shared group, the fewest of any node
}

type node struct {
	schedulable bool
	pool        string
	// For the GPU map: what Nomad says of the node.
	name, status string
	draining     bool
	eligible     bool
	gpus         map[string]int // healthy GPUs by model
	devices      map[string]GPU // every GPU, by device id
	replicas     map[string]int // replicas per GPU of its shared groups, by group name
}

// GPU is one GPU of a node.
type GPU struct {
	Model   string
	Healthy bool
	// Replicas is how many devices its physical GPU is offered as (0 for a
	// whole GPU): such a device is 1/Replicas of a GPU.
	Replicas int
	// Why is the class of what made it unhealthy: xid, ecc, lost,
	// recovering (healthy again, waiting out its hysteresis) or other.
	Why string
	// Health is the device plugin's description of its health.
	Health string
}

// whyUnhealthy classes the device plugin's health description.
func whyUnhealthy(desc string) string {
	d := strings.ToLower(desc)
	switch {
	case strings.HasPrefix(d, "recovering"):
		return "recovering"
	case strings.Contains(d, "xid"):
		return "xid"
	case strings.Contains(d, "ecc"):
		return "ecc"
	case strings.Contains(d, "lost"):
		return "lost"
	}
	return "other"
}

type jobKey struct{ namespace, id string }

// job is a live job's demand.
type job struct {
	groups        []admission.Group
	borrowed      bool
	tenant, queue string // from a verified stamp, else ""
	modifyIndex   uint64 // Nomad's JobModifyIndex of the version recorded
	demand        map[string]int
}

type byModel struct {
	held, borrowed map[string]int
}

// reservation is demand admitted by this broker and sent to Nomad, counted
// (as the larger of it and what the job's events say) until it expires, so
// that a decision taken right after it sees it even before Nomad's event.
type reservation struct {
	seq      uint64
	demand   map[string]int
	borrowed bool
	until    time.Time
	index    uint64 // Nomad's JobModifyIndex for it, once Nomad took the job
}

// settleGrace is how long a reservation stays after its job's event when the
// event shows less than was reserved: the deployment event with the canaries
// follows the job event.
const settleGrace = 5 * time.Second

// NewView returns an empty view. verify tells the broker's own admissions
// (their stamp) from meta anyone could write; nil trusts no stamp.
func NewView(verify func(*api.Job) bool) *View {
	if verify == nil {
		verify = func(*api.Job) bool { return false }
	}
	return &View{verify: verify, now: time.Now, nodes: map[string]node{}, jobs: map[jobKey]job{},
		canaries: map[jobKey]map[string]int{}, held: map[string]*byModel{}, total: map[string]int{},
		reserved: map[jobKey]reservation{}, allocs: map[string]Alloc{}, holds: map[string]hold{}, heldBy: map[jobKey]map[string]int{},
		excess: map[jobKey]map[string]int{}, excessBorrowed: map[jobKey]bool{}, changed: make(chan struct{}, 1), nodesDirty: true}
}

// SetBudgets has admission see which tenants spent their GPU-hour budget
// (set before the view is used).
func (v *View) SetBudgets(overBudget func(tenant string) string) { v.overBudget = overBudget }

// SetAllocEvents has the view tell what becomes of the GPU allocations it
// follows in events (set before the view is used).
func (v *View) SetAllocEvents(f func(AllocEvent)) { v.allocEvent = f }

// SetClock replaces the clock reservations expire by (tests).
func (v *View) SetClock(now func() time.Time) { v.now = now }

// Changed is signalled (at most one pending signal) whenever the view changes.
func (v *View) Changed() <-chan struct{} { return v.changed }

func (v *View) notify() {
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// Reset replaces the whole view with a full listing, at once: a decision
// never sees it half rebuilt.
func (v *View) Reset(snap Snapshot) {
	v.mu.Lock()
	v.nodes, v.jobs, v.held, v.total, v.nodesDirty = map[string]node{}, map[jobKey]job{}, map[string]*byModel{}, map[string]int{}, true
	v.canaries, v.allocs = map[jobKey]map[string]int{}, map[string]Alloc{}
	v.holds, v.heldBy, v.excess = map[string]hold{}, map[jobKey]map[string]int{}, map[jobKey]map[string]int{}
	v.excessBorrowed = map[jobKey]bool{}
	for _, n := range snap.Nodes {
		v.observeNode(n)
	}
	for _, j := range snap.Jobs {
		v.observeJob(j)
	}
	for _, d := range snap.Deployments {
		v.observeDeployment(d)
	}
	for _, a := range snap.Allocs {
		v.observeAlloc(a, false)
	}
	v.synced = true
	v.mu.Unlock()
	v.notify()
}

// Synced reports whether a full listing has been applied.
func (v *View) Synced() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.synced
}

// ObserveNode records a node's schedulable, healthy GPUs.
func (v *View) ObserveNode(n *api.Node) {
	v.mu.Lock()
	v.observeNode(n)
	v.mu.Unlock()
	v.notify()
}

func (v *View) observeNode(n *api.Node) {
	nd := node{schedulable: n.Status == api.NodeStatusReady && n.SchedulingEligibility != api.NodeSchedulingIneligible,
		pool: n.NodePool, gpus: map[string]int{}, devices: map[string]GPU{}, replicas: map[string]int{},
		name: n.Name, status: n.Status, draining: n.Drain || n.DrainStrategy != nil, eligible: n.SchedulingEligibility != api.NodeSchedulingIneligible}
	if n.NodeResources != nil {
		for _, d := range n.NodeResources.Devices {
			if d == nil || !nomadjob.IsGPUGroup(d.Vendor, d.Type) {
				continue
			}
			replicas := 0
			if shared, ok := d.Attributes["shared"]; ok && shared != nil && shared.BoolVal != nil && *shared.BoolVal {
				if r := d.Attributes["replicas"]; r != nil && r.IntVal != nil && *r.IntVal > 1 && *r.IntVal <= 64 {
					replicas = int(*r.IntVal)
					nd.replicas[d.Name] = replicas
				}
			}
			for _, inst := range d.Instances {
				if inst == nil {
					continue
				}
				g := GPU{Model: d.Name, Healthy: inst.Healthy, Replicas: replicas, Health: inst.HealthDescription}
				if !inst.Healthy {
					g.Why = whyUnhealthy(inst.HealthDescription)
				}
				nd.devices[inst.ID] = g
				if inst.Healthy {
					nd.gpus[d.Name]++
				}
			}
		}
	}
	v.nodes[n.ID], v.nodesDirty = nd, true
}

// ForgetNode drops a deregistered node.
func (v *View) ForgetNode(id string) {
	v.mu.Lock()
	delete(v.nodes, id)
	v.nodesDirty = true
	v.mu.Unlock()
	v.notify()
}

// NodesFitting counts schedulable nodes with at least gpus healthy GPUs of
// model ("" any model): where a system job's allocations can go.
func (v *View) NodesFitting(model string, gpus int) int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.nodesFitting(model, gpus)
}

func (v *View) nodesFitting(model string, gpus int) int {
	n := 0
	for _, nd := range v.nodes {
		if !nd.schedulable {
			continue
		}
		have := nd.gpus[model]
		if model == "" {
			have = 0
			for _, c := range nd.gpus {
				have += c
			}
		}
		if have >= gpus && have > 0 {
			n++
		}
	}
	return n
}

// ObserveJob records a job's GPU demand while it is live (not stopped, not
// dead). An event about an older version than the one recorded is ignored.
func (v *View) ObserveJob(j *api.Job) {
	v.mu.Lock()
	v.observeJob(j)
	v.mu.Unlock()
	v.notify()
}

func (v *View) observeJob(j *api.Job) {
	if j.ID == nil {
		return
	}
	key := jobKey{nomadjob.Namespace(j), *j.ID}
	live := !(j.Stop != nil && *j.Stop) && !(j.Status != nil && *j.Status == "dead")
	verified := v.verify(j)
	borrowed := j.Meta[nomadjob.MetaBorrowed] == "true" && verified
	var modifyIndex uint64
	if j.JobModifyIndex != nil {
		modifyIndex = *j.JobModifyIndex
	}
	if old, ok := v.jobs[key]; ok && modifyIndex < old.modifyIndex {
		return
	}
	// Nomad has already canonicalised the counts of a job it returns; a job
	// whose demand cannot be read is counted as nothing rather than guessed.
	a, _ := nomadjob.Admission(j, v.nodesFitting)
	v.remove(key)
	if live && len(a.Groups) > 0 {
		jb := job{groups: a.Groups, borrowed: borrowed, modifyIndex: modifyIndex}
		if verified {
			jb.tenant, jb.queue = j.Meta[nomadjob.MetaTenant], j.Meta[nomadjob.MetaQueue]
		}
		v.add(key, jb)
	}
}

// ObserveDeployment records the canaries an active, unpromoted deployment
// places beside the job's current allocations.
func (v *View) ObserveDeployment(d *api.Deployment) {
	v.mu.Lock()
	v.observeDeployment(d)
	v.mu.Unlock()
	v.notify()
}

func (v *View) observeDeployment(d *api.Deployment) {
	key := jobKey{d.Namespace, d.JobID}
	canaries := map[string]int{}
	switch d.Status {
	case api.DeploymentStatusSuccessful, api.DeploymentStatusFailed, api.DeploymentStatusCancelled:
	default:
		for tg, s := range d.TaskGroups {
			if s != nil && !s.Promoted && s.DesiredCanaries > 0 {
				canaries[tg] = s.DesiredCanaries
			}
		}
	}
	old, ok := v.jobs[key]
	if ok {
		v.remove(key)
	}
	if len(canaries) == 0 {
		delete(v.canaries, key)
	} else {
		v.canaries[key] = canaries
	}
	if ok {
		v.add(key, old)
	}
}

// ForgetJob drops a deregistered job.
func (v *View) ForgetJob(namespace, id string) {
	v.mu.Lock()
	v.remove(jobKey{namespace, id})
	delete(v.canaries, jobKey{namespace, id})
	v.mu.Unlock()
	v.notify()
}

// Usage is the admission snapshot under a policy. A live job counts with its
// whole declared demand, placed or not, so that two quick submissions cannot
// both take the same GPUs or the same quota.
func (v *View) Usage(p *policy.Policy) admission.Usage { return v.UsageWithout(p, "", "") }

// UsageWithout is Usage as if the job namespace/id did not exist: the snapshot
// for deciding on a new version of that job. With a namespace, only the tenant
// owning it is reported (all a decision needs), so the cost does not grow with
// the number of tenants.
func (v *View) UsageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.usageWithout(p, namespace, id)
}

// ReservationHold bounds how long an admitted job counts on its own before
// Nomad's events show it: normally they do within a second.
const ReservationHold = 2 * time.Minute

// Admit decides on job (its namespace and id in job) against the current
// usage and, when it admits, reserves the demand before any other decision
// can see the usage without it. The reservation holds until the job's events
// show it, it is released (the registration failed), or ReservationHold ends.
func (v *View) Admit(p *policy.Policy, j admission.Job) (admission.Decision, *Reservation) {
	v.mu.Lock()
	defer v.mu.Unlock()
	u := v.usageWithout(p, j.Namespace, j.ID)
	if isGang(p, j) {
		u.Nodes = v.nodeRooms() // O(allocations): only for the jobs that need it
	}
	d := admission.Decide(p, j, u)
	if d.Demand.Total() == 0 || (d.Outcome != admission.Admit && d.Outcome != admission.AdmitBorrowed) {
		return d, nil
	}
	key := jobKey{j.Namespace, j.ID}
	v.nextRes++
	v.reserved[key] = reservation{seq: v.nextRes, demand: demandByModel(j.Groups), borrowed: d.Outcome == admission.AdmitBorrowed,
		until: v.now().Add(ReservationHold)}
	return d, &Reservation{v: v, key: key, seq: v.nextRes}
}

// Reservation is admitted demand not yet known to be in Nomad.
type Reservation struct {
	v   *View
	key jobKey
	seq uint64
}

// Confirm records that Nomad took the job at index (its JobModifyIndex): the
// reservation ends once the view's events show the job at that index with
// all the reserved demand. Index 0 is a job Nomad created under another id
// (dispatch, periodic force): its own events follow within moments.
func (r *Reservation) Confirm(index uint64) {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	defer r.v.mu.Unlock()
	if res, ok := r.v.reserved[r.key]; ok && res.seq == r.seq {
		res.index = index
		if index == 0 {
			res.until = minTime(res.until, r.v.now().Add(settleGrace))
		}
		r.v.reserved[r.key] = res
		r.v.settle(r.key)
	}
}

// settle ends a confirmed reservation that the job's recorded demand covers,
// and gives one it does not cover a short grace.
func (v *View) settle(key jobKey) {
	res, ok := v.reserved[key]
	rec, recorded := v.jobs[key]
	if !ok || res.index == 0 || !recorded || rec.modifyIndex < res.index {
		return
	}
	for model, n := range res.demand {
		if rec.demand[model] < n {
			res.until = minTime(res.until, v.now().Add(settleGrace))
			v.reserved[key] = res
			return
		}
	}
	delete(v.reserved, key)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Release gives the reservation up: Nomad did not take the job.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	r.v.mu.Lock()
	if res, ok := r.v.reserved[r.key]; ok && res.seq == r.seq {
		delete(r.v.reserved, r.key)
	}
	r.v.mu.Unlock()
	r.v.notify()
}

func (v *View) usageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	if v.nodesDirty || v.capPolicy != p {
		v.replicas = v.sharedReplicas()
		v.capacity, v.maxAlloc = v.nodeTotals(p)
		v.capPolicy, v.nodesDirty = p, false
	}
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Idle: policy.Quota{}, MaxAlloc: copyQuota(v.maxAlloc),
		Replicas: v.replicas}
	classify := func(byModel map[string]int) policy.Quota { return classify(p, byModel, u) }
	except := jobKey{namespace, id}
	// What live reservations add beyond the jobs' recorded demand, by namespace.
	extra, extraBorrowed := v.reservationExtra(except)
	exceptDemand := policy.Quota{}
	exceptBorrowed := false
	if old, ok := v.jobs[except]; ok {
		exceptDemand, exceptBorrowed = classify(old.demand), old.borrowed
	}
	held := classify(v.total)
	sub(held, exceptDemand)
	for _, byNS := range extra {
		add(held, classify(byNS))
	}
	for class, c := range v.capacity {
		u.Idle[class] = max(c-held[class], 0)
	}
	for _, ns := range v.namespacesToReport(p, namespace, extra) {
		t := p.TenantOf(ns)
		if t == nil {
			continue
		}
		demand, borrowed := policy.Quota{}, policy.Quota{}
		if agg, ok := v.held[ns]; ok {
			demand, borrowed = classify(agg.held), classify(agg.borrowed)
		}
		if ns == namespace {
			sub(demand, exceptDemand)
			if exceptBorrowed {
				sub(borrowed, exceptDemand)
			}
		}
		add(demand, classify(extra[ns]))
		add(borrowed, classify(extraBorrowed[ns]))
		tu := u.Tenants[t.Name]
		tu.Used = add(tu.Used, demand)
		tu.Borrowed = add(tu.Borrowed, borrowed)
		if v.overBudget != nil {
			tu.OverBudget = v.overBudget(t.Name)
		}
		u.Tenants[t.Name] = tu
	}
	return u
}

// reservationExtra drops expired reservations and returns, per namespace, the
// GPUs by model that live ones add beyond their job's recorded demand.
func (v *View) reservationExtra(except jobKey) (extra, extraBorrowed map[string]map[string]int) {
	extra, extraBorrowed = map[string]map[string]int{}, map[string]map[string]int{}
	now := v.now()
	for key, r := range v.reserved {
		if !now.Before(r.until) {
			delete(v.reserved, key)
			continue
		}
		if key == except {
			continue
		}
		rec := v.jobs[key].demand
		for model, n := range r.demand {
			if d := n - rec[model]; d > 0 {
				if extra[key.namespace] == nil {
					extra[key.namespace], extraBorrowed[key.namespace] = map[string]int{}, map[string]int{}
				}
				extra[key.namespace][model] += d
				if r.borrowed {
					extraBorrowed[key.namespace][model] += d
				}
			}
		}
	}
	return extra, extraBorrowed
}

// namespacesToReport is every namespace with jobs or reservations, or those of
// namespace's tenant.
func (v *View) namespacesToReport(p *policy.Policy, namespace string, extra map[string]map[string]int) []string {
	if namespace != "" {
		if t := p.TenantOf(namespace); t != nil {
			return t.Namespaces
		}
		return nil
	}
	out := make([]string, 0, len(v.held)+len(extra))
	for ns := range v.held {
		out = append(out, ns)
	}
	for ns := range extra {
		if _, ok := v.held[ns]; !ok {
			out = append(out, ns)
		}
	}
	return out
}

// nodeTotals sums schedulable, healthy GPUs by class, and the most on one node.
func (v *View) nodeTotals(p *policy.Policy) (capacity, maxAlloc policy.Quota) {
	capacity, maxAlloc = policy.Quota{}, policy.Quota{}
	for _, n := range v.nodes {
		if !n.schedulable {
			continue
		}
		perNode := classify(p, n.gpus, admission.Usage{Replicas: v.replicas})
		for class, count := range perNode {
			capacity[class] += count
			maxAlloc[class] = max(maxAlloc[class], count)
		}
	}
	return capacity, maxAlloc
}

// add records a job and adds its demand (with its deployment's canaries) to
// its namespace's totals.
func (v *View) add(key jobKey, j job) {
	j.demand = demandByModel(j.groups)
	for _, g := range j.groups {
		j.demand[g.Model] += v.canaries[key][g.Name] * g.GPUsPerAlloc
	}
	v.jobs[key] = j
	v.account(key.namespace, j, 1)
	v.reexcess(key)
	v.settle(key)
}

func (v *View) remove(key jobKey) {
	if old, ok := v.jobs[key]; ok {
		v.account(key.namespace, old, -1)
		delete(v.jobs, key)
		v.reexcess(key)
	}
}

// reexcess recounts in the totals what a job's live allocations hold beyond
// its demand (all of it once the job is gone); it reports whether that changed.
func (v *View) reexcess(key jobKey) bool {
	old := v.excess[key]
	if old != nil {
		v.account(key.namespace, job{demand: old, borrowed: v.excessBorrowed[key]}, -1)
		delete(v.excess, key)
		delete(v.excessBorrowed, key)
	}
	held := v.heldBy[key]
	if len(held) == 0 {
		return old != nil
	}
	demand := v.jobs[key].demand
	over := 0
	for _, n := range held {
		over += n
	}
	for _, n := range demand {
		over -= n
	}
	if over <= 0 {
		return old != nil
	}
	models := make([]string, 0, len(held))
	for m := range held {
		models = append(models, m)
	}
	sort.Strings(models)
	ex := map[string]int{}
	// Models the demand names count against it first; the rest is excess.
	for _, m := range models {
		if take := min(over, max(0, held[m]-demand[m])); take > 0 {
			ex[m], over = take, over-take
		}
	}
	for _, m := range models {
		if take := min(over, held[m]-ex[m]); take > 0 {
			ex[m], over = ex[m]+take, over-take
		}
	}
	v.excess[key], v.excessBorrowed[key] = ex, v.jobs[key].borrowed
	v.account(key.namespace, job{demand: ex, borrowed: v.jobs[key].borrowed}, 1)
	return !maps.Equal(old, ex)
}

// account adds (sign 1) or removes (-1) a job's demand from its namespace's totals.
func (v *View) account(ns string, j job, sign int) {
	agg := v.held[ns]
	if agg == nil {
		agg = &byModel{held: map[string]int{}, borrowed: map[string]int{}}
		v.held[ns] = agg
	}
	for model, n := range j.demand {
		agg.held[model] += sign * n
		v.total[model] += sign * n
		if j.borrowed {
			agg.borrowed[model] += sign * n
		}
	}
}

// demandByModel is the devices a job's groups ask for, by model; a request
// for replicas of any model is under nomadjob.SharedSuffix alone.
func demandByModel(groups []admission.Group) map[string]int {
	out := map[string]int{}
	for _, g := range groups {
		model := g.Model
		if g.Shared && model == "" {
			model = nomadjob.SharedSuffix
		}
		out[model] += g.Count * g.GPUsPerAlloc
	}
	return out
}

// classify turns devices by model into a quota: all GPUs, and per class, a
// replica counting as its share of a GPU (u.Share).
func classify(p *policy.Policy, byModel map[string]int, u admission.Usage) policy.Quota {
	q := policy.Quota{}
	for model, n := range byModel {
		if n == 0 {
			continue
		}
		gpus := float64(n) * modelShare(model, u)
		q[policy.AllGPUs] += gpus
		if c := p.ClassOf(model); c != "" {
			q[c] += gpus
		}
	}
	return q
}

// modelShare is the part of a GPU one device of model is (u.Share): a
// replica of a shared group, or of any one (nomadjob.SharedSuffix alone).
func modelShare(model string, u admission.Usage) float64 {
	g := admission.Group{Model: model, Shared: strings.HasSuffix(model, nomadjob.SharedSuffix)}
	if model == nomadjob.SharedSuffix {
		g.Model = ""
	}
	return u.Share(g)
}

// sharedReplicas is, per shared group, the fewest replicas per GPU any node
// offers it as.
func (v *View) sharedReplicas() map[string]int {
	out := map[string]int{}
	for _, n := range v.nodes {
		for group, r := range n.replicas {
			if cur, ok := out[group]; !ok || r < cur {
				out[group] = r
			}
		}
	}
	return out
}

func sub(q, d policy.Quota) {
	for k, n := range d {
		q[k] -= n
	}
}

func copyQuota(q policy.Quota) policy.Quota {
	out := make(policy.Quota, len(q))
	for k, n := range q {
		out[k] = n
	}
	return out
}

// Capacity is the number of schedulable, healthy GPUs (a GPU offered as
// replicas counted once).
func (v *View) Capacity() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	// Replicas weigh as in admission: the same share, whatever the node.
	u := admission.Usage{Replicas: v.sharedReplicas()}
	total := 0.0
	for _, n := range v.nodes {
		if n.schedulable {
			for model, c := range n.gpus {
				total += float64(c) * modelShare(model, u)
			}
		}
	}
	return int(math.Round(total))
}

func add(q, d policy.Quota) policy.Quota {
	if q == nil {
		q = policy.Quota{}
	}
	for k, n := range d {
		q[k] += n
	}
	return q
}

// HasJob reports whether the view holds a live GPU job.
func (v *View) HasJob(namespace, id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	_, ok := v.jobs[jobKey{namespace, id}]
	return ok
}

// isGang reports whether j is a job of several allocations in a gang
// workload: the one admission checks node by node.
func isGang(p *policy.Policy, j admission.Job) bool {
	w := p.WorkloadFor(j.Namespace, j.Queue)
	if w == nil || !w.Gang {
		return false
	}
	allocs := 0
	for _, g := range j.Groups {
		allocs += g.Count
	}
	return allocs > 1
}

// nodeRooms is, per schedulable node, its healthy GPUs no live allocation
// holds, and those that allocations of borrowed jobs hold.
func (v *View) nodeRooms() []admission.NodeRoom {
	held, borrowed := map[string]int{}, map[string]int{}
	for _, a := range v.allocs {
		if a.Preempted {
			continue
		}
		held[a.NodeID] += len(a.GPUs)
		if v.jobs[jobKey{a.Namespace, a.JobID}].borrowed {
			borrowed[a.NodeID] += len(a.GPUs)
		}
	}
	ids := make([]string, 0, len(v.nodes))
	for id, n := range v.nodes {
		if n.schedulable {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]admission.NodeRoom, 0, len(ids))
	for _, id := range ids {
		healthy := 0
		for _, c := range v.nodes[id].gpus {
			healthy += c
		}
		out = append(out, admission.NodeRoom{Free: max(healthy-held[id], 0), Borrowed: borrowed[id]})
	}
	return out
}
