package queue

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Release is GPUs a running allocation frees when its lifetime ends (its
// nomad-gpu.ttl or a max_lifetime rule, grace included).
type Release struct {
	At     time.Time
	GPUs   float64
	Tenant string
}

// Forecast holds the releases the leader last observed; safe for
// concurrent use.
type Forecast struct {
	mu       sync.RWMutex
	releases []Release
	known    bool
}

// Set replaces the releases.
func (f *Forecast) Set(rs []Release) {
	f.mu.Lock()
	f.releases, f.known = rs, true
	f.mu.Unlock()
}

// Get returns the releases, and false before the leader observed any.
func (f *Forecast) Get() ([]Release, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.releases, f.known
}

// Estimate is when a queued job is expected to start, and why then.
type Estimate struct {
	At  time.Time `json:"at,omitzero"` // zero: unknown
	Why string    `json:"why"`
}

// Estimates walks entries in admission order as the leader admits them:
// each starts once enough GPUs are idle and its tenant is within its limit,
// the running allocations freeing theirs at the end of their lifetimes, in
// time order. GPUs of any class count alike. An entry that waits for GPUs
// no known end frees is unknown, and so is every one behind it (they wait
// behind it); one that waits for its own tenant's jobs only, alone.
func Estimates(ordered []Entry, p *policy.Policy, idle float64, used map[string]float64, releases []Release, now time.Time) map[string]Estimate {
	out := make(map[string]Estimate, len(ordered))
	walk(inOrder(ordered), p, idle, used, releases, now, func(id string, e Estimate, _ bool) bool {
		out[id] = e
		return true
	})
	return out
}

// EstimateOf is Estimates' estimate of the entry id alone; false when it
// is not among the waiting entries. The walk stops there.
func EstimateOf(ordered []Entry, id string, p *policy.Policy, idle float64, used map[string]float64, releases []Release, now time.Time) (Estimate, bool) {
	var out Estimate
	found := false
	walk(inOrder(ordered), p, idle, used, releases, now, func(at string, e Estimate, _ bool) bool {
		if at == id {
			out, found = e, true
		}
		return !found
	})
	return out, found
}

// inOrder gives ordered entries one by one, then nil.
func inOrder(ordered []Entry) func() *Entry {
	i := 0
	return func() *Entry {
		if i == len(ordered) {
			return nil
		}
		i++
		return &ordered[i-1]
	}
}

// walk gives each waiting entry's estimate to each, the entries in
// admission order as following gives them, while it returns true. behind
// is true when the entry waits behind one that blocks them all, as will
// every entry after it, with the same estimate.
func walk(following func() *Entry, p *policy.Policy, idle float64, used map[string]float64, releases []Release, now time.Time,
	each func(id string, e Estimate, behind bool) bool) {
	rs := append([]Release(nil), releases...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].At.Before(rs[j].At) })
	held := map[string]float64{}
	for t, n := range used {
		held[t] = n
	}
	free, clock, next, waited := idle, now, 0, 0
	blocked := ""
	for e := following(); e != nil; e = following() {
		if e.Parked != "" {
			continue
		}
		if blocked != "" {
			if !each(e.ID, Estimate{Why: blocked}, true) {
				return
			}
			continue
		}
		limit := e.Demand
		if t, ok := p.Tenants[e.Tenant]; ok {
			limit = t.Limit.Total()
		}
		for next < len(rs) && (free < e.Demand || held[e.Tenant]+e.Demand > limit) {
			if rs[next].At.After(clock) {
				clock = rs[next].At
			}
			free += rs[next].GPUs
			held[rs[next].Tenant] -= rs[next].GPUs
			next++
			waited++
		}
		var est Estimate
		switch {
		case free < e.Demand:
			blocked = "unknown: it waits behind " + e.ID
			est = Estimate{Why: fmt.Sprintf("unknown: the %g GPUs it waits for are held by jobs with no known end (nomad-gpu.ttl or a max_lifetime rule gives one)", e.Demand-free)}
		case held[e.Tenant]+e.Demand > limit:
			est = Estimate{Why: fmt.Sprintf("unknown: tenant %q's own jobs with no known end hold its limit", e.Tenant)}
		default:
			free -= e.Demand
			held[e.Tenant] += e.Demand
			why := "now: GPUs are free"
			if clock.After(now) {
				why = fmt.Sprintf("when %d running allocations reach the end of their lifetimes", waited)
			}
			est = Estimate{At: clock, Why: why}
		}
		if !each(e.ID, est, false) {
			return
		}
	}
}
