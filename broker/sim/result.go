package sim

import (
	"math"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Result is what one mode did with the workload.
type Result struct {
	Mode Mode `json:"mode"`
	// Label names the run where modes alone do not (simulate -compare:
	// the policy directory and the mode); "" otherwise.
	Label string `json:"label,omitempty"`
	// NomadModel is the simulated Nomad's: ModelNomad or ModelIdeal.
	NomadModel string `json:"nomad_model"`
	Jobs       int    `json:"jobs"`
	GPUs       int    `json:"gpus"`
	// Started ran at least once; Finished ran to the end (or were stopped by
	// a reclaim rule); Rejected were refused by the broker; NeverStarted
	// still waited when nothing more could change.
	Started      int            `json:"started"`
	Finished     int            `json:"finished"`
	Rejected     int            `json:"rejected"`
	RejectedBy   map[string]int `json:"rejected_by,omitempty"`
	NeverStarted int            `json:"never_started"`
	// AboveMaxQueued counts jobs queued beyond their tenant's max_queued:
	// a real broker refuses those; the replay queues them all the same.
	AboveMaxQueued int `json:"above_max_queued"`
	// Span is the simulated seconds until the last job ended.
	Span float64 `json:"span_seconds"`
	// Allocation and Busy are the shares of GPU time allocated, and
	// allocated to running jobs that use their GPUs. Each is taken three
	// ways:
	//   - while work arrives (from the first submission to the last: the
	//     load offered);
	//   - over the whole span (which the longest job stretches: every mode
	//     drains alike);
	//   - while work waits (queued in the broker or unplaced in Nomad).
	Allocation        float64 `json:"allocation"`
	Busy              float64 `json:"busy"`
	AllocationSpan    float64 `json:"allocation_whole_span"`
	BusySpan          float64 `json:"busy_whole_span"`
	AllocationWaiting float64 `json:"allocation_while_waiting"`
	BusyWaiting       float64 `json:"busy_while_waiting"`
	WaitingShare      float64 `json:"waiting_share"` // of the span, the time work waits
	Wait              Stats   `json:"wait"`          // submission to first start, seconds
	// WaitGPUWeighted is the mean wait weighted by each job's GPUs: what a
	// GPU asked for waits on average, large jobs counting as they weigh.
	WaitGPUWeighted float64 `json:"wait_gpu_weighted_mean"`
	JCT             Stats   `json:"jct"` // submission to end of jobs that completed (not stopped by reclaim), seconds
	// Delay is, over the jobs that completed, every second one spent not
	// running after its submission, the work it lost counted in: its end
	// less its submission less its run time. Wait stops at the first
	// start; a job evicted and queued again waits on past it. Nomad alone
	// and strict quotas evict nothing: their delay is their wait.
	Delay            Stats   `json:"delay"`
	DelayGPUWeighted float64 `json:"delay_gpu_weighted_mean"`
	// Capped counts the jobs evicted borrowing.max_preemptions times, which
	// then run only within their tenant's guarantee; CappedWait is their
	// wait from the last eviction to their last start.
	Capped     int   `json:"capped_jobs"`
	CappedWait Stats `json:"capped_wait_after_last_eviction"`
	// ViolationHours: hours a tenant below its guarantee has waiting work
	// that fits under it while another tenant holds more than its own
	// guarantee, summed over tenants; ViolationShare is that over the
	// span times the tenants with a guarantee.
	ViolationHours float64 `json:"guarantee_violation_hours"`
	ViolationShare float64 `json:"guarantee_violation_share"`
	// NoRoomHours are the hours of ViolationHours in which no node could
	// have made room for the tenant's smallest such job even by evicting
	// every borrowed allocation on it. Neither a held node nor borrowed work
	// moved can shorten those hours, only guaranteed work placed otherwise. The
	// nodes are read when the tenant's waiting or placed work changes.
	NoRoomHours float64 `json:"guarantee_violation_no_room_hours"`
	// Jain is Jain's fairness index over tenants' GPU-hours per guaranteed GPU.
	Jain         float64 `json:"jain_fairness"`
	Preemptions  int     `json:"preemptions"`
	LostGPUHours float64 `json:"gpu_hours_lost_to_preemption"`
	// GuaranteedVictims counts preemptions of work that was not borrowed
	// (admitted within a guarantee, or, Nomad alone, any): what a tenant
	// is owed, taken for another's.
	GuaranteedVictims int `json:"guaranteed_victims"`
	// PreemptionsPerJob is over every job: how often one was evicted.
	PreemptionsPerJob Percentiles `json:"preemptions_per_job"`
	// BusyGPUHours are the GPU-hours running jobs used; WastedGPUHours the
	// GPU-hours lost to preemption and held idle.
	BusyGPUHours   float64 `json:"busy_gpu_hours"`
	WastedGPUHours float64 `json:"gpu_hours_wasted"`
	Reclaims       int     `json:"reclaims"`
	// Promotions: borrowed jobs run on within their tenant's guarantee
	// (borrowing.promote_below).
	Promotions int `json:"promotions"`
	// Repins: pinned jobs their nodes blocked, pinned again by the broker
	// (placement mode broker).
	Repins int `json:"repins"`
	// Reserved sums, over the queue passes, the nodes held for a waiting
	// job (placement.reserve_after): node-passes.
	Reserved int `json:"reserved_node_passes"`
	// SubBandMoves: running borrowed jobs moved to another sub-band
	// (borrowing.sub_bands).
	SubBandMoves      int     `json:"sub_band_moves"`
	ReclaimedGPUHours float64 `json:"gpu_hours_reclaimed"`
	// Fragmentation is, while work waits, the share of the cluster's GPUs
	// free on nodes too full for the smallest waiting allocation.
	Fragmentation float64           `json:"fragmentation"`
	Wall          time.Duration     `json:"wall_ns"`
	JobsPerSecond float64           `json:"simulated_jobs_per_second"`
	ByTenant      map[string]*Group `json:"by_tenant"`
	ByQueue       map[string]*Group `json:"by_queue"`
	// BySize is by a job's GPUs (all its allocations): "1", "2", "3-4",
	// "5-8", "9-16", "17+".
	BySize  map[string]*Group `json:"by_size"`
	Samples []Sample          `json:"samples"`

	waits, jcts      []float32
	delays, capped   []float32
	delayGPUSeconds  float64    // Σ delay × GPUs, over the jobs completed
	delayGPUs        float64    // Σ GPUs, over the jobs completed
	waitGPUSeconds   float64    // Σ wait × GPUs, over the jobs recorded
	waitGPUs         float64    // Σ GPUs
	allocated, busy  float64    // GPU-seconds
	arriving         [2]float64 // GPU-seconds allocated and busy while work arrives
	waitingSeconds   float64
	allocatedWaiting float64
	busyWaiting      float64
	strandedWaiting  float64
}

// Percentiles of a count.
type Percentiles struct {
	P50 int `json:"p50"`
	P99 int `json:"p99"`
	Max int `json:"max"`
}

// Stats are a mean, 95th percentile and maximum, in seconds.
type Stats struct {
	Mean float64 `json:"mean"`
	P95  float64 `json:"p95"`
	Max  float64 `json:"max"`
}

// Group is a tenant's or queue's share of the result.
type Group struct {
	Jobs           int     `json:"jobs"`
	GPUHours       float64 `json:"gpu_hours,omitempty"`
	Wait           Stats   `json:"wait"`
	Delay          Stats   `json:"delay"` // of its jobs that completed
	ViolationHours float64 `json:"guarantee_violation_hours,omitempty"`
	waits, delays  []float32
}

// Sample is the cluster at one time, for the chart.
type Sample struct {
	T          float64 `json:"t"`
	Allocation float64 `json:"allocation"`
	Busy       float64 `json:"busy"`
	Queued     int     `json:"queued"`  // in the broker's queue
	Waiting    int     `json:"waiting"` // queued or unplaced in Nomad
}

// record counts a job that ended: completed, or stopped by a reclaim rule
// (its completion time is not one).
func (res *Result) record(tenant, queue string, gpus int, submit, start, end float64, reclaimed bool, ran float64) {
	res.Finished++
	wait := float32(start - submit)
	res.waits = append(res.waits, wait)
	res.waitGPUSeconds += float64(wait) * float64(gpus)
	res.waitGPUs += float64(gpus)
	delay := float32(max(0, end-submit-ran))
	if !reclaimed {
		res.jcts = append(res.jcts, float32(end-submit))
		res.delays = append(res.delays, delay)
		res.delayGPUSeconds += float64(delay) * float64(gpus)
		res.delayGPUs += float64(gpus)
	}
	for _, g := range []*Group{res.group(res.ByTenant, tenant), res.group(res.ByQueue, queue), res.group(res.BySize, sizeGroup(gpus))} {
		g.Jobs++
		g.waits = append(g.waits, wait)
		if !reclaimed {
			g.delays = append(g.delays, delay)
		}
	}
}

// sizeGroup is the BySize key of a job of gpus GPUs.
func sizeGroup(gpus int) string {
	switch {
	case gpus <= 2:
		return strconv.Itoa(gpus)
	case gpus <= 4:
		return "3-4"
	case gpus <= 8:
		return "5-8"
	case gpus <= 16:
		return "9-16"
	}
	return "17+"
}

// SizeGroups are BySize's keys, smallest first.
var SizeGroups = []string{"1", "2", "3-4", "5-8", "9-16", "17+"}

func (res *Result) group(m map[string]*Group, name string) *Group {
	g, ok := m[name]
	if !ok {
		g = &Group{}
		m[name] = g
	}
	return g
}

// advance integrates the cluster's state up to t.
func (r *run) advance(t float64) {
	dt := t - r.now
	if dt <= 0 {
		return
	}
	res := &r.res
	for r.nextSample <= t {
		res.Samples = append(res.Samples, Sample{T: r.nextSample, Allocation: float64(r.placed) / float64(res.GPUs),
			Busy: float64(r.busy) / float64(res.GPUs), Queued: r.queued, Waiting: r.waitingJobs})
		r.nextSample += r.sampleEvery
	}
	res.allocated += float64(r.placed) * dt
	res.busy += float64(r.busy) * dt
	if in := min(t, r.lastSubmitted) - max(r.now, r.firstSubmitted); in > 0 {
		res.arriving[0] += float64(r.placed) * in
		res.arriving[1] += float64(r.busy) * in
	}
	if r.waitingJobs > 0 {
		smallest := math.MaxInt
		for size := range r.waitingSizes {
			smallest = min(smallest, size)
		}
		res.waitingSeconds += dt
		res.allocatedWaiting += float64(r.placed) * dt
		res.busyWaiting += float64(r.busy) * dt
		res.strandedWaiting += float64(r.c.stranded(smallest)) * dt
	}
	r.now = t
}

// touch brings a tenant's integrals up to now, then recomputes whether it
// is kept from its guarantee.
func (r *run) touch(t *tenant) {
	if dt := r.now - t.since; dt > 0 {
		t.gpuSeconds += float64(t.placed) * dt
		t.busy += float64(t.busyGPUs) * dt
		t.idle += float64(t.placed-t.busyGPUs) * dt
		if t.violating {
			t.violation += dt
		}
		if t.roomless {
			t.noRoom += dt
		}
		t.since = r.now
	}
	t.violating, t.roomless = false, false
	if r.borrowers == 0 || t.guaranteed == 0 {
		return
	}
	smallest := math.MaxInt
	for size := range t.waiting {
		if float64(t.placed+size) <= t.guaranteed {
			t.violating, smallest = true, min(smallest, size)
		}
	}
	t.roomless = t.violating && r.c.mostRoom() < smallest
}

// finish computes the figures once nothing more happens.
func (r *run) finish(wall time.Duration) {
	res := &r.res
	for _, t := range r.tenants {
		r.touch(t)
	}
	res.Span = r.now
	res.NeverStarted = res.Jobs - res.Started - res.Rejected
	res.Wall = wall
	if wall > 0 {
		res.JobsPerSecond = float64(res.Jobs) / wall.Seconds()
	}
	gpuTime := float64(res.GPUs) * res.Span
	if gpuTime > 0 {
		res.AllocationSpan, res.BusySpan = res.allocated/gpuTime, res.busy/gpuTime
		res.Allocation, res.Busy = res.AllocationSpan, res.BusySpan
		res.WaitingShare = res.waitingSeconds / res.Span
	}
	if window := float64(res.GPUs) * (r.lastSubmitted - r.firstSubmitted); window > 0 {
		res.Allocation, res.Busy = res.arriving[0]/window, res.arriving[1]/window
	}
	if res.waitingSeconds > 0 {
		w := float64(res.GPUs) * res.waitingSeconds
		res.AllocationWaiting, res.BusyWaiting = res.allocatedWaiting/w, res.busyWaiting/w
		res.Fragmentation = res.strandedWaiting / w
	}
	res.Wait, res.JCT, res.Delay, res.CappedWait = stats(res.waits), stats(res.jcts), stats(res.delays), stats(res.capped)
	res.Capped = len(res.capped)
	if res.waitGPUs > 0 {
		res.WaitGPUWeighted = res.waitGPUSeconds / res.waitGPUs
	}
	if res.delayGPUs > 0 {
		res.DelayGPUWeighted = res.delayGPUSeconds / res.delayGPUs
	}
	res.BusyGPUHours = res.busy / 3600
	res.WastedGPUHours = res.LostGPUHours + (res.allocated-res.busy)/3600
	counts := make([]int, len(r.jobs))
	for i := range r.jobs {
		counts[i] = r.jobs[i].preemptions
	}
	slices.Sort(counts)
	if n := len(counts); n > 0 {
		res.PreemptionsPerJob = Percentiles{P50: counts[(n-1)/2], P99: counts[(n-1)*99/100], Max: counts[n-1]}
	}
	var xs []float64
	guaranteed := 0
	for _, t := range r.tenants {
		if t.gpuSeconds == 0 && t.guaranteed == 0 && len(t.waiting) == 0 {
			if _, ok := res.ByTenant[t.name]; !ok {
				continue
			}
		}
		g := res.group(res.ByTenant, t.name)
		g.GPUHours = t.gpuSeconds / 3600
		g.ViolationHours = t.violation / 3600
		res.ViolationHours += g.ViolationHours
		res.NoRoomHours += t.noRoom / 3600
		if t.guaranteed > 0 {
			guaranteed++
			xs = append(xs, g.GPUHours/t.guaranteed)
		}
	}
	if guaranteed > 0 && res.Span > 0 {
		res.ViolationShare = res.ViolationHours * 3600 / (res.Span * float64(guaranteed))
	}
	res.Jain = jain(xs)
	for _, m := range []map[string]*Group{res.ByTenant, res.ByQueue, res.BySize} {
		for _, g := range m {
			g.Wait, g.Delay, g.waits, g.delays = stats(g.waits), stats(g.delays), nil, nil
		}
	}
	res.waits, res.jcts, res.delays, res.capped = nil, nil, nil, nil
}

func stats(xs []float32) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	sum := 0.0
	for _, x := range xs {
		sum += float64(x)
	}
	s := slices.Clone(xs)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return Stats{Mean: sum / float64(len(xs)), P95: float64(s[int(math.Ceil(0.95*float64(len(s))))-1]), Max: float64(s[len(s)-1])}
}

// jain is (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one has all.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum, sq = sum+x, sq+x*x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// event is an allocation set that ends (finishes, or a reclaim rule stops
// it), or a job's re-borrow backoff that ends (backoffEnds).
type event struct {
	t           float64
	job         *simJob
	gen         int
	reclaimed   bool
	backoffEnds bool
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].job.idx < h[j].job.idx
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Name is the run's column heading: its label, else its mode.
func (r *Result) Name() string {
	if r.Label != "" {
		return r.Label
	}
	return string(r.Mode)
}
