package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Mode is how jobs reach Nomad.
type Mode string

// The modes a simulation compares.
const (
	// NomadAlone registers every job at once at its queue's priority, under
	// Nomad's default scheduler configuration: no preemption of batch or
	// service jobs, no quotas.
	NomadAlone Mode = "nomad-alone"
	// StrictQuotas is the broker with every tenant's limit at its guarantee
	// and no borrowing: hard caps, as Nomad Enterprise's quotas give.
	StrictQuotas Mode = "strict-quotas"
	// NomadGPU is the broker with the policy as written: guarantees,
	// borrowing, preemption, fair share and reclaim.
	NomadGPU Mode = "nomad-gpu"
)

// Modes are the three, in the order reports show them.
var Modes = []Mode{NomadAlone, StrictQuotas, NomadGPU}

// Options say what to simulate.
type Options struct {
	Policy *policy.Policy
	Nodes  []NodeGroup
	Mode   Mode
	// PassInterval: the queue passes that releases set off within it are
	// made once, at its end (the leader's passes coalesce the same way).
	PassInterval time.Duration
	// ReclaimPeriod is how often reclaim rules are applied.
	ReclaimPeriod time.Duration
	// Samples is the number of points of the chart's time series.
	Samples int
}

// Defaults of Options.
const (
	DefaultPassInterval  = 10 * time.Second
	DefaultReclaimPeriod = 5 * time.Minute
	DefaultSamples       = 400
)

// epoch is simulated time zero, for the code that reads wall-clock times.
var epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

type jobState uint8

const (
	stNew      jobState = iota
	stQueued            // in the broker's queue
	stPending           // registered with Nomad, not every allocation placed
	stRunning           // every allocation placed
	stDone              // finished or stopped
	stRejected          // the broker rejected it
)

// simJob is a job's state in one run.
type simJob struct {
	*Job
	idx      int
	tenant   int // index in run.tenants; the last one holds unmapped namespaces
	queue    string
	prio     int
	borrowed bool
	service  bool // an inference workload: Nomad's service scheduler
	adm      admission.Job
	demand   policy.Quota // what the broker counts it holding while registered

	state      jobState
	placed     []*alloc
	startedAt  float64
	progress   float64 // seconds of work done and kept (checkpointed)
	firstStart float64
	gen        int    // bumped whenever its allocations are stopped
	seq        uint64 // Nomad's registration order
	watched    *reclaim.Alloc
}

// tenant is a tenant's running totals; the integrals are brought up to date
// lazily, whenever what they integrate changes.
type tenant struct {
	name       string
	guaranteed float64
	placed     int         // GPUs its allocations hold
	busyGPUs   int         // of which running jobs use
	waiting    map[int]int // jobs waiting (queued or unplaced), by GPUs in all
	// lists are its queued entries by queue and demand, each in the order
	// queue.Order keeps among them whatever the time: oldest first.
	lists      map[listKey][]queue.Entry
	queued     int
	since      float64
	gpuSeconds float64
	busy, idle float64 // GPU-seconds, for the fair share's decay
	violating  bool
	violation  float64 // seconds below its guarantee with work waiting while others borrow
}

type run struct {
	o       Options
	p       *policy.Policy
	jobs    []simJob
	c       *cluster
	tenants []*tenant
	byName  map[string]int
	now     float64
	events  eventHeap
	nomadQ  *pending
	queued  int // entries in the tenants' queues
	// wholeQueue orders every entry in each pass (the bound's own test).
	wholeQueue bool
	// buffer holds a pass's candidates, kept between passes.
	buffer   []queue.Entry
	dirty    bool // GPUs were released since the last queue pass
	passAt   float64
	watched  map[*simJob]struct{}
	engine   *reclaim.Engine
	rules    []*policy.ReclaimRule
	decayed  usage.Decayed
	seq      uint64
	preempts bool

	// The broker's view: GPUs registered jobs hold, by tenant and in all.
	tu       map[string]admission.TenantUsage
	held     policy.Quota
	idle     policy.Quota // capacity less held, by class (nil: to compute)
	capacity policy.Quota
	maxAlloc policy.Quota

	placed, busy  int // GPUs held, and held by running jobs that use them
	heldByPrio    map[int]int
	borrowers     int // tenants holding more than their guarantee
	waitingSizes  map[int]int
	waitingJobs   int
	res           Result
	nextSample    float64
	sampleEvery   float64
	lastSubmitted float64
}

// Run simulates jobs (in submission order) under o.
func Run(jobs []Job, o Options) (*Result, error) {
	if o.PassInterval <= 0 {
		o.PassInterval = DefaultPassInterval
	}
	if o.ReclaimPeriod <= 0 {
		o.ReclaimPeriod = DefaultReclaimPeriod
	}
	if o.Samples <= 0 {
		o.Samples = DefaultSamples
	}
	if GPUs(o.Nodes) == 0 {
		return nil, fmt.Errorf("simulate: the cluster has no GPUs")
	}
	started := time.Now()
	r := newRun(jobs, o)
	if err := r.loop(); err != nil {
		return nil, err
	}
	r.finish(time.Since(started))
	return &r.res, nil
}

func newRun(jobs []Job, o Options) *run {
	p := o.Policy
	if o.Mode == StrictQuotas {
		p = p.StrictQuotas()
	}
	r := &run{o: o, p: p, c: newCluster(o.Nodes), byName: map[string]int{}, nomadQ: newPending(),
		watched: map[*simJob]struct{}{}, engine: reclaim.New(), tu: map[string]admission.TenantUsage{},
		held: policy.Quota{}, capacity: policy.Quota{}, maxAlloc: policy.Quota{}, heldByPrio: map[int]int{},
		waitingSizes: map[int]int{}}
	r.res = Result{Mode: o.Mode, Jobs: len(jobs), GPUs: GPUs(o.Nodes), RejectedBy: map[string]int{}, ByTenant: map[string]*Group{}, ByQueue: map[string]*Group{}}
	r.preempts = o.Mode != NomadAlone
	for _, name := range sortedKeys(p.Tenants) {
		t := p.Tenants[name]
		r.byName[name] = len(r.tenants)
		r.tenants = append(r.tenants, &tenant{name: name, guaranteed: t.Guaranteed.Total(), waiting: map[int]int{}, lists: map[listKey][]queue.Entry{}})
		r.tu[name] = admission.TenantUsage{Used: policy.Quota{}, Borrowed: policy.Quota{}}
	}
	r.tenants = append(r.tenants, &tenant{name: "(no tenant)", waiting: map[int]int{}, lists: map[listKey][]queue.Entry{}})
	for _, g := range o.Nodes {
		classes := []string{policy.AllGPUs}
		if c := p.ClassOf(g.Model); c != "" {
			classes = append(classes, c)
		}
		for _, class := range classes {
			r.capacity[class] += float64(g.GPUs * g.Count)
			r.maxAlloc[class] = max(r.maxAlloc[class], float64(g.GPUs))
		}
	}
	if o.Mode == NomadGPU {
		for _, rule := range p.ReclaimRules() {
			// The simulated GPUs never fail, crash or run unadmitted work:
			// only the idle and lifetime rules can apply.
			if rule.Condition == policy.CondIdle || rule.Condition == policy.CondLifetime {
				r.rules = append(r.rules, rule)
			}
		}
	}
	r.jobs = make([]simJob, len(jobs))
	for i := range jobs {
		j := &r.jobs[i]
		*j = simJob{Job: &jobs[i], idx: i, tenant: len(r.tenants) - 1, firstStart: -1}
		ns := j.Namespace
		t := p.TenantOf(ns)
		if t == nil && j.Tenant != "" {
			if t = p.Tenants[j.Tenant]; t != nil {
				ns = t.Namespaces[0]
			}
		}
		j.queue = j.Queue
		if t != nil {
			j.tenant = r.byName[t.Name]
			if j.queue == "" {
				j.queue = t.DefaultQueue()
			}
		}
		// Inference is a service, everything else a batch job (Nomad's
		// preemption is switched on per scheduler).
		w := p.WorkloadFor(ns, j.queue)
		j.service = w != nil && w.RequireUpdate || strings.Contains(workloadKind(p, ns, j.queue), "inference")
		j.adm = admission.Job{ID: j.ID, Namespace: ns, Queue: j.Queue,
			Groups:           []admission.Group{{Name: "g", Count: j.allocs(), GPUsPerAlloc: j.GPUs, Model: j.Model}},
			CanaryAutoRevert: true}
		if j.TTL > 0 {
			j.adm.TTL = (time.Duration(j.TTL) * time.Second).String()
		}
	}
	if len(jobs) > 0 {
		r.lastSubmitted = jobs[len(jobs)-1].Submit
	}
	r.sampleEvery = math.Max(r.lastSubmitted, 3600) / float64(o.Samples)
	return r
}

// loop processes events in time order: allocations that finish or are
// stopped, then submissions, then the queue pass, then reclaim.
func (r *run) loop() error {
	next := 0
	reclaimAt := 0.0
	period := r.o.ReclaimPeriod.Seconds()
	for {
		t, what := math.Inf(1), ""
		if len(r.events) > 0 {
			t, what = r.events[0].t, "event"
		}
		if next < len(r.jobs) && r.jobs[next].Submit < t {
			t, what = r.jobs[next].Submit, "submit"
		}
		if r.dirty && r.queued > 0 && r.passAt < t {
			t, what = r.passAt, "pass"
		}
		if len(r.watched) > 0 {
			if reclaimAt <= r.now {
				reclaimAt = (math.Floor(r.now/period) + 1) * period
			}
			if reclaimAt < t {
				t, what = reclaimAt, "reclaim"
			}
		}
		if what == "" {
			return nil
		}
		r.advance(t)
		switch what {
		case "event":
			e := heap.Pop(&r.events).(event)
			if e.job.gen == e.gen && e.job.state == stRunning {
				r.end(e.job, e.reclaimed)
			}
		case "submit":
			r.submit(&r.jobs[next])
			next++
		case "pass":
			r.pass()
		case "reclaim":
			r.reclaimPass()
		}
	}
}

// submit is a job arriving: through the broker's admission, or straight to
// Nomad.
func (r *run) submit(j *simJob) {
	if r.o.Mode == NomadAlone {
		j.prio = 50 // Nomad's default, for a namespace no tenant owns
		if q, ok := r.p.Queues[j.queue]; ok {
			j.prio = q.Priority
		}
		r.register(j)
		r.place()
		return
	}
	d := admission.Decide(r.p, j.adm, r.usage(j))
	switch d.Outcome {
	case admission.Reject:
		j.state = stRejected
		r.res.Rejected++
		r.res.RejectedBy[d.Rule]++
	case admission.Queue:
		r.enqueue(j, d)
	default:
		r.admit(j, d)
		r.place()
	}
}

func (r *run) enqueue(j *simJob, d admission.Decision) {
	if r.tenants[j.tenant].queued >= r.p.Tenants[d.Tenant].MaxQueued {
		r.res.AboveMaxQueued++ // a real broker refuses it: replayed as queued all the same
	}
	r.requeue(j, d.Queue, d.Demand.Total())
}

// requeue puts j in its tenant's queue, as first submitted.
func (r *run) requeue(j *simJob, queueName string, demand float64) {
	t := r.tenants[j.tenant]
	j.state = stQueued
	e := queue.Entry{ID: strconv.Itoa(j.idx), JobID: j.ID, Namespace: j.adm.Namespace, Tenant: t.name,
		Queue: queueName, Demand: demand, SubmittedAt: r.time(j.Submit)}
	k := listKey{queueName, demand}
	l := t.lists[k]
	i, _ := slices.BinarySearchFunc(l, e, olderFirst)
	t.lists[k] = slices.Insert(l, i, e)
	t.queued++
	r.queued++
	r.wait(j, 1)
}

// listKey is one of a tenant's queue lists.
type listKey struct {
	queue  string
	demand float64
}

// olderFirst is queue.Order among entries of one tenant and queue: the
// older first (aging only raises it further), then by id.
func olderFirst(a, b queue.Entry) int {
	if c := a.SubmittedAt.Compare(b.SubmittedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// candidates are the entries that can make a difference to a pass. A tenant
// takes at most room GPUs in one (its limit, and with quotas in all GPUs,
// its guarantee plus the idle GPUs); usage only grows during a pass, so once
// an entry of a list (one tenant, queue and demand d) is not admitted, none
// after it is: of each list, the first room/d+1 decide. A list its limit
// holds back entirely is left out.
func (r *run) candidates(used map[string]float64) []queue.Entry {
	out := r.buffer[:0]
	idle := math.Max(0, r.capacity[policy.AllGPUs]-r.held[policy.AllGPUs])
	for _, t := range r.tenants {
		if t.queued == 0 {
			continue
		}
		pt := r.p.Tenants[t.name]
		limit, total := pt.Limit[policy.AllGPUs]
		guaranteed, gTotal := pt.Guaranteed[policy.AllGPUs]
		bounded := total && gTotal && len(pt.Limit) == 1 && len(pt.Guaranteed) == 1
		limitRoom := limit - used[t.name]
		room := math.Max(0, guaranteed-used[t.name])
		if r.p.Borrowing.Enabled {
			room += idle
		}
		room = math.Min(room, limitRoom)
		for _, k := range sortedLists(t.lists) {
			l := t.lists[k]
			switch {
			case total && k.demand > limitRoom+1e-9:
				continue
			case bounded && !r.wholeQueue:
				l = l[:min(len(l), int(room/k.demand+1e-9)+1)]
			}
			out = append(out, l...)
		}
	}
	r.buffer = out
	return out
}

func sortedLists(m map[listKey][]queue.Entry) []listKey {
	keys := make([]listKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b listKey) int {
		if c := strings.Compare(a.queue, b.queue); c != 0 {
			return c
		}
		return cmp.Compare(a.demand, b.demand)
	})
	return keys
}

// admit registers a job the broker admitted, at the decision's band.
func (r *run) admit(j *simJob, d admission.Decision) {
	j.prio, j.borrowed, j.demand = d.Priority, d.Outcome == admission.AdmitBorrowed, d.Demand
	tu := r.tu[d.Tenant]
	for class, n := range d.Demand {
		tu.Used[class] += n
		r.held[class] += n
		r.idle = nil
		if j.borrowed {
			tu.Borrowed[class] += n
		}
	}
	r.register(j)
}

// register hands a job to Nomad: its allocations wait to be placed (place
// places them).
func (r *run) register(j *simJob) {
	if j.state != stQueued {
		r.wait(j, 1)
	}
	j.state = stPending
	r.seq++
	j.seq = r.seq
	r.nomadQ.push(j, j.allocs()-len(j.placed))
}

// deregister takes a job out of the broker's counts.
func (r *run) deregister(j *simJob) {
	if j.demand == nil {
		return
	}
	tu := r.tu[r.tenants[j.tenant].name]
	for class, n := range j.demand {
		tu.Used[class] -= n
		r.held[class] -= n
		r.idle = nil
		if j.borrowed {
			tu.Borrowed[class] -= n
		}
	}
	j.demand = nil
}

// usage is the broker's snapshot for deciding on j.
func (r *run) usage(j *simJob) admission.Usage {
	if r.idle == nil {
		r.idle = policy.Quota{}
		for class, n := range r.capacity {
			r.idle[class] = math.Max(0, n-r.held[class])
		}
	}
	u := admission.Usage{Tenants: r.tu, Idle: r.idle, MaxAlloc: r.maxAlloc}
	if w := r.p.WorkloadFor(j.adm.Namespace, j.queue); w != nil && w.Gang && j.allocs() > 1 {
		u.Nodes = make([]admission.NodeRoom, len(r.c.nodes))
		for i, n := range r.c.nodes {
			u.Nodes[i].Free = n.free
			for _, a := range n.allocs {
				if a.job.borrowed {
					u.Nodes[i].Borrowed += a.gpus
				}
			}
		}
	}
	return u
}

// pass admits from the queue as the leader does (admitter.Pass): in
// queue.Order, by queue.Pass's rule.
func (r *run) pass() {
	r.dirty = false
	p := r.p
	var decayed map[string]float64
	if p.FairShare.Enabled {
		charged := map[usage.Key]usage.Seconds{}
		for _, t := range r.tenants[:len(r.tenants)-1] {
			r.touch(t)
			charged[usage.Key{Tenant: t.name}] = usage.Seconds{Busy: t.busy, Idle: t.idle}
			t.busy, t.idle = 0, 0
		}
		r.decayed.Add(r.time(r.now), p.FairShare.HalfLife, p.FairShare.IdleWeight, map[string]map[usage.Key]usage.Seconds{"": charged})
		decayed = r.decayed.As(r.time(r.now), p.FairShare.HalfLife)
	}
	used := make(map[string]float64, len(r.tu))
	for name, tu := range r.tu {
		used[name] = tu.Used.Total()
	}
	candidates := r.candidates(used)
	queue.Order(candidates, p, used, decayed, r.time(r.now))
	// By tenant, the least demand its limit held back (for jobs of a model,
	// by tenant and model).
	limited := make([]float64, len(r.tenants))
	for i := range limited {
		limited[i] = math.Inf(1)
	}
	limitedModel := map[[2]string]float64{}
	var pass queue.Pass
	for _, e := range candidates {
		j := &r.jobs[atoi(e.ID)]
		if e.Demand >= limited[j.tenant] {
			continue
		}
		if l, ok := limitedModel[[2]string{e.Tenant, j.Model}]; ok && j.Model != "" && e.Demand >= l {
			continue
		}
		if pass.HoldsBackBorrowers() && beyond(p.Tenants[e.Tenant], r.tu[e.Tenant].Used, e.Demand) {
			continue // only an admission within its guarantee could follow, and it is beyond it
		}
		d := admission.Decide(p, j.adm, r.usage(j))
		if !pass.Admits(d) {
			if d.Outcome != admission.Queue || d.WaitsFor == admission.WaitCapacity {
				continue
			}
			if j.Model != "" {
				limitedModel[[2]string{e.Tenant, j.Model}] = e.Demand
				continue
			}
			limited[j.tenant] = e.Demand
			continue
		}
		r.unqueue(j.tenant, e)
		if d.Outcome == admission.Reject {
			j.state = stRejected
			r.wait(j, -1)
			r.res.Rejected++
			r.res.RejectedBy[d.Rule]++
			continue
		}
		r.admit(j, d)
		r.place()
	}
}

// unqueue takes an entry out of its tenant's queue (a job the pass took
// out may be back by the end of it, preempted by a later admission).
func (r *run) unqueue(tenant int, e queue.Entry) {
	t := r.tenants[tenant]
	k := listKey{e.Queue, e.Demand}
	l := t.lists[k]
	i := slices.IndexFunc(l, func(o queue.Entry) bool { return o.ID == e.ID })
	if l = slices.Delete(l, i, i+1); len(l) == 0 {
		delete(t.lists, k)
	} else {
		t.lists[k] = l
	}
	t.queued--
	r.queued--
}

// place puts waiting allocations on nodes as Nomad's scheduler does: in
// priority order, the oldest first within a priority, each wherever it fits
// (no head-of-line blocking), then by preemption where the job may preempt.
func (r *run) place() {
	for {
		if u, node := r.nomadQ.next(r.c); u != nil {
			r.start(u, node)
			continue
		}
		if !r.preempts || !r.preemptOne() {
			return
		}
	}
}

// preemptOne places the first waiting allocation that can preempt its way
// onto a node; false if none can.
func (r *run) preemptOne() bool {
	for _, b := range r.nomadQ.buckets {
		j := b.peek()
		if j == nil || !r.mayPreempt(j) || r.preemptible(b.prio) < b.size {
			continue
		}
		victims, node := r.c.victims(b.model, b.size, b.prio, policy.MinPriorityGap)
		if node < 0 {
			continue
		}
		seen := map[*simJob]bool{}
		for _, a := range victims {
			if !seen[a.job] {
				seen[a.job] = true
				r.preempt(a.job)
			}
		}
		r.start(b.pop(), node)
		return true
	}
	return false
}

func (r *run) mayPreempt(j *simJob) bool {
	if j.service {
		return r.p.Preemption.Service
	}
	return r.p.Preemption.Batch
}

// preemptible is the GPUs held at priorities at least MinPriorityGap below prio.
func (r *run) preemptible(prio int) int {
	n := 0
	for p, gpus := range r.heldByPrio {
		if p <= prio-policy.MinPriorityGap {
			n += gpus
		}
	}
	return n
}

// start places one allocation of j on node; the job runs once all are placed.
func (r *run) start(j *simJob, node int) {
	a := &alloc{job: j, node: node, gpus: j.GPUs, prio: j.prio}
	r.c.place(a)
	j.placed = append(j.placed, a)
	r.hold(j, a.gpus)
	if len(j.placed) < j.allocs() {
		return
	}
	j.state, j.startedAt = stRunning, r.now
	if j.firstStart < 0 {
		j.firstStart = r.now
		r.res.Started++
	}
	r.wait(j, -1)
	if !j.Idle {
		r.busy += j.gpus()
		r.tenants[j.tenant].busyGPUs += j.gpus()
	}
	heap.Push(&r.events, event{t: r.now + j.Duration - j.progress, job: j, gen: j.gen})
	r.watch(j)
}

// hold counts gpus placed for j (negative: released).
func (r *run) hold(j *simJob, gpus int) {
	t := r.tenants[j.tenant]
	r.touch(t)
	before := t.placed > int(t.guaranteed)
	t.placed += gpus
	r.placed += gpus
	r.heldByPrio[j.prio] += gpus
	if after := t.placed > int(t.guaranteed); after != before {
		if after {
			r.borrowers++
		} else {
			r.borrowers--
		}
		if r.borrowers == 0 || r.borrowers == 1 && after {
			for _, o := range r.tenants {
				r.touch(o)
			}
		}
	}
	r.touch(t)
}

// stop releases j's allocations; the work since its last checkpoint is lost.
func (r *run) stop(j *simJob) (lost float64) {
	r.touch(r.tenants[j.tenant])
	if j.state == stRunning {
		done := j.progress + r.now - j.startedAt
		kept := 0.0
		if j.Checkpoint > 0 {
			kept = math.Floor(done/j.Checkpoint) * j.Checkpoint
		}
		lost, j.progress = (done-kept)*float64(j.gpus()), kept
		if !j.Idle {
			r.busy -= j.gpus()
			r.tenants[j.tenant].busyGPUs -= j.gpus()
		}
		delete(r.watched, j)
	} else {
		r.wait(j, -1)
	}
	for _, a := range j.placed {
		r.c.remove(a)
		r.hold(j, -a.gpus)
	}
	j.placed = j.placed[:0]
	j.gen++
	r.release()
	return lost
}

// preempt is Nomad evicting j for higher priority work. A borrowed job goes
// back to the broker's queue (the built-in rule); any other is rescheduled
// by Nomad.
func (r *run) preempt(j *simJob) {
	r.res.Preemptions++
	r.res.LostGPUHours += r.stop(j) / 3600
	if j.borrowed && r.o.Mode != NomadAlone {
		r.deregister(j)
		r.requeue(j, j.queue, float64(j.gpus()))
		return
	}
	j.state = stNew
	r.register(j)
}

// end is a job finishing, or stopped by a reclaim rule.
func (r *run) end(j *simJob, reclaimed bool) {
	if reclaimed {
		left := j.Duration - j.progress - (r.now - j.startedAt)
		r.res.Reclaims++
		r.res.ReclaimedGPUHours += math.Max(0, left) * float64(j.gpus()) / 3600
	}
	r.stop(j)
	r.deregister(j)
	j.state = stDone
	r.res.record(r.tenants[j.tenant].name, j.queue, j.Submit, j.firstStart, r.now)
	r.place()
}

// release notes GPUs freed: the next queue pass is due at the end of the
// pass interval.
func (r *run) release() {
	if !r.dirty {
		iv := r.o.PassInterval.Seconds()
		r.dirty, r.passAt = true, (math.Floor(r.now/iv)+1)*iv
	}
}

// wait counts j among the waiting jobs (delta 1) or no longer (-1).
func (r *run) wait(j *simJob, delta int) {
	t := r.tenants[j.tenant]
	r.touch(t)
	if t.waiting[j.gpus()] += delta; t.waiting[j.gpus()] == 0 {
		delete(t.waiting, j.gpus())
	}
	if r.waitingSizes[j.GPUs] += delta; r.waitingSizes[j.GPUs] == 0 {
		delete(r.waitingSizes, j.GPUs)
	}
	r.waitingJobs += delta
	r.touch(t)
}

// watch follows a running job that a reclaim rule may decide on.
func (r *run) watch(j *simJob) {
	if len(r.rules) == 0 {
		return
	}
	if j.watched == nil {
		id := "a" + strconv.Itoa(j.idx)
		gpus := make([]string, j.gpus())
		for i := range gpus {
			gpus[i] = id + "-" + strconv.Itoa(i)
		}
		t := r.tenants[j.tenant].name
		w := r.p.WorkloadFor(j.adm.Namespace, j.queue)
		a := &reclaim.Alloc{ID: id, Namespace: j.adm.Namespace, JobID: j.ID, Group: "g", Admitted: true,
			Tenant: t, Queue: j.queue, GPUs: gpus, TTL: time.Duration(j.TTL) * time.Second}
		if w != nil {
			a.Workload = w.Name
		}
		j.watched = a
	}
	j.watched.StartedAt, j.watched.Borrowed = r.time(r.now), j.borrowed
	for _, rule := range r.rules {
		if reclaim.Selects(rule, *j.watched) {
			r.watched[j] = struct{}{}
			return
		}
	}
}

// reclaimPass applies the idle and lifetime rules to the watched jobs; a
// decision in enforce mode stops its job once its grace has passed.
func (r *run) reclaimPass() {
	allocs := make([]reclaim.Alloc, 0, len(r.watched))
	gpus := map[string]reclaim.GPU{}
	byID := make(map[string]*simJob, len(r.watched))
	for j := range r.watched {
		allocs = append(allocs, *j.watched)
		byID[j.watched.ID] = j
		util := 100.0
		if j.Idle {
			util = 0
		}
		for _, id := range j.watched.GPUs {
			gpus[id] = reclaim.GPU{Utilization: util, Healthy: true}
		}
	}
	for _, d := range r.engine.Pass(r.time(r.now), r.rules, allocs, gpus) {
		if d.Mode != policy.ModeEnforce || d.Action == policy.ActionNotify {
			continue
		}
		j := byID[d.Allocs[0]]
		at := math.Max(r.now, d.ActAfter.Sub(epoch).Seconds())
		heap.Push(&r.events, event{t: at, job: j, gen: j.gen, reclaimed: true})
	}
}

func (r *run) time(t float64) time.Time { return epoch.Add(time.Duration(t * float64(time.Second))) }

// beyond reports whether demand more GPUs take a tenant whose quotas count
// all GPUs beyond its guarantee (false when its quotas are per class).
func beyond(t *policy.Tenant, used policy.Quota, demand float64) bool {
	g, ok := t.Guaranteed[policy.AllGPUs]
	return ok && len(t.Guaranteed) == 1 && used[policy.AllGPUs]+demand > g+1e-9
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
