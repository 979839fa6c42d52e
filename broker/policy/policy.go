// Package policy is the broker's policy as plain types, with the questions
// the engines ask of it. It holds queues, tenants and their GPU quotas and
// submitters, GPU classes, workload classes, borrowing and preemption,
// reclaim rules and settings, prices, budgets, fair share, approvers and
// regions. It reads
// nothing: policyhcl parses the HCL files into it, and policystore keeps the
// one in force.
package policy

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// AllGPUs is the quota key that counts every GPU, whatever its class.
const AllGPUs = ""

// MinPriorityGap is how far apart Nomad job priorities must be for the higher
// one to preempt the lower.
const MinPriorityGap = 10

// Source gives the policy in force: the one interface every loop and
// handler reads it through.
type Source interface{ Current() *Policy }

// Pos is where something is defined in the policy files.
type Pos struct {
	File         string
	Line, Column int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column) }

// Policy is a validated policy set.
type Policy struct {
	Queues     map[string]*Queue
	Tenants    map[string]*Tenant
	Classes    map[string]*GPUClass
	Borrowing  Borrowing
	Preemption Preemption
	// Placement says who chooses the nodes of GPU work.
	Placement Placement
	Regions   map[string]*Region
	Reclaim   map[string]*ReclaimRule
	// ReclaimSettings say how often the rules are applied and how long
	// decision records are kept.
	ReclaimSettings ReclaimSettings
	// Usage says how GPU use is measured and kept.
	Usage Usage
	// Currency names what prices are in (top-level currency; default USD).
	Currency string
	// FairShare orders the queue by decayed GPU-hours (when Enabled).
	FairShare FairShare
	// Approvers may grant approvals (top-level approvers).
	Approvers []string
	// UndeclaredGPUAccess is what the gate does with a job that would use
	// GPUs it does not ask for (top-level undeclared_gpu_access):
	// AccessRefuse (the default) or AccessWarn.
	UndeclaredGPUAccess string
	// OverLimit is what happens to a tenant holding more than its limit (a
	// limit lowered by a reload), set by the top-level over_limit and
	// over_limit_grace. OverReclaim (the default) requeues its newest work,
	// borrowed first, once it has been over for OverLimitGrace. OverWait
	// waits for its jobs to end.
	OverLimit      string
	OverLimitGrace time.Duration
	// MakeRoom is what happens when a tenant's queued job would be within
	// its guarantee but for the tenant's own work of lower bands (Nomad
	// evicts nothing within 9 points). OverReclaim (the default) requeues
	// that work, borrowed, lowest band and newest first, once the job has
	// waited MakeRoomGrace. OverWait lets the job wait for it to end
	// (top-level make_room, make_room_grace).
	MakeRoom      string
	MakeRoomGrace time.Duration
	// Workloads say how each kind of GPU work is treated, by name.
	Workloads map[string]*Workload
	// Dispatch says how a job that leaves its region to the broker (meta
	// nomad-gpu.region = "auto") is placed in one of the regions it
	// governs (top-level dispatch, dispatch_order).
	Dispatch Dispatch
	// RegionLostTimeout is how long a region the broker cannot reach keeps
	// its jobs charged before each job the broker dispatched there follows
	// its OnRegionLossFor (top-level region_lost_timeout).
	RegionLostTimeout time.Duration
	// OnRegionLoss is RegionLossRequeue or RegionLossHold for every job of
	// a lost region; "" (the default): by the job's type (top-level
	// on_region_loss; a workload's own comes first).
	OnRegionLoss string

	byNamespace map[string]*Tenant
}

// Queue maps a class of work to a Nomad priority band.
type Queue struct {
	Name     string
	Priority int // its place in the queue's order, and its band as written
	Workload string
	// PreemptsWithinGuarantee: its jobs run at Priority itself, so that
	// Nomad lets them evict another tenant's guaranteed work 10 or more
	// below it; otherwise at Band.
	PreemptsWithinGuarantee bool
	// Band is the Nomad priority of its jobs admitted within a guarantee,
	// set by Index: see Index.
	Band int
	// Dispatch is the policy's Dispatch.Mode for this queue's jobs ("":
	// the policy's), SpillAfter its Dispatch.SpillAfter (nil: the
	// policy's).
	Dispatch   string
	SpillAfter *time.Duration
	// AutoRegion: its jobs that name no region leave it to the broker, as
	// meta nomad-gpu.region = "auto" does (queue region = "auto").
	AutoRegion bool
	Pos        Pos // where it is defined
}

// Dispatch says how the broker chooses a region for a job that leaves it to
// the broker. Mode DispatchOrdered takes the first region in Order whose
// decision admits the job now (the broker's own region first, then the
// others by name, where Order leaves them out). DispatchBestFit takes the
// admitting region with the most free GPUs the job's allocations could take
// (the job's model, MIG profile or NVLink island, on nodes with room for
// one). A job admitted nowhere waits in the queue, where each pass chooses
// again.
// Under DispatchOrdered, a region is taken only once the job has waited
// SpillAfter for each region before it in the order that could take it
// (0: at once), so that work spills to the next region only after a wait.
type Dispatch struct {
	Mode       string
	Order      []string
	SpillAfter time.Duration
}

// What becomes of a job the broker dispatched to a region it lost:
// requeued, to be dispatched again (the copy there stopped should the region
// come back), or held there, charged, until the region comes back.
const (
	RegionLossRequeue = "requeue"
	RegionLossHold    = "hold"
)

// DefaultRegionLostTimeout is region_lost_timeout's default.
const DefaultRegionLostTimeout = 15 * time.Minute

// OnRegionLossFor is what becomes of a job of jobType in namespace asking
// for queue ("": its tenant's default) when its region is lost. Its
// workload's on_region_loss decides, else the policy's. Without either a
// batch job is requeued and any other held (a service's copy may well
// still serve).
func (p *Policy) OnRegionLossFor(namespace, queue, jobType string) string {
	if w := p.WorkloadFor(namespace, queue); w != nil && w.OnRegionLoss != "" {
		return w.OnRegionLoss
	}
	if p.OnRegionLoss != "" {
		return p.OnRegionLoss
	}
	if jobType == "batch" {
		return RegionLossRequeue
	}
	return RegionLossHold
}

// RegionAuto leaves a job's region to the broker: meta nomad-gpu.region's
// one value, and a queue's region.
const RegionAuto = "auto"

// Dispatch modes.
const (
	DispatchOrdered = "ordered"
	DispatchBestFit = "best_fit"
)

// DispatchFor is how a job in namespace asking for queue ("": its tenant's
// default) is dispatched: the policy's Dispatch, with the queue's own mode
// and spill_after where it sets them.
func (p *Policy) DispatchFor(namespace, queue string) Dispatch {
	d := p.Dispatch
	if q := p.queueOf(namespace, queue); q != nil {
		if q.Dispatch != "" {
			d.Mode = q.Dispatch
		}
		if q.SpillAfter != nil {
			d.SpillAfter = *q.SpillAfter
		}
	}
	return d
}

// AutoRegionFor reports whether a job in namespace asking for queue ("":
// its tenant's default) that names no region leaves it to the broker.
func (p *Policy) AutoRegionFor(namespace, queue string) bool {
	q := p.queueOf(namespace, queue)
	return q != nil && q.AutoRegion
}

// queueOf is the queue a job in namespace asking for queue ("": its
// tenant's default) goes to; nil when there is none.
func (p *Policy) queueOf(namespace, queue string) *Queue {
	if t := p.TenantOf(namespace); t != nil && queue == "" {
		queue = t.DefaultQueue()
	}
	return p.Queues[queue]
}

// Tenant owns Nomad namespaces and has GPU quotas.
type Tenant struct {
	Name       string
	Namespaces []string
	Queues     []string // the first is the default
	Guaranteed Quota
	Limit      Quota
	// MaxQueued caps the tenant's jobs waiting in the queue, and
	// MaxQueuedRequestBytes the size of each one's stored request.
	MaxQueued             int
	MaxQueuedRequestBytes int
	// Budget caps its GPU-hours per period (nil: none).
	Budget *Budget
	// Submitters are the Nomad ACL roles and policies whose holders may have
	// the broker write jobs in the tenant's namespaces (enforcement "exclusive").
	Submitters []Submitter
	// Approvals bound what one approval may grant the tenant's jobs.
	// RegionLimits cap the GPUs it holds in one region, by region name as
	// Nomad names it (a region block inside the tenant); its limit is over
	// all regions.
	RegionLimits map[string]float64
	Approvals    ApprovalBounds
	Pos          Pos // where it is defined
}

// ApprovalBounds bound one approval (a tenant's approvals block).
type ApprovalBounds struct {
	MaxExtraGPUs int           // default: the tenant's limit (an approval at most doubles it)
	MaxDuration  time.Duration // default and most: MaxApprovalDuration
}

// MaxApprovalDuration is the longest any approval lasts.
const MaxApprovalDuration = 7 * 24 * time.Hour

// CheckApproval says why an approval of extraGPUs above the limit (0: a
// priority) lasting d is beyond the tenant's bounds, or nil.
func (t *Tenant) CheckApproval(extraGPUs int, d time.Duration) error {
	if extraGPUs > t.Approvals.MaxExtraGPUs {
		return fmt.Errorf("tenant %q's approvals grant at most %d GPUs above its limit (approvals { max_extra_gpus }), not %d",
			t.Name, t.Approvals.MaxExtraGPUs, extraGPUs)
	}
	if d > t.Approvals.MaxDuration {
		return fmt.Errorf("tenant %q's approvals last at most %s (approvals { max_duration }), not %s", t.Name, t.Approvals.MaxDuration, d)
	}
	return nil
}

// Submitter is a Nomad ACL role or policy, by name.
type Submitter struct {
	Kind string // SubmitterRole or SubmitterPolicy
	Name string
}

// Kinds of submitter.
const (
	SubmitterRole   = "role"
	SubmitterPolicy = "policy"
)

func (s Submitter) String() string { return s.Kind + ":" + s.Name }

// Grants are what a caller's Nomad ACL token carries.
type Grants struct {
	Management bool
	Roles      []string
	Policies   []string // its own and those of its roles
	// Version changes whenever the token, one of its roles or one of their
	// policies changes.
	Version string
}

// MaySubmit reports whether a caller with g is one of the tenant's
// submitters. A management token may do anything in Nomad itself, so it may
// here too.
func (t *Tenant) MaySubmit(g Grants) bool {
	if g.Management {
		return true
	}
	for _, s := range t.Submitters {
		names := g.Policies
		if s.Kind == SubmitterRole {
			names = g.Roles
		}
		for _, n := range names {
			if n == s.Name {
				return true
			}
		}
	}
	return false
}

// What happens to a tenant over its limit, or to its own lower work in
// the way of its higher queue's job.
const (
	OverReclaim = "reclaim"
	OverWait    = "wait"
	// DefaultOverLimitGrace is how long a tenant may stay over its limit
	// before its work is requeued: it bounds what a way past the gate can
	// hold to about a minute (the grace, a reclaim period, the requeue). A
	// limit lowered on purpose is what over_limit = "wait" is for.
	DefaultOverLimitGrace = 45 * time.Second
	// DefaultMakeRoomGrace is how long a job waits for its tenant's own
	// lower work to end before that work is requeued.
	DefaultMakeRoomGrace = time.Minute
)

// What the gate does with undeclared GPU access.
const (
	AccessRefuse = "refuse"
	AccessWarn   = "warn"
)

// Defaults of a tenant's queue limits.
const (
	DefaultMaxQueued = 100
	// MaxMaxQueued is the most max_queued may be: each queued job is a
	// Consul KV entry the leader reads on its passes.
	MaxMaxQueued                 = 100000
	DefaultMaxQueuedRequestBytes = 256 << 10
	// MaxQueuedRequestBytes is the most max_queued_request_bytes may be: a
	// queued request is kept with its entry in one Consul KV value, and
	// Consul keeps values of at most 512 KiB by default.
	MaxQueuedRequestBytes = 480 << 10
)

// Quota is a number of GPUs per class; the AllGPUs key counts every GPU. A
// policy's quotas are whole GPUs; what jobs hold may not be, since a
// time-sliced replica counts as a fraction of its GPU.
type Quota map[string]float64

// GPUClass groups GPU models (device names) under one quota name.
type GPUClass struct {
	Name   string
	Models []string
	// PricePerGPUHour is what an allocated GPU of the class costs an hour,
	// in the policy's Currency (0: not priced).
	PricePerGPUHour float64
	Pos             Pos // where it is defined
}

// Region names the broker that admits GPU jobs for another Nomad region:
// requests for that region are sent on to it.
type Region struct {
	Name   string
	Broker string
	Pos    Pos // where it is defined
}

// Borrowing lets a tenant use idle GPUs beyond its guarantee at a low,
// preemptible priority.
type Borrowing struct {
	Enabled  bool
	Priority int
	// Backoff: after its k-th preemption while borrowed, a job is not
	// admitted borrowed again for Backoff × 2^(k−1), at most MaxBackoff
	// (within its guarantee it is, at any time).
	Backoff, MaxBackoff time.Duration
	// PromoteBelow: a running borrowed job runs on within its tenant's
	// guarantee (at its queue's band, in place) once the tenant's work
	// within the guarantee and the job together are at most this share of
	// the guarantee; 0: never. A workload may set its own
	// (Policy.PromoteBelow).
	PromoteBelow float64
	// SubBands: running borrowed work moves, in place, between sub-bands
	// above Priority by the work a preemption would lose (its GPUs times
	// its time running). Nomad evicts the lowest priority first, so it
	// takes the cheapest victims: below SubBandStep of GPU time the lowest,
	// each sub-band up twice as much. On by default where the
	// bands leave room (SubBandRoom).
	SubBands    bool
	SubBandStep time.Duration
	// MaxPreemptions: a job evicted this many times while borrowed is not
	// admitted borrowed again (within its guarantee it is, at any time),
	// until its count is forgotten (ForgetAfter); 0: no cap.
	MaxPreemptions int
}

// Placement says who chooses where admitted GPU work runs (a placement
// block). Borrowed work is admitted only where a node has room for it now,
// whichever chooses.
type Placement struct {
	// Mode is PlaceBroker (each admitted job is pinned to the nodes the
	// broker chose for it) or PlaceNomad (Nomad chooses).
	Mode string
	// ReserveAfter: once the oldest waiting job of a tenant below its
	// guarantee has waited this long, a node is held for it: no other
	// borrowed work is admitted onto it while the node's borrowed work
	// ends. 0: never.
	ReserveAfter time.Duration
}

// Placement modes.
const (
	PlaceBroker = "broker"
	PlaceNomad  = "nomad"
)

// Default placement.
const (
	DefaultPlacementMode = PlaceBroker
	DefaultReserveAfter  = 6 * time.Hour
)

// Default re-borrow backoff.
const (
	// 4h / 168h, not the 30m / 24h first specified: with the broker placing
	// borrowed work they meet one goal more at 100,000 jobs (at most 5
	// evictions of one job) and halve the GPU-weighted mean wait (docs/simulator.md).
	DefaultBorrowBackoff    = 4 * time.Hour
	DefaultBorrowMaxBackoff = 168 * time.Hour
	DefaultSubBandStep      = 15 * time.Minute
	// DefaultMaxPreemptions is the goal's bound on the evictions of one
	// job (docs/simulator.md).
	DefaultMaxPreemptions = 5
)

// SubBandRoom is how many sub-bands lie above the borrowing priority, 0 when
// sub-bands are off. They lie below the lowest guaranteed band by
// MinPriorityGap at least (or guaranteed work could not evict the top one),
// and within GuaranteedSpread of the borrowing priority (or borrowed work
// would evict borrowed work).
func (p *Policy) SubBandRoom() int {
	if !p.Borrowing.SubBands || len(p.Queues) == 0 {
		return 0
	}
	lowest := math.MaxInt
	for _, q := range p.Queues {
		lowest = min(lowest, q.Band)
	}
	return max(0, min(GuaranteedSpread, lowest-MinPriorityGap-p.Borrowing.Priority))
}

// SubBand is the priority of borrowed work of gpus GPUs that has run for
// running: the sub-band of the GPU time a preemption would lose now.
func (p *Policy) SubBand(gpus float64, running time.Duration) int {
	room, step := p.SubBandRoom(), p.Borrowing.SubBandStep.Seconds()
	stake := gpus * running.Seconds()
	k := 0
	for lim := step; k < room && step > 0 && stake >= lim; lim *= 2 {
		k++
	}
	return p.Borrowing.Priority + k
}

// NextSubBand is how much longer borrowed work of gpus GPUs that has run for
// running runs before SubBand moves it up (0: it is at the top sub-band, or
// there are none).
func (p *Policy) NextSubBand(gpus float64, running time.Duration) time.Duration {
	room, step := p.SubBandRoom(), p.Borrowing.SubBandStep.Seconds()
	k := p.SubBand(gpus, running) - p.Borrowing.Priority
	if k >= room || step <= 0 || gpus <= 0 {
		return 0
	}
	at := time.Duration(step * math.Pow(2, float64(k)) / gpus * float64(time.Second)) // the stake of sub-band k+1
	return max(at-running, time.Nanosecond)
}

// ForgetAfter is how long after its last preemption the count of a job
// preempted preemptions times is kept once the job is gone (no longer queued
// nor running; a job submitted again meanwhile keeps it): its backoff, then
// max_backoff more.
func (b Borrowing) ForgetAfter(preemptions int) time.Duration {
	if b.BorrowsNoMore(preemptions) {
		return NoMoreFor * b.MaxBackoff // its record has an end too
	}
	return b.BackoffAfter(preemptions) + b.MaxBackoff
}

// BorrowsNoMore reports whether a job preempted preemptions times while
// borrowed has reached max_preemptions.
func (b Borrowing) BorrowsNoMore(preemptions int) bool {
	return b.MaxPreemptions > 0 && preemptions >= b.MaxPreemptions
}

// NoMoreFor: a job that BorrowsNoMore and is gone has its count forgotten
// this many max_backoffs after its last eviction (four weeks by default).
const NoMoreFor = 4

// NoMoreBorrowing is the backoff of a job that BorrowsNoMore: longer than
// any wait; its count is forgotten (ForgetAfter) only once the job is gone.
const NoMoreBorrowing = 100 * 365 * 24 * time.Hour

// InBackoff reports whether a job preempted preemptions times while
// borrowed, the last sinceLast ago, may not borrow yet: the re-borrow rule
// the admission engine and the simulator read alike.
func (b Borrowing) InBackoff(preemptions int, sinceLast time.Duration) bool {
	return preemptions > 0 && (b.BorrowsNoMore(preemptions) || sinceLast < b.BackoffAfter(preemptions))
}

// BackoffAfter is how long a job preempted preemptions times while borrowed
// waits before it borrows again (0 for none).
func (b Borrowing) BackoffAfter(preemptions int) time.Duration {
	if b.BorrowsNoMore(preemptions) {
		return NoMoreBorrowing
	}
	if preemptions < 1 || b.Backoff <= 0 {
		return 0
	}
	d := b.Backoff
	for i := 1; i < preemptions && d < b.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, b.MaxBackoff)
}

// Preemption is written to Nomad's scheduler configuration.
type Preemption struct {
	Batch   bool
	Service bool
}

// GuaranteedSpread is how far apart the bands of guaranteed work may lie:
// less than MinPriorityGap, so that Nomad never preempts one tenant's
// guaranteed job for another's.
const GuaranteedSpread = MinPriorityGap - 1

// Index makes TenantOf answer from the tenants' namespaces, and sets each
// queue's Band; call it once the queues and tenants are set (a parser
// refuses a namespace claimed twice).
//
// The bands of the queues that do not preempt within guarantee lie within
// GuaranteedSpread of each other, from the lowest of their priorities up,
// in their order: a higher priority never gets a lower band. Nomad then
// places inference before training before dev, and preempts only borrowed
// work, which runs MinPriorityGap or more below the lowest band. No band is
// above the priority its queue was written with.
func (p *Policy) Index() {
	p.setBands()
	p.byNamespace = map[string]*Tenant{}
	for _, t := range p.Tenants {
		for _, ns := range t.Namespaces {
			p.byNamespace[ns] = t
		}
	}
}

func (p *Policy) setBands() {
	var distinct []int
	for _, q := range p.Queues {
		if !q.PreemptsWithinGuarantee && !slices.Contains(distinct, q.Priority) {
			distinct = append(distinct, q.Priority)
		}
	}
	slices.Sort(distinct)
	for _, q := range p.Queues {
		q.Band = q.Priority
		if q.PreemptsWithinGuarantee {
			continue
		}
		rank, last := slices.Index(distinct, q.Priority), len(distinct)-1
		if last > 0 {
			q.Band = min(q.Priority, distinct[0]+(GuaranteedSpread*rank+last/2)/last)
		}
	}
}

// TenantOf returns the tenant that owns a namespace, or nil.
func (p *Policy) TenantOf(namespace string) *Tenant { return p.byNamespace[namespace] }

// DefaultQueue is the tenant's first queue.
func (t *Tenant) DefaultQueue() string { return t.Queues[0] }

// Allows reports whether the tenant may submit to queue.
func (t *Tenant) Allows(queue string) bool {
	for _, q := range t.Queues {
		if q == queue {
			return true
		}
	}
	return false
}

// ClassOf returns the GPU class a device name (model) belongs to, or "".
func (p *Policy) ClassOf(model string) string {
	if len(p.Classes) == 0 { // most policies: a usage classifies every model it counts
		return ""
	}
	for _, c := range p.sortedClasses() {
		for _, m := range c.Models {
			if matchModel(m, model) {
				return c.Name
			}
		}
	}
	return ""
}

func (p *Policy) sortedClasses() []*GPUClass {
	out := make([]*GPUClass, 0, len(p.Classes))
	for _, c := range p.Classes {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *GPUClass) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// matchModel compares a class pattern with a device name: exact, or a prefix
// when the pattern ends in "*"; a model's island groups are the model's.
func matchModel(pattern, model string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(model, prefix)
	}
	return pattern == model || pattern == IslandModel(model)
}

// IslandModel is the model of a device group the plugin offers per NVLink
// island ("<model> (island N)", island_groups = true); any other name is
// returned as it is.
func IslandModel(group string) string {
	model, rest, ok := strings.Cut(group, " (island ")
	if !ok || len(rest) < 2 || rest[len(rest)-1] != ')' {
		return group
	}
	for _, c := range rest[:len(rest)-1] {
		if c < '0' || c > '9' {
			return group
		}
	}
	return model
}

// WithExtraLimit is the policy with tenant's limit raised by n GPUs (in
// total and in each class it names): what an approval grants one job.
func (p *Policy) WithExtraLimit(tenant string, n int) *Policy {
	if _, ok := p.Tenants[tenant]; !ok || n <= 0 {
		return p
	}
	return p.withTenants(func(t *Tenant) *Tenant {
		if t.Name != tenant {
			return t
		}
		raised := *t
		raised.Limit = Quota{}
		for class, l := range t.Limit {
			raised.Limit[class] = l + float64(n)
		}
		return &raised
	})
}

// StrictQuotas is the policy as hard quotas: every tenant's limit is its
// guarantee, and nothing is borrowed (what the simulator compares with).
func (p *Policy) StrictQuotas() *Policy {
	out := p.withTenants(func(t *Tenant) *Tenant {
		capped := *t
		capped.Limit = Quota{}
		for class, g := range t.Guaranteed {
			capped.Limit[class] = g
		}
		return &capped
	})
	out.Borrowing.Enabled = false
	return out
}

// withTenants is a copy of the policy with each tenant replaced by change's.
func (p *Policy) withTenants(change func(*Tenant) *Tenant) *Policy {
	out := *p
	out.Tenants = make(map[string]*Tenant, len(p.Tenants))
	for name, t := range p.Tenants {
		out.Tenants[name] = change(t)
	}
	out.byNamespace = make(map[string]*Tenant, len(p.byNamespace))
	for ns, t := range p.byNamespace {
		out.byNamespace[ns] = out.Tenants[t.Name]
	}
	return &out
}

// MayApprove reports whether a caller (its token's name and grants) is one
// of the policy's approvers: an entry names a token, or "role:<name>" /
// "policy:<name>" one of its roles or policies.
func (p *Policy) MayApprove(tokenName string, g Grants) bool {
	for _, a := range p.Approvers {
		kind, name, qualified := strings.Cut(a, ":")
		switch {
		case !qualified && a == tokenName:
			return true
		case qualified && kind == SubmitterRole && slices.Contains(g.Roles, name):
			return true
		case qualified && kind == SubmitterPolicy && slices.Contains(g.Policies, name):
			return true
		}
	}
	return false
}
