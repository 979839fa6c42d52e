package consulkv

import (
	"context"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// Preemptions is how often Nomad evicted one job while it was borrowed, the
// last time, and the reclaim decision that counted it (a leader that
// carries the decision out again after a crash counts it once).
type Preemptions struct {
	Namespace string    `json:"namespace"`
	Job       string    `json:"job"`
	Count     int       `json:"count"`
	Last      time.Time `json:"last"`
	Decision  string    `json:"decision"`

	modifyIndex uint64 // Consul's, for Prune's check-and-set
}

// Backoffs keeps, under <prefix>backoff/<namespace>/<job>, the preemptions of
// jobs evicted while borrowed, which hold them back from borrowing again
// (admission.BackoffFor), with a copy every broker follows (a blocking
// query) so that admission reads them without a round trip. Prune is the
// keys' owner.
type Backoffs struct {
	r records[Preemptions]
	m *mirror[Preemptions]
}

// NewBackoffs returns the preemption counts under prefix (e.g. "nomad-gpu/").
func NewBackoffs(kv *consul.KV, prefix string, aside *Aside) *Backoffs {
	r := records[Preemptions]{kv: kv, dir: prefix + "backoff/", what: "preemption count", kind: "backoff", aside: aside,
		version: func(p *Preemptions, i uint64) { p.modifyIndex = i }}
	return &Backoffs{r: r, m: &mirror[Preemptions]{r: r}}
}

// Follow keeps the copy current until ctx ends.
func (b *Backoffs) Follow(ctx context.Context) { b.m.follow(ctx) }

// Preemptions is how often job namespace/id was evicted while borrowed, and
// the last time (0: never, or long enough ago that Prune forgot it).
func (b *Backoffs) Preemptions(namespace, id string) (count int, last time.Time) {
	b.m.mu.RLock()
	defer b.m.mu.RUnlock()
	p := b.m.records[escape(namespace, id)].v
	return p.Count, p.Last
}

// All is every job's preemptions while borrowed.
func (b *Backoffs) All() []Preemptions { return b.m.all() }

// Evicted is every job's evictions while borrowed, as the admission
// engine counts backoffs by (admission.InBackoffByTenant).
func (b *Backoffs) Evicted() []admission.Evicted {
	all := b.All()
	out := make([]admission.Evicted, len(all))
	for i, pr := range all {
		out[i] = admission.Evicted{Namespace: pr.Namespace, Count: pr.Count, Last: pr.Last}
	}
	return out
}

// Preempted counts one more preemption of namespace/id at at, by reclaim
// decision; a decision counted already changes nothing. It returns the count.
func (b *Backoffs) Preempted(ctx context.Context, namespace, id, decision string, at time.Time) (int, error) {
	name := escape(namespace, id)
	for range 10 {
		p, index, _, err := b.r.get(ctx, name)
		if err != nil {
			return 0, err
		}
		if p.Decision == decision {
			return p.Count, nil
		}
		p.Namespace, p.Job = namespace, id
		p.Count, p.Last, p.Decision = p.Count+1, at.UTC(), decision
		ok, err := b.r.cas(ctx, name, p, index)
		if err != nil {
			return 0, err
		}
		if ok {
			b.m.readBack(ctx, name)
			return p.Count, nil
		}
	}
	return 0, fmt.Errorf("count the preemption of %s/%s: its record kept changing", namespace, id)
}

// Prune deletes the counts whose last preemption is older than quiet(count)
// at now, of jobs that are not live (live: queued or running). A job counts
// its evictions for its whole life, or one past max_preemptions would borrow
// again; one submitted again soon after keeps its count. It returns how
// many it deleted.
func (b *Backoffs) Prune(ctx context.Context, now time.Time, quiet func(count int) time.Duration, live func(namespace, job string) bool) (int, error) {
	all, _, err := b.r.list(ctx, &consul.QueryOptions{}, nil)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, p := range all {
		if now.Sub(p.Last) < quiet(p.Count) || live(p.Namespace, p.Job) {
			continue
		}
		name := escape(p.Namespace, p.Job)
		if ok, err := b.r.remove(ctx, name, p.modifyIndex); err != nil {
			return deleted, err
		} else if ok {
			b.m.removed(name)
			deleted++
		}
	}
	return deleted, nil
}
