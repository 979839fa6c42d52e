// Package usage measures what GPU jobs do with the GPUs they hold, from the
// samples the leader observes each pass (allocations and per-GPU
// utilisation). It is pure: the leader feeds it observations and stores
// what it returns.
package usage

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Profile is what a job (namespace and id, over every run recorded under
// them) did with its GPUs: how many it held, and how many of them were busy
// in each sample.
type Profile struct {
	Namespace string `json:"namespace"`
	Job       string `json:"job"`
	Tenant    string `json:"tenant"`
	Queue     string `json:"queue"`
	// Asked is the GPUs its running allocations held in the latest sample.
	Asked int `json:"asked"`
	// Busy[k] is the number of samples in which k of its GPUs were busy.
	Busy  []int64   `json:"busy"`
	First time.Time `json:"first_sample"`
	Last  time.Time `json:"last_sample"`
}

// Samples is the number of samples taken.
func (p Profile) Samples() int64 {
	var n int64
	for _, c := range p.Busy {
		n += c
	}
	return n
}

// BusyAt is the q-quantile (0..1) of its busy GPUs: in a share q of the
// samples, at most that many GPUs were busy.
func (p Profile) BusyAt(q float64) int {
	n := p.Samples()
	if n == 0 {
		return 0
	}
	rank := max(int64(math.Ceil(q*float64(n))), 1)
	var seen int64
	for k, c := range p.Busy {
		if seen += c; seen >= rank {
			return k
		}
	}
	return len(p.Busy) - 1
}

// MinSamples is how many samples a profile needs before it is judged.
const MinSamples = 10

// Oversized reports whether the job kept fewer than half of asked GPUs busy
// (at p95), on enough samples to say so.
func (p Profile) Oversized(asked int) bool {
	return p.Samples() >= MinSamples && 2*p.BusyAt(0.95) < asked
}

// Warning is what admission tells a job submitted again (asking for asked
// GPUs) whose earlier runs left most of their GPUs idle, or "".
func (p Profile) Warning(asked int) string {
	if !p.Oversized(min(asked, p.Asked)) {
		return ""
	}
	return fmt.Sprintf("nomad-gpu: right-sizing: %s asks for %d GPUs, and its earlier runs held %d but kept at most %d busy "+
		"in 95%% of %d samples (median %d) since %s: consider asking for fewer", p.Job, asked, p.Asked, p.BusyAt(0.95),
		p.Samples(), p.BusyAt(0.5), p.First.UTC().Format(time.RFC3339))
}

// Profiles is the leader's table of profiles, safe for concurrent use.
type Profiles struct {
	mu    sync.RWMutex
	byJob map[[2]string]*Profile
	dirty map[[2]string]bool
}

// NewProfiles returns an empty table.
func NewProfiles() *Profiles {
	return &Profiles{byJob: map[[2]string]*Profile{}, dirty: map[[2]string]bool{}}
}

// Load replaces the table with stored profiles (a new leader's term).
func (t *Profiles) Load(ps []Profile) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byJob, t.dirty = map[[2]string]*Profile{}, map[[2]string]bool{}
	for i := range ps {
		t.byJob[[2]string{ps[i].Namespace, ps[i].Job}] = &ps[i]
	}
}

// Get returns a job's profile.
func (t *Profiles) Get(namespace, job string) (Profile, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p, ok := t.byJob[[2]string{namespace, job}]
	if !ok {
		return Profile{}, false
	}
	return p.clone(), true
}

func (p *Profile) clone() Profile {
	c := *p
	c.Busy = append([]int64(nil), p.Busy...)
	return c
}

// Sample adds one observation: for each admitted job with running
// allocations, the GPUs they hold and how many of those are at or above
// idleBelow. A GPU without a utilisation sample counts as busy (the
// observer reports it so), so no job is called oversized on missing data.
func (t *Profiles) Sample(now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, idleBelow float64) {
	type held struct {
		tenant, queue string
		asked, busy   int
	}
	jobs := map[[2]string]*held{}
	for _, a := range allocs {
		if a.Preempted || !a.Admitted || a.StartedAt.IsZero() {
			continue
		}
		key := [2]string{a.Namespace, a.JobID}
		h := jobs[key]
		if h == nil {
			h = &held{tenant: a.Tenant, queue: a.Queue}
			jobs[key] = h
		}
		for _, id := range a.GPUs {
			h.asked++
			if g, ok := gpus[id]; !ok || g.Utilization >= idleBelow {
				h.busy++
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, h := range jobs {
		p := t.byJob[key]
		if p == nil {
			p = &Profile{Namespace: key[0], Job: key[1], First: now}
			t.byJob[key] = p
		}
		p.Tenant, p.Queue, p.Asked, p.Last = h.tenant, h.queue, h.asked, now
		for len(p.Busy) <= h.busy {
			p.Busy = append(p.Busy, 0)
		}
		p.Busy[h.busy]++
		t.dirty[key] = true
	}
}

// TakeDirty returns the profiles changed since the last call.
func (t *Profiles) TakeDirty() []Profile {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Profile, 0, len(t.dirty))
	for key := range t.dirty {
		out = append(out, t.byJob[key].clone())
	}
	t.dirty = map[[2]string]bool{}
	sortProfiles(out)
	return out
}

// MarkDirty has profiles written again (their write failed).
func (t *Profiles) MarkDirty(ps []Profile) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		if _, ok := t.byJob[[2]string{p.Namespace, p.Job}]; ok {
			t.dirty[[2]string{p.Namespace, p.Job}] = true
		}
	}
}

// MaxProfiles bounds the profiles kept (each a key in Consul KV) by count as
// well as by age: beyond it, the least recently sampled go first. A
// profile serves a job submitted again under the same id; a job running
// now is sampled every reclaim period, and stays.
const MaxProfiles = 1000

// Expire drops the profiles last sampled before cutoff, and then the least
// recently sampled beyond keep, and returns them.
func (t *Profiles) Expire(cutoff time.Time, keep int) []Profile {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Profile
	drop := func(key [2]string, p *Profile) {
		out = append(out, *p)
		delete(t.byJob, key)
		delete(t.dirty, key)
	}
	for key, p := range t.byJob {
		if p.Last.Before(cutoff) {
			drop(key, p)
		}
	}
	if over := len(t.byJob) - keep; over > 0 {
		oldest := make([]*Profile, 0, len(t.byJob))
		for _, p := range t.byJob {
			oldest = append(oldest, p)
		}
		sort.Slice(oldest, func(i, j int) bool { return oldest[i].Last.Before(oldest[j].Last) })
		for _, p := range oldest[:over] {
			drop([2]string{p.Namespace, p.Job}, p)
		}
	}
	sortProfiles(out)
	return out
}

// Worst returns, per tenant, up to n of its oversized profiles, most GPUs
// left idle (asked minus p95 busy) first; tenants by name.
func Worst(ps []Profile, n int) []Profile {
	byTenant := map[string][]Profile{}
	for _, p := range ps {
		if p.Oversized(p.Asked) {
			byTenant[p.Tenant] = append(byTenant[p.Tenant], p)
		}
	}
	tenants := make([]string, 0, len(byTenant))
	for t := range byTenant {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	var out []Profile
	for _, t := range tenants {
		list := byTenant[t]
		sort.SliceStable(list, func(i, j int) bool {
			wi, wj := list[i].Asked-list[i].BusyAt(0.95), list[j].Asked-list[j].BusyAt(0.95)
			if wi != wj {
				return wi > wj
			}
			return list[i].Namespace+"/"+list[i].Job < list[j].Namespace+"/"+list[j].Job
		})
		if n > 0 && len(list) > n {
			list = list[:n]
		}
		out = append(out, list...)
	}
	return out
}

func sortProfiles(ps []Profile) {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].Namespace != ps[j].Namespace {
			return ps[i].Namespace < ps[j].Namespace
		}
		return ps[i].Job < ps[j].Job
	})
}
