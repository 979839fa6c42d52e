package sim

import "sort"

// pending are the allocations registered with Nomad and not placed yet, in
// buckets of one priority, model and size, each first in first out: the
// next to place is the oldest of the highest priority that fits somewhere.
type pending struct {
	buckets []*bucket // highest priority first
	index   map[bucketKey]*bucket
}

type bucketKey struct {
	prio  int
	model string
	size  int
}

type bucket struct {
	bucketKey
	units []unit
	head  int
}

// unit is one allocation of a job to place; stale once the job's allocations
// were stopped since (its generation moved on).
type unit struct {
	job *simJob
	gen int
}

func newPending() *pending { return &pending{index: map[bucketKey]*bucket{}} }

func (p *pending) push(j *simJob, allocs int) {
	k := bucketKey{j.prio, j.Model, j.GPUs}
	b, ok := p.index[k]
	if !ok {
		b = &bucket{bucketKey: k}
		p.index[k] = b
		p.buckets = append(p.buckets, b)
		sort.SliceStable(p.buckets, func(i, k int) bool { return p.buckets[i].prio > p.buckets[k].prio })
	}
	for range allocs {
		b.units = append(b.units, unit{j, j.gen})
	}
}

// peek is the job of the bucket's next live unit, nil if none.
func (b *bucket) peek() *simJob {
	for b.head < len(b.units) {
		u := b.units[b.head]
		if u.gen == u.job.gen && u.job.state == stPending {
			return u.job
		}
		b.units[b.head] = unit{}
		b.head++
	}
	if b.head > 0 {
		b.units, b.head = b.units[:0], 0
	}
	return nil
}

func (b *bucket) pop() *simJob {
	j := b.peek()
	b.units[b.head] = unit{}
	b.head++
	if b.head > 1024 && b.head*2 > len(b.units) {
		b.units, b.head = append(b.units[:0:0], b.units[b.head:]...), 0
	}
	return j
}

// next is the bucket whose next allocation to place is the one to place
// now: of the highest priority with any that fits a node, the one
// registered first; nil if none fits.
func (p *pending) next(c *cluster) *bucket {
	var best *bucket
	for _, b := range p.buckets {
		j := b.peek()
		if j == nil {
			continue
		}
		if best != nil && b.prio < best.prio {
			break
		}
		if best != nil && j.seq > best.peek().seq {
			continue
		}
		if c.fits(b.model, b.size) {
			best = b
		}
	}
	return best
}
