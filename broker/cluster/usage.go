package cluster

import (
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Usage is the admission snapshot under a policy. A live job counts with its
// whole declared demand, placed or not, so that two quick submissions cannot
// both take the same GPUs or the same quota.
func (v *View) Usage(p *policy.Policy) admission.Usage { return v.UsageWithout(p, "", "") }

// UsageWithout is Usage as if the job namespace/id did not exist: the snapshot
// for deciding on a new version of that job. With a namespace, only the tenant
// owning it is reported (all a decision needs), so the cost does not grow with
// the number of tenants.
func (v *View) UsageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.usageWithout(p, namespace, id)
}

// UsageFor is UsageWithout j's own usage, with the nodes j may use as
// admission places it on them: what a preview decides against.
func (v *View) UsageFor(p *policy.Policy, j admission.Job) admission.Usage {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.usageFor(p, j)
}

// usageIn is UsageFor with what j's region holds back (region: its name
// and drain, as Regions knows them).
func (v *View) usageIn(p *policy.Policy, j admission.Job, region admission.Region) admission.Usage {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.regionUsage(p, j, region)
}

// regionUsage is usageFor with region, completed with what the view knows
// of the job there: whether it runs, and what its tenant holds without it.
// The caller holds v.mu.
func (v *View) regionUsage(p *policy.Policy, j admission.Job, region admission.Region) admission.Usage {
	u := v.usageFor(p, j)
	region.Running = v.running(jobKey{j.Namespace, j.ID})
	if t := p.TenantOf(j.Namespace); t != nil {
		region.Held = u.Tenants[t.Name].Used.Total()
	}
	u.Region = region
	return u
}

func (v *View) usageFor(p *policy.Policy, j admission.Job) admission.Usage {
	u := v.usageWithout(p, j.Namespace, j.ID)
	u.Nodes, u.Now = v.nodeRooms(j.Where, jobKey{j.Namespace, j.ID}), v.clock.Now()
	return u
}

func (v *View) usageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	u, c := v.usageOf(p, namespace, id)
	u.Idle, u.MaxAlloc = policy.Quota{}, copyQuota(v.maxAlloc)
	held := c.classify(v.total)
	sub(held, c.exceptDemand)
	for _, byNS := range c.extra {
		add(held, c.classify(byNS))
	}
	for class, n := range v.capacity {
		u.Idle[class] = max(n-held[class], 0)
	}
	return u
}

// tenantUsage is what namespace's tenant holds in the view without the job
// namespace/id, as UsageWithout reports it, without the idle GPUs and node
// sizes around it: what a decision in another region reads of this one.
func (v *View) tenantUsage(p *policy.Policy, namespace, id string) admission.TenantUsage {
	v.mu.Lock()
	defer v.mu.Unlock()
	u, _ := v.usageOf(p, namespace, id)
	if t := p.TenantOf(namespace); t != nil {
		return u.Tenants[t.Name]
	}
	return admission.TenantUsage{}
}

// counting is what usageOf counted a usage's tenants by.
type counting struct {
	classify     func(byModel map[string]int) policy.Quota
	extra        map[string]map[string]int // what live reservations add beyond the jobs' recorded demand, by namespace
	exceptDemand policy.Quota
}

// usageOf is the usage's tenants (those of namespace's tenant, or every
// one) without the job namespace/id, and what they were counted by. The
// caller holds v.mu.
func (v *View) usageOf(p *policy.Policy, namespace, id string) (admission.Usage, counting) {
	if v.nodesDirty || v.capPolicy != p {
		v.replicas = v.nodes.sharedReplicas()
		v.capacity, v.maxAlloc = v.nodes.totals(p, v.replicas)
		v.capPolicy, v.nodesDirty = p, false
	}
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Replicas: v.replicas}
	c := counting{classify: func(byModel map[string]int) policy.Quota { return classify(p, byModel, u) }, exceptDemand: policy.Quota{}}
	except := jobKey{namespace, id}
	var extraBorrowed map[string]map[string]int
	c.extra, extraBorrowed = v.reservationExtra(except)
	exceptBorrowed := false
	if old, ok := v.jobs.live[except]; ok {
		c.exceptDemand, exceptBorrowed = c.classify(old.demand), old.borrowed
	}
	for _, ns := range v.namespacesToReport(p, namespace, c.extra) {
		t := p.TenantOf(ns)
		if t == nil {
			continue
		}
		var demand, borrowed policy.Quota
		if agg, ok := v.held[ns]; ok {
			demand, borrowed = c.classify(agg.held), c.classify(agg.borrowed)
		} else {
			demand, borrowed = policy.Quota{}, policy.Quota{}
		}
		if ns == namespace {
			sub(demand, c.exceptDemand)
			if exceptBorrowed {
				sub(borrowed, c.exceptDemand)
			}
		}
		if len(c.extra[ns]) > 0 {
			add(demand, c.classify(c.extra[ns]))
			add(borrowed, c.classify(extraBorrowed[ns]))
		}
		tu := u.Tenants[t.Name]
		if tu.Used == nil { // its first namespace: demand and borrowed are this call's own
			tu.Used, tu.Borrowed = demand, borrowed
		} else {
			tu.Used, tu.Borrowed = add(tu.Used, demand), add(tu.Borrowed, borrowed)
		}
		if v.overBudget != nil {
			tu.OverBudget = v.overBudget(t.Name)
		}
		if v.owedSince != nil {
			tu.OwedSince = v.owedSince(t.Name)
		}
		u.Tenants[t.Name] = tu
	}
	v.addUnsettled(p, namespace, u, c)
	return u, c
}

// addUnsettled adds to u's tenants (namespace's alone, with a namespace) the
// GPUs of their jobs dropped with the region (lost). The caller holds v.mu.
func (v *View) addUnsettled(p *policy.Policy, namespace string, u admission.Usage, c counting) {
	var only *policy.Tenant
	if namespace != "" {
		if only = p.TenantOf(namespace); only == nil {
			return
		}
	}
	for key, gpus := range v.status.lost {
		t := p.TenantOf(key.namespace)
		if t == nil || (only != nil && t != only) {
			continue
		}
		tu := u.Tenants[t.Name]
		tu.Unsettled = add(tu.Unsettled, c.classify(gpus))
		u.Tenants[t.Name] = tu
	}
}

// namespacesToReport is every namespace with jobs or reservations, or those of
// namespace's tenant.
func (v *View) namespacesToReport(p *policy.Policy, namespace string, extra map[string]map[string]int) []string {
	if namespace != "" {
		if t := p.TenantOf(namespace); t != nil {
			return t.Namespaces
		}
		return nil
	}
	out := make([]string, 0, len(v.held)+len(extra))
	for ns := range v.held {
		out = append(out, ns)
	}
	for ns := range extra {
		if _, ok := v.held[ns]; !ok {
			out = append(out, ns)
		}
	}
	return out
}

// classify turns devices by model into a quota: all GPUs, and per class, a
// replica counting as its share of a GPU (u.Share).
func classify(p *policy.Policy, byModel map[string]int, u admission.Usage) policy.Quota {
	q := policy.Quota{}
	for model, n := range byModel {
		if n == 0 {
			continue
		}
		gpus := float64(n) * modelShare(model, u)
		q[policy.AllGPUs] += gpus
		if c := p.ClassOf(model); c != "" {
			q[c] += gpus
		}
	}
	return q
}

// modelShare is the part of a GPU one device of model is (u.Share): a
// replica of a shared group, or of any one (nomadjob.SharedSuffix alone).
func modelShare(model string, u admission.Usage) float64 {
	g := admission.Group{Model: model, Shared: strings.HasSuffix(model, nomadjob.SharedSuffix)}
	if model == nomadjob.SharedSuffix {
		g.Model = ""
	}
	return u.Share(g)
}

func sub(q, d policy.Quota) {
	for k, n := range d {
		q[k] -= n
	}
}

func copyQuota(q policy.Quota) policy.Quota {
	out := make(policy.Quota, len(q))
	for k, n := range q {
		out[k] = n
	}
	return out
}

func add(q, d policy.Quota) policy.Quota {
	if q == nil {
		q = policy.Quota{}
	}
	for k, n := range d {
		q[k] += n
	}
	return q
}
