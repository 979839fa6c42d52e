// Package queue is what the broker knows of jobs it could not admit yet. It
// holds an entry (kept durably by consulkv.Queue), the order in which the
// leader admits them, the rule a pass through them keeps, and estimates of
// when each will start.
package queue

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// RegionAuto is Entry.Region for a job whose region the broker chooses.
const RegionAuto = "auto"

// Entry is one queued job, with everything needed to register it later.
type Entry struct {
	ID        string `json:"id"`
	JobID     string `json:"job_id"`
	Namespace string `json:"namespace"`
	Tenant    string `json:"tenant"`
	Queue     string `json:"queue"`
	// Region is the Nomad region the job names, or "auto" where the broker
	// chooses it, when the broker governs several ("": it governs one).
	Region      string  `json:"region,omitempty"`
	Demand      float64 `json:"demand"` // GPUs; a replica is a share of one
	Reason      string  `json:"reason"` // why it was queued
	SubmittedBy string  `json:"submitted_by"`
	// Accessor is the submitter's ACL token accessor (never its secret); the
	// leader admits the job only while that token still exists.
	Accessor string `json:"accessor,omitempty"`
	// Grants is the version of that token's grants (roles, policies) when
	// Nomad confirmed it may submit the job: passthrough admits the job only
	// while they are unchanged.
	Grants      string    `json:"grants,omitempty"`
	SubmittedAt time.Time `json:"submitted_at"`
	// Request is the register request body as the user sent it. The user's token
	// is never stored: the leader registers queued jobs with the broker's own.
	Request json.RawMessage `json:"request,omitempty"`
	// RequestBytes is Request's length where the store keeps Request apart
	// from the entry's other facts (0: kept with them, as entries written
	// before were). A broker's copy of a long queue then follows the small
	// facts, and reads each request once.
	RequestBytes int `json:"request_bytes,omitempty"`
	// Packed is the request gzip-compressed, where a store holds it so
	// (Request is then nil): a broker's copy of 10,000 jobs of 20 KB holds
	// a third of their bytes. Body reads either.
	Packed []byte `json:"-"`
	// Parked is why Nomad refused the job when the leader registered it (or
	// why it cannot be read): it stays visible and removable, and no longer
	// waits or holds up the entries behind it.
	Parked   string    `json:"parked,omitempty"`
	ParkedAt time.Time `json:"parked_at,omitzero"`
	// ParkedByPolicy: parked because the policy in force rejects it (its
	// tenant or queue gone, a limit below it). A policy change never
	// deletes a queued job: it is decided again on every pass, and waits
	// in the queue again once the policy would take it.
	ParkedByPolicy bool `json:"parked_by_policy,omitempty"`
	// EstimatedStart is when it was expected to start when it was queued
	// (zero: unknown), to measure the estimate against what happened.
	EstimatedStart time.Time `json:"queued_estimate,omitzero"`
	// Stopping is the version (JobModifyIndex) of the running job that a
	// reclaim requeue stops (0: none). The entry waits while Nomad, as far
	// as the broker has seen, still runs the job. Admitted before the stop,
	// it would be stopped with it; decided on as the running job's
	// replacement, it would take back the GPUs it is giving up, ahead of the
	// job they were freed for. It waits StopWait from StoppingSince at most:
	// a stop that failed leaves the job running, and the entry is then
	// decided as its replacement.
	Stopping      uint64    `json:"stopping,omitempty"`
	StoppingSince time.Time `json:"stopping_since,omitzero"`

	// Admitting is when the leader claimed the entry to register it with
	// Nomad (zero: not yet). A claimed entry is changed: a cancel or stop
	// that read it before fails, and one after finds the job in Nomad.
	Admitting   time.Time `json:"admitting,omitzero"`
	ModifyIndex uint64    `json:"-"` // Consul's, for check-and-set
}

// Body is the entry's register request: Request, or Packed decompressed.
func (e Entry) Body() (json.RawMessage, error) {
	if e.Packed == nil {
		return e.Request, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(e.Packed))
	if err != nil {
		return nil, fmt.Errorf("queued request of %s: %w", e.ID, err)
	}
	body := bytes.NewBuffer(make([]byte, 0, e.RequestBytes))
	if _, err := body.ReadFrom(zr); err != nil {
		return nil, fmt.Errorf("queued request of %s: %w", e.ID, err)
	}
	return body.Bytes(), nil
}

// Size is the length of the entry's register request.
func (e Entry) Size() int {
	if e.RequestBytes > 0 {
		return e.RequestBytes
	}
	return len(e.Request)
}

// StopWait bounds how long a requeued entry waits for Nomad to stop the
// version it stops (Entry.Stopping); Nomad's event for a stop comes within
// seconds.
const StopWait = 2 * time.Minute

// ErrNotFound is returned for an id that is not queued (or not an id at all).
var ErrNotFound = errors.New("no such queued job")

// ErrTooLarge is an entry larger than the queue's store keeps.
var ErrTooLarge = errors.New("larger than the queue's store keeps")

// NewID returns a random (version 4) UUID in the form ValidID accepts: the
// ids of queued jobs and of reclaim decisions.
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ValidID reports whether id has the form of a queue id: a UUID in lower-case
// hex. Only such ids become Consul keys, so no request reaches a key outside
// the queue's prefix.
func ValidID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i, c := range id {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !('0' <= c && c <= '9' || 'a' <= c && c <= 'f'):
			return false
		}
	}
	return true
}

// AgingStep is how much waiting raises an entry: one queue band (10 priority
// points) per step, so nothing waits behind newer work forever.
const AgingStep = 30 * time.Minute

// HeldHours is what a GPU held now adds to its tenant's decayed GPU-hours in
// the fair share: a tenant that has just started long jobs must not take the
// next GPUs too, before their hours show in the decayed sum.
const HeldHours = 1.0

// Order sorts entries in admission order: effective queue priority (the queue's
// priority raised by age), then the tenant's share (used / guaranteed, lowest
// first), then age; parked entries last.
//
// With the policy's fair_share on, the share is the tenant's decayed
// GPU-hours (decayed, by tenant), plus HeldHours for each GPU it holds now,
// per guaranteed GPU. Age then raises an entry only into the band of a
// higher queue (to the highest queue priority it reaches). Within a band the
// share decides, so that a tenant flooding the queue does not get ahead by
// having the oldest entries.
// With fair_share's oldest_first_after too, a band is in three parts. First
// come entries their tenant's guarantee still holds (used + demand, in order
// of share). Then come entries that would borrow and have waited
// oldest_first_after, oldest first: a tenant that offers more than its
// guarantee must not wait without bound for borrowed GPUs. Last come the
// other borrowing entries in order of share. The first part keeps the guarantees what they are: old
// borrowing entries go ahead of the share, never of a guarantee.
func Order(entries []Entry, p *policy.Policy, used map[string]float64, decayed map[string]float64, now time.Time) {
	rank := rankOf(entries, p, used, decayed, now)
	// Move each entry to its place by following the permutation's cycles.
	for i := range rank {
		if rank[i] < 0 {
			continue
		}
		first := entries[i]
		at := i
		for {
			from := int(rank[at])
			rank[at] = -1
			if from == i {
				entries[at] = first
				break
			}
			entries[at] = entries[from]
			at = from
		}
	}
}

// rankOf is Order's order as indices into entries, which it leaves where
// they are: the i-th to be admitted is entries[rank[i]].
func rankOf(entries []Entry, p *policy.Policy, used map[string]float64, decayed map[string]float64, now time.Time) []int32 {
	entry := func(i int) *Entry { return &entries[i] }
	keys := orderKeys(nil, len(entries), entry, p, used, decayed, now)
	slices.SortFunc(keys, func(a, b orderKey) int { return compareKeys(a, b, entry) })
	rank := make([]int32, len(keys))
	for i, k := range keys {
		rank[i] = k.index
	}
	return rank
}

// An orderKey is an entry's place in the order, computed once, not at every
// comparison, without pointers (cheap to move, nothing for the collector to
// scan); index is the entry's.
type orderKey struct {
	share  float64
	at     int64
	prio   int
	index  int32
	parked bool
	tier   tier
}

// tier is the part of its band an entry is in (fair_share's
// oldest_first_after; without it every entry is in the first).
type tier uint8

const (
	guaranteed tier = iota
	borrowingLate
	borrowing
)

// orderKeys is the key of each of n entries, entry(i) being the i-th, in
// buf if it is large enough.
func orderKeys(buf []orderKey, n int, entry func(int) *Entry, p *policy.Policy, used map[string]float64, decayed map[string]float64, now time.Time) []orderKey {
	k := NewKeyer(p, used, decayed, now)
	keys := buf[:0]
	if cap(keys) < n {
		keys = make([]orderKey, n)
	}
	keys = keys[:n]
	for i := range keys {
		keys[i] = k.key(entry(i), int32(i))
	}
	return keys
}

// Keyer gives entries their place in Order's order one at a time, for a
// caller that merges runs of entries already in that order rather than
// sorting them all (the simulator's queue lists).
type Keyer struct {
	p             *policy.Policy
	used, decayed map[string]float64
	now           int64 // Unix nanoseconds: an entry's age is a subtraction
	fair          bool
	lateAfter     int64 // fair_share.oldest_first_after, nanoseconds; 0: no tiers
	priorities    []int
	lastQueue     string // entries come in runs of one queue: one lookup a run
	lastBase      int
	shares        map[string]float64
	lastTenant    string
	lastShare     float64
}

// NewKeyer orders as Order does with the same arguments.
func NewKeyer(p *policy.Policy, used map[string]float64, decayed map[string]float64, now time.Time) *Keyer {
	k := &Keyer{p: p, used: used, decayed: decayed, now: now.UnixNano(), fair: p.FairShare.Enabled && decayed != nil, shares: map[string]float64{}}
	if k.fair {
		k.lateAfter = int64(p.FairShare.OldestFirstAfter)
	}
	for _, q := range p.Queues {
		k.priorities = append(k.priorities, q.Priority)
	}
	return k
}

// OrderKey is an entry's place in the order.
type OrderKey struct {
	k  orderKey
	id string
}

// Key is e's place in the order.
func (k *Keyer) Key(e *Entry) OrderKey { return OrderKey{k.key(e, 0), e.ID} }

// Compare is the admission order of two keys, as Order sorts.
func (a OrderKey) Compare(b OrderKey) int {
	if c := compareFields(a.k, b.k); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

func (k *Keyer) key(e *Entry, index int32) orderKey {
	at := e.SubmittedAt.UnixNano()
	key := orderKey{k.share(e.Tenant), at, k.prio(e, at), index, e.Parked != "", guaranteed}
	if k.lateAfter > 0 && !k.withinGuarantee(e) {
		key.tier = borrowing
		if e.SubmittedAt.IsZero() || k.now-at >= k.lateAfter {
			key.tier, key.share = borrowingLate, 0
		}
	}
	return key
}

// withinGuarantee reports whether e's tenant would still be within its
// guarantee with e admitted.
func (k *Keyer) withinGuarantee(e *Entry) bool {
	t, ok := k.p.Tenants[e.Tenant]
	return ok && k.used[e.Tenant]+e.Demand <= t.Guaranteed.Total()+1e-9
}

// prio is e's priority, raised by its age (submitted at, Unix nanoseconds).
func (k *Keyer) prio(e *Entry, at int64) int {
	if e.Queue != k.lastQueue || k.lastQueue == "" {
		k.lastQueue, k.lastBase = e.Queue, 0
		if q, ok := k.p.Queues[e.Queue]; ok {
			k.lastBase = q.Priority
		}
	}
	base := k.lastBase
	age := time.Duration(k.now - at)
	if e.SubmittedAt.IsZero() {
		age = math.MaxInt64 // beyond UnixNano's range: as old as time.Time.Sub has it
	}
	aged := base + policy.MinPriorityGap*int(age/AgingStep)
	if !k.fair {
		return aged
	}
	band := base
	for _, q := range k.priorities {
		if q > band && q <= aged {
			band = q
		}
	}
	return band
}

// share is a tenant's share, the same for each of its entries: computed once.
func (k *Keyer) share(tenant string) float64 {
	if tenant == k.lastTenant && tenant != "" {
		return k.lastShare
	}
	if s, ok := k.shares[tenant]; ok {
		k.lastTenant, k.lastShare = tenant, s
		return s
	}
	s := 1.0
	if t, ok := k.p.Tenants[tenant]; ok {
		switch g := t.Guaranteed.Total(); {
		case k.fair && g == 0:
			s = math.MaxFloat64 / 2 // no guarantee: after every tenant with one
		case k.fair:
			s = (k.decayed[tenant] + HeldHours*k.used[tenant]) / g
		case g == 0:
			s = k.used[tenant] + 1 // no guarantee: after every tenant within its own
		default:
			s = k.used[tenant] / g
		}
	}
	k.shares[tenant], k.lastTenant, k.lastShare = s, tenant, s
	return s
}

// compareKeys is the admission order of two keys.
func compareKeys(a, b orderKey, entry func(int) *Entry) int {
	if c := compareFields(a, b); c != 0 {
		return c
	}
	return strings.Compare(entry(int(a.index)).ID, entry(int(b.index)).ID)
}

// compareFields is the admission order of two keys but for their ids.
func compareFields(a, b orderKey) int {
	switch {
	case a.parked != b.parked: // parked entries wait for nothing: after every waiting one
		if a.parked {
			return 1
		}
		return -1
	case a.prio != b.prio:
		return cmp.Compare(b.prio, a.prio)
	case a.tier != b.tier:
		return cmp.Compare(a.tier, b.tier)
	case a.share != b.share:
		return cmp.Compare(a.share, b.share)
	}
	return cmp.Compare(a.at, b.at)
}
