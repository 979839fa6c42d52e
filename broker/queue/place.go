package queue

import (
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Supply is what estimates start from: the GPUs idle now and the releases
// to come.
type Supply struct {
	Idle     float64
	Releases []Release
}

// Place is where e, submitted now, would stand in the admission order among
// entries, in place of entries[replaced] (its waiting version; -1: none):
// its 1-based position and, with a supply, its estimate as EstimateOf
// gives it (false: none). A submission into a long queue needs this alone,
// as the queue is not sorted. The entries ahead of e are taken in order
// only until e's estimate is known: the first that waits for GPUs no known
// end frees decides it for all behind.
func Place(entries []Entry, e Entry, replaced int, p *policy.Policy, used, decayed map[string]float64, now time.Time,
	supply *Supply) (int, Estimate, bool) {
	n, self := len(entries)+1, len(entries)
	if replaced >= 0 {
		n, self = len(entries), replaced
	}
	entry := func(i int) *Entry {
		if i == self {
			return &e
		}
		return &entries[i]
	}
	buf := keyBufs.Get().(*[]orderKey)
	keys := orderKeys(*buf, n, entry, p, used, decayed, now)
	defer func() { *buf = keys[:0]; keyBufs.Put(buf) }()
	mine := keys[self]
	ahead := keys[:0]
	for _, k := range keys {
		if k.index != mine.index && compareKeys(k, mine, entry) < 0 {
			ahead = append(ahead, k)
		}
	}
	if supply == nil {
		return len(ahead) + 1, Estimate{}, false
	}
	h := keyHeap{keys: ahead, entry: entry}
	h.init()
	done := false
	next := func() *Entry {
		switch {
		case len(h.keys) > 0:
			return entry(int(h.pop().index))
		case !done:
			done = true
			return &e
		}
		return nil
	}
	est, ok := Estimate{}, false
	walk(next, p, supply.Idle, used, supply.Releases, now, func(id string, got Estimate, behind bool) bool {
		if id == e.ID || behind { // behind a blocker, e waits behind it too
			est, ok = got, true
		}
		return !ok
	})
	return len(ahead) + 1, est, ok
}

// keyBufs keeps the keys of one Place for the next: at 10,000 queued a
// submission's keys are hundreds of kilobytes, garbage at every one.
var keyBufs = sync.Pool{New: func() any { return new([]orderKey) }}

// keyHeap gives keys in admission order, the first at the top: taking k of
// n costs n + k·log n, not a sort of all n.
type keyHeap struct {
	keys  []orderKey
	entry func(int) *Entry
}

func (h *keyHeap) less(i, j int) bool { return compareKeys(h.keys[i], h.keys[j], h.entry) < 0 }

func (h *keyHeap) init() {
	for i := len(h.keys)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *keyHeap) pop() orderKey {
	top := h.keys[0]
	last := len(h.keys) - 1
	h.keys[0] = h.keys[last]
	h.keys = h.keys[:last]
	h.down(0)
	return top
}

func (h *keyHeap) down(i int) {
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(h.keys) && h.less(l, least) {
			least = l
		}
		if r < len(h.keys) && h.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		h.keys[i], h.keys[least] = h.keys[least], h.keys[i]
		i = least
	}
}
