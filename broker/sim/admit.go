package sim

import (
	"cmp"
	"container/heap"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// decide is the decision on j now, through the broker's own sequence
// (enrich.Enricher: its re-borrow backoff set, then admission.Decide) with the
// usage the simulation keeps.
func (r *run) decide(p *policy.Policy, j *simJob) admission.Decision {
	r.deciding = j
	d := r.enricher.Decide(p, j.adm, r.usage(j))
	r.deciding = nil
	return d
}

// preemptionsOf is what the enricher reads of a job's preemptions: those of
// the job being decided, the only one it asks about.
func (r *run) preemptionsOf(_, _ string) (int, time.Time) {
	j := r.deciding
	if j == nil || j.preemptions == 0 {
		return 0, time.Time{}
	}
	// The leader keeps a count while its job waits or runs (its prune
	// forgets only those of jobs gone): here, for the whole run.
	return j.preemptions, r.time(j.preemptedAt)
}

// inBackoff reports whether j is in its re-borrow backoff now: what
// the enricher finds, without the clock's conversions (the bounded pass asks
// it of every entry it walks).
func (r *run) inBackoff(j *simJob) bool {
	return r.p.Borrowing.InBackoff(j.preemptions, time.Duration((r.now-j.preemptedAt)*float64(time.Second)))
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
	j.adm.Submitted = time.Time{} // a submission: newer than anything queued
	d := r.decide(r.p, j)
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
	if r.walking {
		// A pass walks the lists as they were when it began: put back after it.
		r.putBack = append(r.putBack, e)
	} else {
		t.insert(e)
	}
	t.queued++
	r.queued++
	r.wait(j, 1)
	if queue.Owes(r.p, e, j.preemptions) {
		if t.owing == nil {
			t.owing = map[int]float64{}
		}
		t.owing[j.idx] = j.Submit
		r.owedBy(t)
	}
}

// owedBy sets, in t's usage, when its oldest job owed its guarantee was
// submitted (admission.TenantUsage.OwedSince).
func (r *run) owedBy(t *tenant) {
	tu := r.tu[t.name]
	tu.OwedSince = time.Time{}
	if len(t.owing) > 0 {
		tu.OwedSince = r.time(slices.Min(slices.Collect(maps.Values(t.owing))))
	}
	r.tu[t.name] = tu
}

// insert puts e in its list, in order.
func (t *tenant) insert(e queue.Entry) {
	k := listKey{e.Queue, e.Demand}
	l := t.lists[k]
	i, _ := slices.BinarySearchFunc(l, e, olderFirst)
	t.lists[k] = slices.Insert(l, i, e)
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

// candidates are the runs of entries that can make a difference to a pass,
// one per list (one tenant, queue and demand d), each in admission order. A
// tenant takes at most room GPUs in one: its limit, and with quotas in all
// GPUs, its guarantee plus the idle GPUs. Usage only grows during a pass,
// so once an entry of a list is not admitted, none after it is: of each
// list, the first room/d+1 decide. A list its limit holds back entirely is
// left out.
func (r *run) candidates(used map[string]float64) []*passRun {
	out := r.runs[:0]
	idle := math.Max(0, r.capacity[policy.AllGPUs]-r.held[policy.AllGPUs])
	quiet := r.quiet(used)
	for ti, t := range r.tenants {
		if t.queued == 0 {
			continue
		}
		pt := r.p.Tenants[t.name]
		limit, total := pt.Limit[policy.AllGPUs]
		guaranteed, gTotal := pt.Guaranteed[policy.AllGPUs]
		bounded := total && gTotal && len(pt.Limit) == 1 && len(pt.Guaranteed) == 1 && !r.wholeQueue
		// Its own borrowed work may be preempted within the pass (by an
		// admission the pass makes), giving the room back: counted as room,
		// unless the pass is quiet.
		held := used[t.name]
		if !quiet {
			held -= r.tu[t.name].Borrowed.Total()
		}
		limitRoom := limit - held
		guaranteeRoom := math.Min(math.Max(0, guaranteed-held), limitRoom)
		room := guaranteeRoom
		if r.p.Borrowing.Enabled {
			room = math.Min(room+idle, limitRoom)
		}
		for _, k := range sortedLists(t.lists) {
			if total && k.demand > limitRoom+1e-9 {
				continue
			}
			run := &passRun{tenant: ti, entries: t.lists[k], n: -1}
			if bounded {
				// As many as the room could take, and of those in their
				// backoff on the way (they wait while those behind them
				// borrow) as many as the guarantee's room could take: more
				// candidates change no decision.
				run.n, run.nb = int(room/k.demand+1e-9)+1, int(guaranteeRoom/k.demand+1e-9)+1
			}
			out = append(out, run)
		}
	}
	r.runs = out
	return out
}

// passRun is one list's candidates in a pass, yielded in order: the list as
// the pass began (requeues wait until it ends), taken as far as the bound
// (n entries, nb of them in their backoff; n -1: all) allows.
type passRun struct {
	tenant  int
	entries []queue.Entry
	next    int
	n, nb   int
	head    queue.OrderKey
	asideAt float64 // its tenant's GPUs when it was set aside
}

// advance moves to the next candidate of the run; false when there is none.
func (pr *passRun) advance(r *run, k *queue.Keyer) bool {
	for ; pr.next < len(pr.entries); pr.next++ {
		e := &pr.entries[pr.next]
		switch {
		case pr.n < 0:
		case pr.n == 0:
			return false
		case !r.inBackoff(&r.jobs[atoi(e.ID)]):
			pr.n--
		case pr.nb > 0:
			pr.nb--
		default:
			continue
		}
		pr.head = k.Key(e)
		return true
	}
	return false
}

// quiet reports whether nothing in the pass about to be made can preempt.
// No tenant has room within its guarantee for its smallest waiting demand,
// so the pass admits nothing within a guarantee (borrowed work preempts
// nothing). And Nomad has no allocation waiting at a priority that preempts
// borrowed work, which an admission's placement could let preempt. Then no
// tenant's borrowed work is preempted within the pass, and its room does
// not grow: the bound needs no room for that. Under sustained overload most
// passes are quiet, and the room a tenant's borrowed work would count for
// made each pass order thousands of entries.
func (r *run) quiet(used map[string]float64) bool {
	for _, t := range r.tenants {
		if t.queued == 0 {
			continue
		}
		pt := r.p.Tenants[t.name]
		if pt == nil {
			continue // its entries are rejected: no admission
		}
		g, ok := pt.Guaranteed[policy.AllGPUs]
		if !ok || len(pt.Guaranteed) != 1 {
			return false // guarantees by class: not bounded here
		}
		smallest := math.Inf(1)
		for k := range t.lists {
			smallest = min(smallest, k.demand)
		}
		if used[t.name]+smallest <= g+1e-9 {
			return false
		}
	}
	for _, b := range r.nomadQ.buckets {
		if b.prio >= r.p.Borrowing.Priority+policy.MinPriorityGap && b.peek() != nil {
			return false
		}
	}
	return true
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
	r.pin(j, d.Placed)
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
	if j.pin != nil {
		r.pinned = append(r.pinned, j)
		r.waitOn(j, 1)
		return
	}
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
	if r.nodeAware {
		u.Nodes, u.Now = r.roomsNow(), r.time(r.now)
		return u
	}
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
// Long: the bounded walk that mirrors admitter.Pass step by step; split, the two would no longer read side by side.
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
	if r.nodeAware {
		r.reserve(used)
	}
	// The candidates in queue.Order's order: a merge of the runs, each in
	// that order already. A run whose entries all are skipped (its tenant
	// limited below its demand, or held within its guarantee beyond it) is
	// set aside as a whole. One set aside for the guarantee comes back when
	// the pass preempts its tenant's work, from where the pass has got to.
	keyer := queue.NewKeyer(p, used, decayed, r.time(r.now))
	runs := r.candidates(used)
	h := runHeap(runs[:0:0])
	for _, pr := range runs {
		if pr.advance(r, keyer) {
			h = append(h, pr)
		}
	}
	heap.Init(&h)
	// By tenant, the least demand its limit held back (for jobs of a model,
	// by tenant and model).
	limited := make([]float64, len(r.tenants))
	for i := range limited {
		limited[i] = math.Inf(1)
	}
	limitedModel := map[[2]string]float64{}
	r.walking, r.aside = true, r.aside[:0]
	var pass queue.Pass
	for h.Len() > 0 {
		pr := h[0]
		at := pr.head
		e := pr.entries[pr.next]
		j := &r.jobs[atoi(e.ID)]
		if e.Demand >= limited[j.tenant] { // and so every entry of its run
			heap.Pop(&h)
			continue
		}
		if pass.HoldsBackBorrowers() && beyond(p.Tenants[e.Tenant], r.tu[e.Tenant].Used, e.Demand) {
			// Only an admission within its guarantee could follow, and it
			// (with every entry of its run) is beyond it while its tenant
			// holds as much.
			heap.Pop(&h)
			pr.asideAt = r.tu[e.Tenant].Used.Total()
			r.aside = append(r.aside, pr)
			continue
		}
		pr.next++
		if pr.advance(r, keyer) {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
		if l, ok := limitedModel[[2]string{e.Tenant, j.Model}]; ok && j.Model != "" && e.Demand >= l {
			continue
		}
		j.adm.Submitted = r.time(j.Submit)
		d := r.decide(p, j)
		if !pass.Admits(d) {
			if pass.HoldsBack(d.Tenant) {
				limited[j.tenant] = 0 // nothing more of its: its every entry is passed over
				continue
			}
			// One in its backoff says nothing of the tenant's others.
			if d.Outcome != admission.Queue || d.WaitsFor == admission.WaitCapacity || d.Rule == admission.RuleBorrowBackoff {
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
		r.bringBack(&h, keyer, at)
	}
	r.walking = false
	r.endWalk()
}

// promote runs on within their tenant's guarantee, at their queue's band,
// the borrowed jobs the policy promotes (admission.Promotions), as the
// leader does before a queue pass: Nomad changes a running job's priority
// in place.
func (r *run) promote() {
	below := r.p.MaxPromoteBelow()
	if below <= 0 || len(r.promotable) == 0 {
		return
	}
	guaranteed := make(map[string]float64, len(r.tu))
	room := map[string]float64{} // tenants with room below the largest promote_below, and how much
	for name, tu := range r.tu {
		g := tu.Used.Total() - tu.Borrowed.Total()
		guaranteed[name] = g
		if t := r.p.Tenants[name]; t != nil && g < below*t.Guaranteed.Total()-1e-9 {
			room[name] = below*t.Guaranteed.Total() - g
		}
	}
	if len(room) == 0 {
		return
	}
	// Only jobs that fit their tenant's room can be promoted (Promotions
	// weighs each tenant's alone, and its room only shrinks): the others
	// are left out, which spares a sort of every borrowed job at each pass.
	running := make([]admission.Running, 0, len(r.promotable))
	byID := make(map[string]*simJob, len(r.promotable))
	for j := range r.promotable {
		if left, ok := room[r.tenants[j.tenant].name]; !ok || j.demand.Total() > left+1e-9 {
			continue
		}
		byID[j.ID] = j
		running = append(running, admission.Running{Namespace: j.adm.Namespace, ID: j.ID, Tenant: r.tenants[j.tenant].name,
			Queue: j.queue, GPUs: j.demand.Total(), Since: r.time(j.startedAt)})
	}
	for _, pr := range admission.Promotions(r.p, guaranteed, running) {
		j := byID[pr.ID]
		tu := r.tu[pr.Tenant]
		for class, n := range j.demand {
			tu.Borrowed[class] -= n
		}
		j.borrowed = false
		for _, a := range j.placed {
			if a.borrowed {
				a.borrowed = false
				r.c.lend(a, -1)
			}
		}
		delete(r.borrowedRunning, j)
		delete(r.promotable, j)
		r.reprioritise(j, pr.Priority)
		r.res.Promotions++
	}
}

// subBand moves each running borrowed job to the sub-band of the work a
// preemption would lose now (policy.SubBand), as the leader does at its
// reclaim passes: in place, as Nomad changes a running job's priority.
func (r *run) subBand() {
	if !r.p.Borrowing.SubBands {
		return
	}
	for len(r.bands) > 0 && r.bands[0].t <= r.now {
		due := heap.Pop(&r.bands).(bandDue)
		j := due.j
		if _, ok := r.borrowedRunning[j]; !ok || j.nextBand != due.t {
			continue // ended, promoted, or started again since
		}
		gpus, running := j.demand.Total(), time.Duration((r.now-j.startedAt)*float64(time.Second))
		if prio := r.p.SubBand(gpus, running); prio != j.prio {
			r.reprioritise(j, prio)
			r.res.SubBandMoves++
		}
		j.nextBand = math.Inf(1) // at the top: it stays there
		if next := r.p.NextSubBand(gpus, running); next > 0 {
			j.nextBand = r.now + next.Seconds()
			heap.Push(&r.bands, bandDue{j.nextBand, j})
		}
	}
}

// bandDue is when a running borrowed job's sub-band is next worked out.
type bandDue struct {
	t float64
	j *simJob
}

// bandHeap holds them soonest first.
type bandHeap []bandDue

func (h bandHeap) Len() int           { return len(h) }
func (h bandHeap) Less(i, k int) bool { return h[i].t < h[k].t }
func (h bandHeap) Swap(i, k int)      { h[i], h[k] = h[k], h[i] }
func (h *bandHeap) Push(x any)        { *h = append(*h, x.(bandDue)) }
func (h *bandHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = bandDue{}
	*h = old[:len(old)-1]
	return x
}

// reprioritise runs j on at prio, its allocations where they are.
func (r *run) reprioritise(j *simJob, prio int) {
	for _, a := range j.placed {
		r.heldByPrio[a.prio] -= a.gpus
		r.heldByPrio[prio] += a.gpus
		a.prio = prio
		r.c.relow(a.node)
	}
	j.prio = prio
}

// bringBack returns to the merge the runs set aside for their tenant's
// guarantee whose tenant now holds less than then, as when an admission
// preempted its work. Each comes back from its first entry after at: those
// before it were passed over when they came, as a pass in order passes them.
func (r *run) bringBack(h *runHeap, k *queue.Keyer, at queue.OrderKey) {
	kept := r.aside[:0]
	for _, pr := range r.aside {
		if r.tu[r.tenants[pr.tenant].name].Used.Total() >= pr.asideAt-1e-9 {
			kept = append(kept, pr)
			continue
		}
		back := true
		for back && pr.head.Compare(at) <= 0 {
			pr.next++
			back = pr.advance(r, k)
		}
		if back {
			heap.Push(h, pr)
		}
	}
	r.aside = kept
}

// runHeap orders runs by their heads.
type runHeap []*passRun

func (h runHeap) Len() int           { return len(h) }
func (h runHeap) Less(i, j int) bool { return h[i].head.Compare(h[j].head) < 0 }
func (h runHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *runHeap) Push(x any)        { *h = append(*h, x.(*passRun)) }
func (h *runHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// unqueue takes an entry out of its tenant's queue (a job the pass took
// out may be back by the end of it, preempted by a later admission). The
// pass walks the lists as they were: it leaves them as they are until it
// ends (endWalk).
func (r *run) unqueue(tenant int, e queue.Entry) {
	r.taken = append(r.taken, takenEntry{tenant, e})
	t := r.tenants[tenant]
	t.queued--
	r.queued--
	if _, ok := t.owing[atoi(e.ID)]; ok {
		delete(t.owing, atoi(e.ID))
		r.owedBy(t)
	}
}

type takenEntry struct {
	tenant int
	e      queue.Entry
}

// endWalk applies to the lists what the pass took out and put back.
func (r *run) endWalk() {
	for _, te := range r.taken {
		t := r.tenants[te.tenant]
		k := listKey{te.e.Queue, te.e.Demand}
		l := t.lists[k]
		i := slices.IndexFunc(l, func(o queue.Entry) bool { return o.ID == te.e.ID })
		if l = slices.Delete(l, i, i+1); len(l) == 0 {
			delete(t.lists, k)
		} else {
			t.lists[k] = l
		}
	}
	for _, e := range r.putBack {
		r.tenants[r.byName[e.Tenant]].insert(e)
	}
	r.taken, r.putBack = r.taken[:0], r.putBack[:0]
}

// beyond reports whether demand more GPUs take a tenant whose quotas count
// all GPUs beyond its guarantee (false when its quotas are per class).
func beyond(t *policy.Tenant, used policy.Quota, demand float64) bool {
	g, ok := t.Guaranteed[policy.AllGPUs]
	return ok && len(t.Guaranteed) == 1 && used[policy.AllGPUs]+demand > g+1e-9
}
