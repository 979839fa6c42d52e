package sim

import (
	"container/heap"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// place puts waiting allocations on nodes as Nomad's scheduler does: in
// priority order, the oldest first within a priority, each wherever it fits
// (no head-of-line blocking), then by preemption where the job may preempt.
func (r *run) place() {
	for {
		if len(r.pinned) > 0 && r.placePinned() {
			continue
		}
		if b := r.nomadQ.next(r.c); b != nil {
			j := b.pop()
			r.start(j, r.node(j))
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
		var victims []*alloc
		node := -1
		if r.ideal {
			victims, node = r.c.victims(b.model, b.size, b.prio, policy.MinPriorityGap)
		} else {
			victims, node = r.c.nomadVictims(b.model, b.size, j.cpu, b.prio, policy.MinPriorityGap, scoredNodes(j.service, len(r.c.nodes)), r.rng)
		}
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

// node is where the simulated Nomad places the next allocation of j, which
// fits somewhere.
func (r *run) node(j *simJob) int {
	if r.ideal {
		return r.c.fit(j.Model, j.GPUs)
	}
	return r.c.choose(j.Model, j.GPUs, j.cpu, scoredNodes(j.service, len(r.c.nodes)), r.rng)
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
	a := &alloc{job: j, node: node, gpus: j.GPUs, prio: j.prio, cpu: j.cpu, placedAt: r.now}
	r.c.place(a)
	if r.nodeAware {
		r.unseen = append(r.unseen, placedOn{node, r.now})
	}
	j.placed = append(j.placed, a)
	r.hold(j, a.gpus)
	if len(j.placed) < j.allocs() {
		return
	}
	// Its task starts once the client has started it.
	j.state, j.startedAt = stRunning, r.now+r.o.StartLatency.Seconds()
	if j.firstStart < 0 {
		j.firstStart = j.startedAt
		r.res.Started++
	}
	r.wait(j, -1)
	if !j.Idle {
		r.busy += j.gpus()
		r.tenants[j.tenant].busyGPUs += j.gpus()
	}
	heap.Push(&r.events, event{t: j.startedAt + j.Duration - j.progress, job: j, gen: j.gen})
	r.watch(j)
	if j.borrowed {
		r.borrowedRunning[j] = struct{}{}
		if r.p.PromoteBelow(j.queue) > 0 {
			r.promotable[j] = struct{}{}
		}
		j.nextBand = 0
		if r.p.Borrowing.SubBands {
			heap.Push(&r.bands, bandDue{0, j})
		}
	}
}

// preempt is Nomad evicting j for higher priority work. A borrowed job goes
// back to the broker's queue (the built-in rule); any other is rescheduled
// by Nomad.
func (r *run) preempt(j *simJob) {
	r.res.Preemptions++
	j.preemptions, j.preemptedAt = j.preemptions+1, r.now
	if n := j.preemptions; j.borrowed && r.o.Mode != NomadAlone && !r.p.Borrowing.BorrowsNoMore(n) {
		if d := r.p.Borrowing.BackoffAfter(n); d > 0 {
			heap.Push(&r.events, event{t: r.now + d.Seconds(), job: j, backoffEnds: true})
		}
	}
	if !j.borrowed {
		r.res.GuaranteedVictims++
	}
	r.res.LostGPUHours += r.stop(j) / 3600
	if j.borrowed && r.o.Mode != NomadAlone {
		// Nomad's replacement waits, blocked at the borrowed band, and the
		// job counts against its tenant until the broker's next reclaim
		// pass requeues it (the built-in rule).
		j.state = stEvicted
		r.wait(j, 1)
		r.evicted = append(r.evicted, j)
		return
	}
	j.state = stNew
	r.register(j)
}

// requeueEvicted puts back in the broker's queue the borrowed jobs Nomad
// evicted since the last reclaim pass.
func (r *run) requeueEvicted() {
	if len(r.evicted) == 0 {
		return
	}
	for _, j := range r.evicted {
		r.wait(j, -1)
		r.deregister(j)
		r.requeue(j, j.queue, float64(j.gpus()))
	}
	clear(r.evicted)
	r.evicted = r.evicted[:0]
	r.release()
}
