package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
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
	// ReclaimPeriod is how often the leader's reclaim passes run: reclaim
	// rules, sub-band moves, promotions, re-pins, and the requeue of a
	// borrowed job Nomad preempted (0: the policy's reclaim_settings
	// period, as the broker runs them).
	ReclaimPeriod time.Duration
	// Samples is the number of points of the chart's time series.
	Samples int
	// NomadModel is how the simulated Nomad picks nodes and victims:
	// ModelNomad (the default) or ModelIdeal.
	NomadModel string
	// Seed seeds the Nomad model's shuffles of nodes.
	Seed uint64
	// StartLatency is how long an allocation holds its GPUs before its
	// task starts: the client receives it, prepares and starts the task
	// (seconds with a mock driver, minutes with an image to pull). A job's
	// run time counts from its task's start.
	StartLatency time.Duration
	// ProportionalAsks: each allocation asks CPU and memory in proportion
	// to its GPUs, so that Nomad's bin-packing on them packs GPUs too. By
	// default each job asks between a quarter and four times that (drawn
	// log-uniform, per job, from Seed), as real jobs do: Nomad then packs
	// GPUs less tightly.
	ProportionalAsks bool
}

// Defaults of Options.
const (
	DefaultPassInterval = 10 * time.Second
	DefaultSamples      = 400
)

// epoch is simulated time zero, for the code that reads wall-clock times.
var epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

type jobState uint8

const (
	stNew      jobState = iota
	stQueued            // in the broker's queue
	stPending           // registered with Nomad, not every allocation placed
	stEvicted           // preempted while borrowed, not yet requeued by the broker
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

	state       jobState
	placed      []*alloc
	startedAt   float64
	progress    float64 // seconds of work done and kept (checkpointed)
	firstStart  float64
	gen         int     // bumped whenever its allocations are stopped
	seq         uint64  // Nomad's registration order
	preemptions int     // times Nomad evicted it
	preemptedAt float64 // the last time
	cpu         float64 // CPU and memory each allocation asks, in GPUs' worth
	watched     *reclaim.Alloc
	// pin are the nodes the broker chose for its allocations, in order
	// (nil: Nomad chooses).
	pin []int
	// nextBand is when its sub-band next changes while it runs borrowed
	// (0: to work out at the next pass).
	nextBand float64
}

// tenant is a tenant's running totals; the integrals are brought up to date
// lazily, whenever what they integrate changes.
type tenant struct {
	name       string
	guaranteed float64
	placed     int         // GPUs its allocations hold
	busyGPUs   int         // of which running jobs use
	waiting    map[int]int // jobs waiting (queued or unplaced), by GPUs in all
	// owing are its queued jobs that run only within its guarantee
	// (queue.Owes), by index, with their submission: its newer work waits
	// behind the oldest.
	owing map[int]float64
	// lists are its queued entries by queue and demand, each in the order
	// queue.Order keeps among them whatever the time: oldest first.
	lists      map[listKey][]queue.Entry
	queued     int
	since      float64
	gpuSeconds float64
	busy, idle float64 // GPU-seconds, for the fair share's decay
	violating  bool
	violation  float64 // seconds below its guarantee with work waiting while others borrow
	// roomless: violating, and no node could make room for the smallest
	// such work even by evicting all its borrowed work; noRoom its seconds.
	roomless bool
	noRoom   float64
}

type run struct {
	o Options
	p *policy.Policy
	// enricher is the broker's (no approvals); deciding is the job it is
	// asked about.
	enricher enrich.Enricher
	deciding *simJob
	jobs     []simJob
	c        *cluster
	tenants  []*tenant
	byName   map[string]int
	now      float64
	events   eventHeap
	nomadQ   *pending
	queued   int // entries in the tenants' queues
	// wholeQueue orders every entry in each pass (the bound's own test).
	wholeQueue bool
	// A pass's runs of candidates, kept between passes; those it set aside;
	// while it walks the lists, what it took out of them and what went back
	// in (applied when it ends).
	runs    []*passRun
	aside   []*passRun
	walking bool
	taken   []takenEntry
	putBack []queue.Entry
	dirty   bool // GPUs were released since the last queue pass
	passAt  float64
	// watched are the running jobs a reclaim rule may decide on: their
	// allocations and GPUs as the reclaim engine reads them, and each one's
	// index in allocs. They are kept as jobs start and stop, since a pass
	// every 30 s must not rebuild them.
	watched  map[*simJob]int
	wAllocs  []reclaim.Alloc
	wGPUs    map[string]reclaim.GPU
	engine   *reclaim.Engine
	rules    []*policy.ReclaimRule
	decayed  usage.Decayed
	seq      uint64
	preempts bool
	ideal    bool       // the idealised Nomad model
	rng      *rand.Rand // the Nomad model's shuffles

	// The broker's placement (nodeAware: nomad-gpu mode): its rooms, the
	// GPUs pinned allocations not placed yet wait for and the job each node
	// is held for, by node; the pinned jobs Nomad has not placed entirely.
	nodeAware   bool
	rooms       []admission.NodeRoom
	waitingOn   []int
	reservedFor []string
	pinned      []*simJob
	// unseen are the nodes given an allocation at an instant the broker's
	// view has not reached: it learns of an allocation once Nomad placed
	// it, after the decisions of the same pass.
	unseen []placedOn
	// evicted are borrowed jobs Nomad preempted that the broker has not
	// seen yet: it requeues them at its next reclaim pass.
	evicted []*simJob

	// The broker's view: GPUs registered jobs hold, by tenant and in all.
	tu       map[string]admission.TenantUsage
	held     policy.Quota
	idle     policy.Quota // capacity less held, by class (nil: to compute)
	capacity policy.Quota
	maxAlloc policy.Quota

	placed, busy                  int // GPUs held, and held by running jobs that use them
	heldByPrio                    map[int]int
	borrowedRunning               map[*simJob]struct{} // running borrowed: subBand moves them
	bands                         bandHeap             // when each of them is due a move: subBand reads only those
	promotable                    map[*simJob]struct{} // those of them a promote_below above 0 may promote
	borrowers                     int                  // tenants holding more than their guarantee
	waitingSizes                  map[int]int
	waitingJobs                   int
	res                           Result
	nextSample                    float64
	sampleEvery                   float64
	firstSubmitted, lastSubmitted float64
}

// Run simulates jobs (in submission order) under o.
func Run(jobs []Job, o Options) (*Result, error) {
	if o.PassInterval <= 0 {
		o.PassInterval = DefaultPassInterval
	}
	if o.ReclaimPeriod <= 0 {
		o.ReclaimPeriod = cmp.Or(o.Policy.ReclaimSettings.Period, policy.DefaultReclaimPeriod)
	}
	if o.Samples <= 0 {
		o.Samples = DefaultSamples
	}
	if GPUs(o.Nodes) == 0 {
		return nil, fmt.Errorf("simulate: the cluster has no GPUs")
	}
	switch o.NomadModel {
	case "":
		o.NomadModel = ModelNomad
	case ModelNomad, ModelIdeal:
	default:
		return nil, fmt.Errorf("simulate: Nomad model %q: want %s or %s", o.NomadModel, ModelNomad, ModelIdeal)
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
		watched: map[*simJob]int{}, wGPUs: map[string]reclaim.GPU{}, engine: reclaim.New(), tu: map[string]admission.TenantUsage{},
		held: policy.Quota{}, capacity: policy.Quota{}, maxAlloc: policy.Quota{}, heldByPrio: map[int]int{}, borrowedRunning: map[*simJob]struct{}{},
		promotable:   map[*simJob]struct{}{},
		waitingSizes: map[int]int{}}
	r.enricher = enrich.Enricher{Preemptions: r.preemptionsOf, Clock: clock.Func(func() time.Time { return r.time(r.now) })}
	r.ideal, r.rng = o.NomadModel == ModelIdeal, rand.New(rand.NewPCG(o.Seed, 0x5eed))
	r.res = Result{Mode: o.Mode, NomadModel: o.NomadModel, Jobs: len(jobs), GPUs: GPUs(o.Nodes), RejectedBy: map[string]int{}, ByTenant: map[string]*Group{}, ByQueue: map[string]*Group{}, BySize: map[string]*Group{}}
	r.preempts = o.Mode != NomadAlone
	r.nodeAware = o.Mode == NomadGPU
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
	asks := rand.New(rand.NewPCG(o.Seed, 0xa5c5))
	for i := range jobs {
		j := &r.jobs[i]
		*j = simJob{Job: &jobs[i], idx: i, tenant: len(r.tenants) - 1, firstStart: -1, cpu: float64(jobs[i].GPUs)}
		if !o.ProportionalAsks {
			j.cpu *= math.Exp((2*asks.Float64() - 1) * 2 * math.Ln2)
		}
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
			CanaryAutoRevert: true, Where: admission.Where{NoPin: j.service}}
		if j.TTL > 0 {
			j.adm.TTL = (time.Duration(j.TTL) * time.Second).String()
		}
	}
	if len(jobs) > 0 {
		r.firstSubmitted, r.lastSubmitted = jobs[0].Submit, jobs[len(jobs)-1].Submit
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
	promotes := r.p.MaxPromoteBelow() > 0
	for {
		t, what := math.Inf(1), ""
		for len(r.events) > 0 && r.events[0].backoffEnds && r.events[0].job.state > stEvicted {
			heap.Pop(&r.events) // it no longer waits: no pass is due, nor time to pass
		}
		if len(r.events) > 0 {
			t, what = r.events[0].t, "event"
		}
		if next < len(r.jobs) && r.jobs[next].Submit < t {
			t, what = r.jobs[next].Submit, "submit"
		}
		if r.dirty && r.queued > 0 && r.passAt < t {
			t, what = r.passAt, "pass"
		}
		if len(r.watched) > 0 || len(r.pinned) > 0 || len(r.evicted) > 0 || len(r.borrowedRunning) > 0 && (promotes || r.p.Borrowing.SubBands) {
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
			if e.backoffEnds {
				r.release() // the broker's idle pass finds it may borrow again
			} else if e.job.gen == e.gen && e.job.state == stRunning {
				r.end(e.job, e.reclaimed)
			}
		case "submit":
			r.submit(&r.jobs[next])
			next++
		case "pass":
			r.pass()
		case "reclaim":
			r.requeueEvicted()
			r.repin()
			r.reclaimPass()
			r.promote()
			r.subBand()
		}
	}
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
		done := j.progress + max(0, r.now-j.startedAt)
		kept := 0.0
		if j.Checkpoint > 0 {
			kept = math.Floor(done/j.Checkpoint) * j.Checkpoint
		}
		lost, j.progress = (done-kept)*float64(j.gpus()), kept
		if !j.Idle {
			r.busy -= j.gpus()
			r.tenants[j.tenant].busyGPUs -= j.gpus()
		}
		r.unwatch(j)
		delete(r.borrowedRunning, j)
		delete(r.promotable, j)
	} else {
		r.wait(j, -1)
		if j.state == stPending && j.pin != nil {
			r.waitOn(j, -1)
		}
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

// end is a job finishing, or stopped by a reclaim rule.
func (r *run) end(j *simJob, reclaimed bool) {
	if reclaimed {
		left := j.Duration - j.progress - max(0, r.now-j.startedAt)
		r.res.Reclaims++
		r.res.ReclaimedGPUHours += math.Max(0, left) * float64(j.gpus()) / 3600
	}
	r.stop(j)
	r.deregister(j)
	j.state = stDone
	r.res.record(r.tenants[j.tenant].name, j.queue, j.gpus(), j.Submit, j.firstStart, r.now, reclaimed, j.Duration)
	if most := r.p.Borrowing.MaxPreemptions; most > 0 && j.preemptions >= most {
		r.res.capped = append(r.res.capped, float32(max(0, j.startedAt-j.preemptedAt)))
	}
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
			if i, ok := r.watched[j]; ok {
				r.wAllocs[i] = *j.watched
				return
			}
			r.watched[j] = len(r.wAllocs)
			r.wAllocs = append(r.wAllocs, *j.watched)
			util := 100.0
			if j.Idle {
				util = 0
			}
			for _, id := range j.watched.GPUs {
				r.wGPUs[id] = reclaim.GPU{Utilization: util, Healthy: true}
			}
			return
		}
	}
}

// unwatch stops following j (it stopped running).
func (r *run) unwatch(j *simJob) {
	i, ok := r.watched[j]
	if !ok {
		return
	}
	delete(r.watched, j)
	for _, id := range j.watched.GPUs {
		delete(r.wGPUs, id)
	}
	last := len(r.wAllocs) - 1
	if i != last {
		r.wAllocs[i] = r.wAllocs[last]
		r.watched[&r.jobs[atoi(r.wAllocs[i].ID[1:])]] = i
	}
	r.wAllocs[last] = reclaim.Alloc{}
	r.wAllocs = r.wAllocs[:last]
}

// reclaimPass applies the idle and lifetime rules to the watched jobs; a
// decision in enforce mode stops its job once its grace has passed.
func (r *run) reclaimPass() {
	for _, d := range r.engine.Pass(r.time(r.now), r.rules, r.wAllocs, r.wGPUs) {
		if d.Mode != policy.ModeEnforce || d.Action == policy.ActionNotify {
			continue
		}
		j := &r.jobs[atoi(d.Allocs[0][1:])] // "a<index>"
		at := math.Max(r.now, d.ActAfter.Sub(epoch).Seconds())
		heap.Push(&r.events, event{t: at, job: j, gen: j.gen, reclaimed: true})
	}
}

func (r *run) time(t float64) time.Time { return epoch.Add(time.Duration(t * float64(time.Second))) }

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
