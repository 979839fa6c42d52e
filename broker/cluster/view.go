// Package cluster keeps the broker's view of the cluster current from Nomad's
// event stream: schedulable GPUs per node and model, and the GPU demand of every
// live job, from which it derives each tenant's usage.
package cluster

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// View is safe for concurrent use. It keeps aggregates up to date as events
// arrive, so that a usage snapshot costs per namespace and model, not per job.
type View struct {
	region     string // the Nomad region it follows, as admission.Where names it ("": the broker's own)
	verify     func(*api.Job) bool
	clock      clock.Clock
	overBudget func(tenant string) string
	owedSince  func(tenant string) time.Time
	allocEvent func(AllocEvent)
	reverted   func(Revert)
	rollbacks  func(Revert)

	decisions jobLocks // one decision at a time per job (LockJob)

	mu       sync.RWMutex
	nodes    nodeSet
	jobs     jobSet
	held     map[string]*byModel // GPUs live jobs hold, by namespace
	total    map[string]int      // GPUs live jobs hold, by model, all namespaces
	reserved reservations        // admitted, maybe not seen in an event yet
	allocs   map[string]Alloc    // allocations holding GPUs, by id
	ended    endedSet
	samples  map[string]Sample // the GPUs' latest telemetry, by device id (the leader's)
	// What running and pending allocations hold (holds), and of it what is
	// beyond their job's demand (excess; all they hold once the job is
	// stopped). The excess counts as used until Nomad stops them: GPUs a
	// stop or scale-down frees are not admitted twice in between.
	holds  holdSet
	excess map[jobKey]map[string]int // in the totals
	// excessBorrowed: the excess was counted as borrowed (its job\'s flag then).
	excessBorrowed map[jobKey]bool
	// stopped are the jobs with the broker's stamp that Nomad stopped, at
	// the stop's JobModifyIndex, until the leader records them
	// (StoppedAdmitted) or the broker registers them again; a listing
	// keeps them (unrecordedStopKept).
	stopped stops
	// placing are the nodes admitted jobs were placed on (placement mode
	// broker) until their allocations show there; heldFor the nodes held
	// for waiting jobs (node id → job key).
	placing placements
	heldFor map[string]string
	// rooms are the nodes as a new job that may run anywhere sees them
	// (nodeRooms), until roomsUntil; nil: to build again.
	rooms      []admission.NodeRoom
	roomsUntil time.Time
	order      []nodeGroup // see nodeSet.order; nil: to sort again
	changed    chan struct{}
	synced     bool         // a full listing has been applied
	status     regionStatus // whether the region is followed, and the jobs dispatched to it

	index        atomic.Uint64 // of the last event or listing applied
	generation   atomic.Uint64 // changes counted by notify
	gpusCameBack atomic.Uint64 // see GPUsCameBack
	nodesGen     atomic.Uint64 // see NodesGeneration
	relisted     atomic.Uint64 // full listings made

	// Derived from nodes under one policy; recomputed when either changes.
	nodesDirty bool
	capPolicy  *policy.Policy
	capacity   policy.Quota
	maxAlloc   policy.Quota
	replicas   map[string]int // replicas per GPU of each shared group, the fewest of any node
}

// NewView returns an empty view. verify tells the broker's own admissions
// (their stamp) from meta anyone could write; nil trusts no stamp.
func NewView(verify func(*api.Job) bool) *View {
	if verify == nil {
		verify = func(*api.Job) bool { return false }
	}
	return &View{verify: verify, clock: clock.Real, nodes: nodeSet{}, jobs: newJobSet(), held: map[string]*byModel{}, total: map[string]int{},
		reserved: newReservations(), allocs: map[string]Alloc{}, ended: newEndedSet(), holds: newHoldSet(),
		excess: map[jobKey]map[string]int{}, excessBorrowed: map[jobKey]bool{},
		stopped: stops{}, placing: placements{}, status: newRegionStatus(), changed: make(chan struct{}, 1), nodesDirty: true}
}

// SetRegion names the region the view follows, when it is not the broker's
// own (set before the view is used): its nodes' rooms carry the name.
func (v *View) SetRegion(name string) { v.region = name }

// SetBudgets has admission see which tenants spent their GPU-hour budget
// (set before the view is used).
func (v *View) SetBudgets(overBudget func(tenant string) string) { v.overBudget = overBudget }

// SetOwed has admission see, by tenant, when its oldest queued job that runs
// only within its guarantee entered the queue (queue.OwedBook; set before
// the view is used).
func (v *View) SetOwed(since func(tenant string) time.Time) { v.owedSince = since }

// SetAllocEvents has the view tell what becomes of the GPU allocations it
// follows in events (set before the view is used).
func (v *View) SetAllocEvents(f func(AllocEvent)) { v.allocEvent = f }

// SetReverts has the view tell each revert Nomad makes on its own (a
// deployment with auto_revert failed), once the events of its batch are
// applied, or the listing that replaced the stream before they came. It is
// set before the view is used.
func (v *View) SetReverts(f func(Revert)) { v.reverted = f }

// SetRollbacks has the view tell, at each listing, every revert Nomad made
// on its own that the listing shows (a failed deployment that rolled back),
// however old. So a broker that was down while one was made, or whose stream
// was replaced by a listing meanwhile, learns of it (set before the view is
// used). What it is told may have been told before.
func (v *View) SetRollbacks(f func(Revert)) { v.rollbacks = f }

// SetClock replaces the clock reservations expire by (tests).
func (v *View) SetClock(c clock.Clock) { v.clock = c }

// Changed is signalled (at most one pending signal) whenever the view changes.
func (v *View) Changed() <-chan struct{} { return v.changed }

func (v *View) notify() {
	v.generation.Add(1)
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// Generation counts the view's changes: equal twice, nothing a decision
// reads changed in between (reservations expiring aside).
func (v *View) Generation() uint64 { return v.generation.Load() }

// Reset replaces the whole view with a full listing, at once: a decision
// never sees it half rebuilt.
func (v *View) Reset(snap Snapshot) {
	v.mu.Lock()
	was, wasJobs := v.nodes, v.jobs.live
	listed := map[jobKey]bool{}
	for _, j := range snap.Jobs {
		if j.ID != nil {
			listed[jobKey{nomadjob.Namespace(j), *j.ID}] = true
		}
	}
	v.nodes, v.jobs, v.held, v.total, v.nodesDirty = nodeSet{}, v.jobs.relisted(func(k jobKey) bool { return listed[k] }), map[string]*byModel{}, map[string]int{}, true
	wasAllocs := v.allocs
	v.allocs = map[string]Alloc{}
	for _, j := range snap.Stable {
		v.observeStable(j)
	}
	v.holds, v.excess = newHoldSet(), map[jobKey]map[string]int{}
	v.excessBorrowed = map[jobKey]bool{}
	v.keepUnrecordedStops(wasJobs, snap)
	v.status.relisting()
	for _, n := range snap.Nodes {
		v.observeNode(n, was[n.ID])
	}
	if len(v.nodes) != len(was) { // a node the listing lacks left (the others were compared)
		v.nodesGen.Add(1)
	}
	for _, j := range snap.Jobs {
		v.observeJob(j)
	}
	for _, d := range snap.Deployments {
		v.observeDeployment(d)
	}
	allocs := make(map[string]*api.Allocation, len(snap.Allocs))
	for _, a := range snap.Allocs {
		v.observeAlloc(a, false)
		allocs[a.ID] = a
	}
	v.ended.unseen(wasAllocs, v.allocs, allocs, v.clock.Now())
	v.synced = true
	v.mu.Unlock()
	v.notify()
	applied := v.index.Load()
	for _, d := range snap.Failed {
		rv, ok := rolledBack(d)
		if !ok {
			continue
		}
		rv.Region = v.region
		if v.rollbacks != nil {
			v.rollbacks(rv)
		}
		// One after the last event applied is a revert the stream would
		// have told: the listing that replaced it tells it instead.
		if applied > 0 && d.ModifyIndex > applied && v.reverted != nil {
			v.reverted(rv)
		}
	}
}

// Synced reports whether a full listing has been applied.
func (v *View) Synced() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.synced
}
