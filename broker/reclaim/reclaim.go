// Package reclaim decides which running GPU allocations to release under the
// policy's reclaim rules: idle, past their lifetime, on a sick GPU,
// crash-looping, or never admitted. It is pure: the leader feeds it what it
// observed (allocations, per-GPU utilisation, device health) and carries out
// the decisions it returns.
package reclaim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Alloc is a running allocation that holds GPUs, as the leader observed it.
type Alloc struct {
	ID, Namespace, JobID, Group string
	// Admitted: the job's admission stamp verifies; Tenant, Queue and
	// Workload are then the broker's, else "" (never the user's meta).
	Admitted                bool
	Tenant, Queue, Workload string
	// Borrowed: admitted as borrowed (from the verified stamp).
	Borrowed bool
	// Priority is its job's priority in Nomad, at the version read.
	Priority int
	// Preempted: Nomad evicted the allocation for a higher priority one; it
	// holds its GPUs no more, and only the built-in rule looks at it.
	Preempted bool
	StartedAt time.Time
	// EndedAt: an allocation that ended at this time (the usage ledger's
	// only; zero for every running one, and one being stopped).
	EndedAt time.Time
	// TTL is the lifetime the job asks for (meta nomad-gpu.ttl), 0 if none.
	TTL time.Duration
	// GPUs are the device ids the allocation holds.
	GPUs []string
	// Restarts are the times its tasks restarted.
	Restarts []time.Time
	// Undeclared says how its job would use GPUs it does not ask for (it
	// then holds none in Nomad's accounting); "" for a GPU allocation.
	Undeclared string
	// Region is the Nomad region it runs in, when it is not the broker's
	// own ("").
	Region string
}

// GPU is one GPU's latest state.
type GPU struct {
	Utilization float64 // percent, from the latest sample
	Healthy     bool
	Model       string
	// Replicas: the device is one of this many time-sliced replicas of its
	// GPU (0 or 1: a whole GPU).
	Replicas int
}

// Share is the part of a physical GPU the device is.
func (g GPU) Share() float64 {
	if g.Replicas > 1 {
		return 1 / float64(g.Replicas)
	}
	return 1
}

// Decision is a rule's verdict on allocations of one job.
type Decision struct {
	Rule      string
	Action    policy.Action
	Mode      policy.Mode
	Condition policy.Condition
	Namespace string
	JobID     string
	Region    string // the job's Nomad region ("": the broker's own)
	// Allocs are the allocations the decision is about; WholeJob is true when
	// they are every GPU allocation of the job (a stop then stops the job).
	Allocs   []string
	WholeJob bool
	Tenant   string
	Queue    string
	GPUs     int
	Evidence string
	ActAfter time.Time
}

// Engine keeps what decisions need across passes: since when each allocation
// has been idle, each GPU unhealthy, and which conditions already raised a
// decision (raised again only after they clear).
type Engine struct {
	idleSince      map[[2]string]time.Time // by rule and allocation: each rule has its threshold
	unhealthySince map[string]time.Time    // by GPU id
	raised         map[[2]string]bool      // rule, allocation
	overSince      map[string]time.Time    // by tenant: over its limit since
	roomSince      map[[2]string]time.Time // by waiting job: needing its tenant's lower work's GPUs since
	going          map[string]bool         // allocations an over-limit or make-room decision is about
}

// New returns an engine with nothing observed.
func New() *Engine {
	return &Engine{idleSince: map[[2]string]time.Time{}, unhealthySince: map[string]time.Time{}, raised: map[[2]string]bool{},
		overSince: map[string]time.Time{}, roomSince: map[[2]string]time.Time{}, going: map[string]bool{}}
}

// Pass observes allocs (every running GPU allocation, by job) and gpus (by
// device id) at now, and returns the new decisions under rules.
func (e *Engine) Pass(now time.Time, rules []*policy.ReclaimRule, allocs []Alloc, gpus map[string]GPU) []Decision {
	rules = append(rules[:len(rules):len(rules)], policy.PreemptedBorrowed)
	// present: the allocations of this pass; with rules, every pair of a
	// rule and an allocation that the state kept between passes may name.
	present := make(map[string]bool, len(allocs))
	for _, a := range allocs {
		present[a.ID] = true
	}
	e.observe(now, rules, allocs, present, gpus)
	var out []Decision
	jobs := jobsInOrder(allocs) // once a pass, not once a rule
	for _, r := range rules {
		for _, job := range jobs {
			var hit []Alloc
			var evidence []string
			for _, i := range job {
				a := allocs[i]
				why, ok := e.matches(now, r, a, gpus)
				key := [2]string{r.Name, a.ID}
				if !ok {
					if len(e.raised) > 0 {
						delete(e.raised, key) // cleared: it may be raised again when it recurs
					}
					continue
				}
				if e.raised[key] {
					continue
				}
				e.raised[key] = true
				hit = append(hit, a)
				evidence = append(evidence, a.ID+": "+why)
			}
			if len(hit) > 0 {
				out = append(out, decision(now, r, hit, len(hit) == len(job), evidence))
			}
		}
	}
	for k := range e.raised {
		if !present[k[1]] || !slices.ContainsFunc(rules, func(r *policy.ReclaimRule) bool { return r.Name == k[0] }) {
			delete(e.raised, k) // the allocation or the rule is gone
		}
	}
	return out
}

// Raised marks rule's condition as already decided for allocs: a decision
// recorded earlier (by another leader) is not raised again until it clears.
func (e *Engine) Raised(rule string, allocs []string) {
	for _, a := range allocs {
		e.raised[[2]string{rule, a}] = true
		if rule == policy.OverLimit.Name || rule == policy.MakeRoom.Name {
			e.going[a] = true
		}
	}
}

// Retract forgets that d was raised, when it could not be recorded: the next
// pass raises it again.
func (e *Engine) Retract(d Decision) {
	for _, a := range d.Allocs {
		delete(e.raised, [2]string{d.Rule, a})
		delete(e.going, a)
	}
}

// OverLimit returns, under policy over_limit = "reclaim", the decisions
// that requeue the work of each tenant over its limit (raised by extra, what
// approvals in force grant it), or over a cap of a region (home names the
// broker's own). Whole jobs go, until what is left is within. Work no decision covers (unadmitted, in the tenant's namespaces)
// goes first and at once: over_limit_grace is for admitted work that grew
// past the limit late (a lowered limit, a revert Nomad made), not for work
// nobody admitted. Admitted work goes once the tenant has been over for
// over_limit_grace: borrowed first, then the lowest band, then the newest.
// Work already decided on counts as going.
func (e *Engine) OverLimit(now time.Time, p *policy.Policy, allocs []Alloc, gpus map[string]GPU, extra map[string]float64, home string) []Decision {
	_, byJob := e.holdings(allocs, gpus)
	uncovered := map[[2]string][]Alloc{}
	for _, a := range allocs {
		if t := p.TenantOf(a.Namespace); t != nil && !a.Preempted && !a.Admitted && len(a.GPUs) > 0 {
			uncovered[jobOf(a)] = append(uncovered[jobOf(a)], a)
		}
	}
	names := make([]string, 0, len(p.Tenants))
	for name := range p.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []Decision
	for _, name := range names {
		t := p.Tenants[name]
		scopes := []limitScope{{limit: t.Limit.Total() + extra[name]}}
		for _, region := range slices.Sorted(maps.Keys(t.RegionLimits)) {
			scopes = append(scopes, limitScope{region: region, limit: t.RegionLimits[region]})
		}
		for _, sc := range scopes {
			key := name + "\x00" + sc.region
			in := func(a Alloc) bool { return sc.region == "" || cmp.Or(a.Region, home) == sc.region }
			admitted := within(victims(p, byJob, name), byJob, in)
			nobody := within(newestFirst(uncovered, p, name), uncovered, in)
			over := holding(admitted, byJob, gpus) + holding(nobody, uncovered, gpus) - sc.limit
			if p.OverLimit != policy.OverReclaim || over <= 1e-9 {
				delete(e.overSince, key)
				continue
			}
			where := fmt.Sprintf("its limit of %g", sc.limit)
			if sc.region != "" {
				where = fmt.Sprintf("its cap of %g in region %s", sc.limit, sc.region)
			}
			over = e.requeue(now, &out, nobody, uncovered, gpus, over, func(held float64) string {
				return fmt.Sprintf("tenant %q holds %g GPUs, above %s, with work no decision of the broker's covers (unadmitted, in its namespaces): that work is requeued at once, newest first, until it is within",
					name, held, where)
			}, over+sc.limit)
			if over <= 1e-9 {
				delete(e.overSince, key)
				continue
			}
			since, ok := e.overSince[key]
			if !ok {
				since, e.overSince[key] = now, now
			}
			if now.Sub(since) < p.OverLimitGrace {
				continue
			}
			e.requeue(now, &out, admitted, byJob, gpus, over, func(held float64) string {
				return fmt.Sprintf("tenant %q holds %g GPUs, above %s, since %s (over_limit = %q, grace %s): its newest work is requeued, borrowed and lowest band first, until it is within",
					name, held, where, since.UTC().Format(time.RFC3339), p.OverLimit, p.OverLimitGrace)
			}, over+sc.limit)
		}
	}
	return out
}

// limitScope is a limit of a tenant's: its whole one (region ""), or a
// region's cap.
type limitScope struct {
	region string
	limit  float64
}

// within are the jobs of order (keys of byJob) that in takes.
func within(order [][2]string, byJob map[[2]string][]Alloc, in func(Alloc) bool) [][2]string {
	var out [][2]string
	for _, k := range order {
		if in(byJob[k][0]) {
			out = append(out, k)
		}
	}
	return out
}

// holding is what jobs hold.
func holding(jobs [][2]string, byJob map[[2]string][]Alloc, gpus map[string]GPU) float64 {
	n := 0.0
	for _, k := range jobs {
		for _, a := range byJob[k] {
			n += share(a, gpus)
		}
	}
	return n
}

// requeue decides on jobs, in order, until over is gone, and returns what
// is left of it; a job decided on already counts as going. why tells the
// evidence of a tenant holding total.
func (e *Engine) requeue(now time.Time, out *[]Decision, jobs [][2]string, byJob map[[2]string][]Alloc, gpus map[string]GPU, over float64, why func(total float64) string, total float64) float64 {
	for _, job := range jobs {
		if over <= 1e-9 {
			break
		}
		hit := byJob[job]
		decided := false
		for _, a := range hit {
			over -= share(a, gpus)
			decided = decided || e.going[a.ID]
		}
		if decided {
			continue
		}
		for _, a := range hit {
			e.going[a.ID] = true
		}
		*out = append(*out, decision(now, policy.OverLimit, hit, true, []string{why(total)}))
	}
	return over
}

// newestFirst are the jobs of byJob in tenant's namespaces, the newest
// first.
func newestFirst(byJob map[[2]string][]Alloc, p *policy.Policy, tenant string) [][2]string {
	var out [][2]string
	for k, allocs := range byJob {
		if t := p.TenantOf(allocs[0].Namespace); t != nil && t.Name == tenant {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := newest(byJob[out[i]]), newest(byJob[out[j]])
		if !a.Equal(b) {
			return a.After(b)
		}
		return out[i][0]+"/"+out[i][1] < out[j][0]+"/"+out[j][1]
	})
	return out
}

// newest is when the last of allocs started.
func newest(allocs []Alloc) time.Time {
	var t time.Time
	for _, a := range allocs {
		if a.StartedAt.After(t) {
			t = a.StartedAt
		}
	}
	return t
}

// holdings are the GPUs each tenant's admitted work holds, and that work by
// job; it forgets decisions on allocations no longer there.
func (e *Engine) holdings(allocs []Alloc, gpus map[string]GPU) (map[string]float64, map[[2]string][]Alloc) {
	held := map[string]float64{}
	byJob := map[[2]string][]Alloc{}
	live := map[string]bool{}
	for _, a := range allocs {
		if a.Preempted || !a.Admitted || a.Tenant == "" {
			continue
		}
		live[a.ID] = true
		held[a.Tenant] += share(a, gpus)
		k := jobOf(a)
		byJob[k] = append(byJob[k], a)
	}
	for id := range e.going {
		if !live[id] {
			delete(e.going, id)
		}
	}
	return held, byJob
}

// Waiting is a tenant's job in the broker's queue, as make-room weighs it.
type Waiting struct {
	Namespace, JobID, Tenant, Queue string
	GPUs                            float64
}

// MakeRoom returns, under policy make_room = "reclaim", the decisions that
// requeue a tenant's own work in the way of its queued job. That job (taken
// by band, highest first, then in the order given) is one the tenant's
// guarantee would hold were its work of lower bands gone, once it has
// waited make_room_grace. As little goes as the job needs: borrowed first,
// then the lowest band, then the newest; never another tenant's work, nor
// the tenant's work of the job's band or above. Work already decided on
// counts as gone.
// Long: one pass over the waiting jobs whose choices share what is already taken.
func (e *Engine) MakeRoom(now time.Time, p *policy.Policy, allocs []Alloc, gpus map[string]GPU, waiting []Waiting) []Decision {
	held, byJob := e.holdings(allocs, gpus)
	for _, as := range byJob {
		for _, a := range as {
			if e.going[a.ID] {
				held[a.Tenant] -= share(a, gpus)
			}
		}
	}
	band := func(queue string) int {
		if q := p.Queues[queue]; q != nil {
			return q.Band
		}
		return 0
	}
	waiting = slices.Clone(waiting)
	sort.SliceStable(waiting, func(i, j int) bool { return band(waiting[i].Queue) > band(waiting[j].Queue) })
	seen := map[[2]string]bool{}
	first := map[string]bool{}           // tenants whose higher job still has its grace: it goes first
	byTenant := map[string][][2]string{} // each tenant's jobs in victims' order
	var out []Decision
	for _, w := range waiting {
		key := [2]string{w.Namespace, w.JobID}
		seen[key] = true
		t := p.Tenants[w.Tenant]
		if p.MakeRoom != policy.OverReclaim || t == nil || first[w.Tenant] {
			delete(e.roomSince, key)
			continue
		}
		guarantee := t.Guaranteed.Total()
		if held[w.Tenant]+w.GPUs <= guarantee+1e-9 {
			held[w.Tenant] += w.GPUs // the queue admits it: the room is its
			delete(e.roomSince, key)
			continue
		}
		var in [][2]string
		before := held[w.Tenant]
		room := guarantee - before
		order, ok := byTenant[w.Tenant]
		if !ok { // once a tenant: a long queue has many entries of one tenant
			order = victims(p, byJob, w.Tenant)
			byTenant[w.Tenant] = order
		}
		for _, job := range order {
			if room >= w.GPUs-1e-9 {
				break
			}
			if a := byJob[job][0]; band(a.Queue) >= band(w.Queue) || e.going[a.ID] {
				continue
			}
			in = append(in, job)
			for _, a := range byJob[job] {
				room += share(a, gpus)
			}
		}
		if room < w.GPUs-1e-9 {
			delete(e.roomSince, key) // its tenant's own lower work would not make room enough
			continue
		}
		since, ok := e.roomSince[key]
		if !ok {
			since, e.roomSince[key] = now, now
		}
		if now.Sub(since) < p.MakeRoomGrace {
			first[w.Tenant] = true
			continue
		}
		delete(e.roomSince, key)
		held[w.Tenant] = guarantee - room + w.GPUs
		why := fmt.Sprintf("tenant %q's job %s/%s (queue %s, %g GPUs) has waited since %s with %g of its guarantee of %g GPUs held (make_room = %q, grace %s): its own lower-band work is requeued, borrowed, lowest band and newest first, until the job fits",
			w.Tenant, w.Namespace, w.JobID, w.Queue, w.GPUs, since.UTC().Format(time.RFC3339), before, guarantee, p.MakeRoom, p.MakeRoomGrace)
		for _, job := range in {
			for _, a := range byJob[job] {
				e.going[a.ID] = true
			}
			out = append(out, decision(now, policy.MakeRoom, byJob[job], true, []string{why}))
		}
	}
	for key := range e.roomSince {
		if !seen[key] {
			delete(e.roomSince, key)
		}
	}
	return out
}

// victims are a tenant's jobs in the order over-limit and make-room requeue
// them: borrowed first, then by band, then the newest.
func victims(p *policy.Policy, byJob map[[2]string][]Alloc, tenant string) [][2]string {
	var out [][2]string
	for k, allocs := range byJob {
		if allocs[0].Tenant == tenant {
			out = append(out, k)
		}
	}
	band := func(a Alloc) int {
		if q := p.Queues[a.Queue]; q != nil {
			return q.Band
		}
		return 0
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := byJob[out[i]][0], byJob[out[j]][0]
		switch {
		case a.Borrowed != b.Borrowed:
			return a.Borrowed
		case band(a) != band(b):
			return band(a) < band(b)
		case !newest(byJob[out[i]]).Equal(newest(byJob[out[j]])):
			return newest(byJob[out[i]]).After(newest(byJob[out[j]]))
		}
		return out[i][0]+"/"+out[i][1] < out[j][0]+"/"+out[j][1]
	})
	return out
}

// share is the GPUs an allocation holds, a replica as its share.
func share(a Alloc, gpus map[string]GPU) float64 {
	n := 0.0
	for _, id := range a.GPUs {
		n += gpus[id].Share()
	}
	return n
}

// observe brings the idle and health clocks up to now.
func (e *Engine) observe(now time.Time, rules []*policy.ReclaimRule, allocs []Alloc, present map[string]bool, gpus map[string]GPU) {
	idleRule := func(name string) bool {
		return slices.ContainsFunc(rules, func(r *policy.ReclaimRule) bool { return r.Condition == policy.CondIdle && r.Name == name })
	}
	for _, r := range rules {
		if r.Condition != policy.CondIdle {
			continue
		}
		for _, a := range allocs {
			key := [2]string{r.Name, a.ID}
			idle := len(a.GPUs) > 0
			for _, id := range a.GPUs {
				if g, ok := gpus[id]; !ok || g.Utilization >= r.IdleBelow {
					idle = false // no sample is not an idle sample
				}
			}
			if _, was := e.idleSince[key]; idle && !was {
				e.idleSince[key] = now
			} else if !idle && was {
				delete(e.idleSince, key) // one busy sample resets it
			}
		}
	}
	for key := range e.idleSince {
		if !present[key[1]] || !idleRule(key[0]) {
			delete(e.idleSince, key)
		}
	}
	for id, g := range gpus {
		if _, was := e.unhealthySince[id]; !g.Healthy && !was {
			e.unhealthySince[id] = now
		} else if g.Healthy {
			delete(e.unhealthySince, id)
		}
	}
	for id := range e.unhealthySince {
		if _, ok := gpus[id]; !ok {
			delete(e.unhealthySince, id)
		}
	}
}

// matches reports whether rule r holds for a, and the evidence.
func (e *Engine) matches(now time.Time, r *policy.ReclaimRule, a Alloc, gpus map[string]GPU) (string, bool) {
	if a.Preempted != (r.Condition == policy.CondPreempted) || !Selects(r, a) {
		return "", false
	}
	switch r.Condition {
	case policy.CondPreempted:
		if a.Admitted && a.Borrowed {
			return "preempted by Nomad while borrowing", true
		}
	case policy.CondIdle:
		since, ok := e.idleSince[[2]string{r.Name, a.ID}]
		if !ok || now.Sub(since) < r.IdleFor {
			return "", false
		}
		return fmt.Sprintf("every GPU below %g%% since %s (%s)", r.IdleBelow, since.UTC().Format(time.RFC3339), now.Sub(since).Round(time.Second)), true
	case policy.CondLifetime:
		if a.StartedAt.IsZero() {
			return "", false // not started: no lifetime yet
		}
		limit := lifetime(r, a)
		if age := now.Sub(a.StartedAt); age >= limit {
			return fmt.Sprintf("running since %s (%s), lifetime %s", a.StartedAt.UTC().Format(time.RFC3339), age.Round(time.Second), limit), true
		}
	case policy.CondUnhealthy:
		var sick []string
		for _, id := range a.GPUs {
			if since, ok := e.unhealthySince[id]; ok && now.Sub(since) >= r.DeviceUnhealthyFor {
				sick = append(sick, fmt.Sprintf("%s unhealthy since %s", id, since.UTC().Format(time.RFC3339)))
			}
		}
		if len(sick) > 0 {
			return strings.Join(sick, ", "), true
		}
	case policy.CondRestarts:
		n := 0
		for _, t := range a.Restarts {
			if now.Sub(t) <= r.Within {
				n++
			}
		}
		if n > r.RestartsAbove {
			return fmt.Sprintf("%d restarts within %s", n, r.Within), true
		}
	case policy.CondUnadmitted:
		if !a.Admitted && a.Undeclared != "" {
			return "uses GPUs without asking for them: " + a.Undeclared, true
		}
		if !a.Admitted {
			return "no valid admission stamp", true
		}
	}
	return "", false
}

// lifetime is how long rule r lets a run: its max_lifetime, or the job's
// own nomad-gpu.ttl up to max_lifetime + max_extend.
func lifetime(r *policy.ReclaimRule, a Alloc) time.Duration {
	if a.TTL > 0 {
		return min(a.TTL, r.MaxLifetime+r.MaxExtend)
	}
	return r.MaxLifetime
}

// Ends is when the first lifetime rule in enforce mode that selects a
// started allocation stops it (its grace included); false when none does.
func Ends(rules []*policy.ReclaimRule, a Alloc) (time.Time, bool) {
	var end time.Time
	for _, r := range rules {
		if r.Condition != policy.CondLifetime || r.Mode != policy.ModeEnforce || a.StartedAt.IsZero() || a.Preempted || !Selects(r, a) {
			continue
		}
		if at := a.StartedAt.Add(lifetime(r, a) + r.Grace); end.IsZero() || at.Before(end) {
			end = at
		}
	}
	return end, !end.IsZero()
}

// Selects applies the rule's selectors: whether r can ever decide on a. An
// unadmitted job has no tenant, queue or workload the broker can trust, so
// only a rule without selectors (or an unadmitted rule) reaches it.
func Selects(r *policy.ReclaimRule, a Alloc) bool {
	if r.Condition != policy.CondUnadmitted && !a.Admitted && (r.Workload != "" || r.Queue != "" || r.Tenant != "") {
		return false
	}
	return (r.Workload == "" || r.Workload == a.Workload) && (r.Queue == "" || r.Queue == a.Queue) &&
		(r.Tenant == "" || r.Tenant == a.Tenant)
}

func decision(now time.Time, r *policy.ReclaimRule, hit []Alloc, whole bool, evidence []string) Decision {
	d := Decision{Rule: r.Name, Action: r.Action, Mode: r.Mode, Condition: r.Condition, Namespace: hit[0].Namespace,
		JobID: hit[0].JobID, Region: hit[0].Region, WholeJob: whole, Tenant: hit[0].Tenant, Queue: hit[0].Queue,
		Evidence: strings.Join(evidence, "; "), ActAfter: now.Add(r.Grace)}
	for _, a := range hit {
		d.Allocs = append(d.Allocs, a.ID)
		d.GPUs += len(a.GPUs)
	}
	return d
}

// jobOf keys an allocation's job: its namespace (then region, so that a
// job of the same name in two regions is two jobs) and id.
func jobOf(a Alloc) [2]string {
	if a.Region == "" {
		return [2]string{a.Namespace, a.JobID}
	}
	return [2]string{a.Namespace + "\x00" + a.Region, a.JobID}
}

// jobsInOrder groups allocs (by index) by job, the jobs in order of
// namespace and id, each job's allocations in their order in allocs.
func jobsInOrder(allocs []Alloc) [][]int {
	keys, idx := make([][2]string, len(allocs)), make([]int, len(allocs))
	for i, a := range allocs {
		keys[i], idx[i] = jobOf(a), i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Or(strings.Compare(keys[a][0], keys[b][0]), strings.Compare(keys[a][1], keys[b][1]))
	})
	var out [][]int
	for i := 0; i < len(idx); {
		k := i + 1
		for k < len(idx) && keys[idx[k]] == keys[idx[i]] {
			k++
		}
		out = append(out, idx[i:k:k])
		i = k
	}
	return out
}
