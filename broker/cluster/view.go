// Package cluster keeps the broker's view of the cluster current from Nomad's
// event stream: schedulable GPUs per node and model, and the GPU demand of every
// live job, from which it derives each tenant's usage.
package cluster

import (
	"sync"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// View is safe for concurrent use. It keeps aggregates up to date as events
// arrive, so that a usage snapshot costs per namespace and model, not per job.
type View struct {
	mu      sync.RWMutex
	nodes   map[string]node
	jobs    map[jobKey]job
	held    map[string]*byModel // GPUs live jobs hold, by namespace
	total   map[string]int      // GPUs live jobs hold, by model, all namespaces
	changed chan struct{}

	// Derived from nodes under one policy; recomputed when either changes.
	nodesDirty bool
	capPolicy  *policy.Policy
	capacity   policy.Quota
	maxAlloc   policy.Quota
}

type node struct {
	schedulable bool
	gpus        map[string]int // healthy GPUs by model
}

type jobKey struct{ namespace, id string }

// job is a live job's demand by model ("" when it names none).
type job struct {
	demand   map[string]int
	borrowed bool
}

type byModel struct {
	held, borrowed map[string]int
}

// NewView returns an empty view.
func NewView() *View {
	return &View{nodes: map[string]node{}, jobs: map[jobKey]job{}, held: map[string]*byModel{}, total: map[string]int{},
		changed: make(chan struct{}, 1), nodesDirty: true}
}

// Changed is signalled (at most one pending signal) whenever the view changes.
func (v *View) Changed() <-chan struct{} { return v.changed }

func (v *View) notify() {
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// Reset replaces the whole view, after a full listing.
func (v *View) Reset(nodes []*api.Node, jobs []*api.Job) {
	v.mu.Lock()
	v.nodes, v.jobs, v.held, v.total, v.nodesDirty = map[string]node{}, map[jobKey]job{}, map[string]*byModel{}, map[string]int{}, true
	v.mu.Unlock()
	for _, n := range nodes {
		v.ObserveNode(n)
	}
	for _, j := range jobs {
		v.ObserveJob(j)
	}
	v.notify()
}

// ObserveNode records a node's schedulable, healthy GPUs.
func (v *View) ObserveNode(n *api.Node) {
	nd := node{schedulable: n.Status == api.NodeStatusReady && n.SchedulingEligibility != api.NodeSchedulingIneligible,
		gpus: map[string]int{}}
	if n.NodeResources != nil {
		for _, d := range n.NodeResources.Devices {
			if _, ok := nomadjob.IsGPU(d.Vendor + "/" + d.Type); !ok {
				continue
			}
			for _, inst := range d.Instances {
				if inst.Healthy {
					nd.gpus[d.Name]++
				}
			}
		}
	}
	v.mu.Lock()
	v.nodes[n.ID], v.nodesDirty = nd, true
	v.mu.Unlock()
	v.notify()
}

// ForgetNode drops a deregistered node.
func (v *View) ForgetNode(id string) {
	v.mu.Lock()
	delete(v.nodes, id)
	v.nodesDirty = true
	v.mu.Unlock()
	v.notify()
}

// ObserveJob records a job's GPU demand while it is live (not stopped, not dead).
func (v *View) ObserveJob(j *api.Job) {
	if j.ID == nil {
		return
	}
	ns := nomadjob.Namespace(j, "")
	key := jobKey{ns, *j.ID}
	live := !(j.Stop != nil && *j.Stop) && !(j.Status != nil && *j.Status == "dead")
	demand := map[string]int{}
	for _, g := range nomadjob.Admission(j, ns).Groups {
		demand[g.Model] += g.Count * g.GPUsPerAlloc
	}
	v.mu.Lock()
	v.remove(key)
	if live && len(demand) > 0 {
		jb := job{demand: demand, borrowed: j.Meta[nomadjob.MetaBorrowed] == "true"}
		v.jobs[key] = jb
		v.account(key.namespace, jb, 1)
	}
	v.mu.Unlock()
	v.notify()
}

// ForgetJob drops a deregistered job.
func (v *View) ForgetJob(namespace, id string) {
	v.mu.Lock()
	v.remove(jobKey{namespace, id})
	v.mu.Unlock()
	v.notify()
}

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
	if v.nodesDirty || v.capPolicy != p {
		v.capacity, v.maxAlloc = v.nodeTotals(p)
		v.capPolicy, v.nodesDirty = p, false
	}
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Idle: policy.Quota{}, MaxAlloc: copyQuota(v.maxAlloc)}
	except, hasExcept := v.jobs[jobKey{namespace, id}]
	var exceptDemand policy.Quota
	if hasExcept {
		exceptDemand = classify(p, except.demand)
	}
	held := classify(p, v.total)
	if hasExcept {
		sub(held, exceptDemand)
	}
	for class, c := range v.capacity {
		u.Idle[class] = max(c-held[class], 0)
	}
	namespaces := v.namespacesToReport(p, namespace)
	for _, ns := range namespaces {
		agg, ok := v.held[ns]
		t := p.TenantOf(ns)
		if !ok || t == nil {
			continue
		}
		demand, borrowed := classify(p, agg.held), classify(p, agg.borrowed)
		if hasExcept && ns == namespace {
			sub(demand, exceptDemand)
			if except.borrowed {
				sub(borrowed, exceptDemand)
			}
		}
		tu := u.Tenants[t.Name]
		tu.Used = add(tu.Used, demand)
		tu.Borrowed = add(tu.Borrowed, borrowed)
		u.Tenants[t.Name] = tu
	}
	return u
}

// namespacesToReport is every namespace with jobs, or those of namespace's tenant.
func (v *View) namespacesToReport(p *policy.Policy, namespace string) []string {
	if namespace != "" {
		if t := p.TenantOf(namespace); t != nil {
			return t.Namespaces
		}
		return nil
	}
	out := make([]string, 0, len(v.held))
	for ns := range v.held {
		out = append(out, ns)
	}
	return out
}

// nodeTotals sums schedulable, healthy GPUs by class, and the most on one node.
func (v *View) nodeTotals(p *policy.Policy) (capacity, maxAlloc policy.Quota) {
	capacity, maxAlloc = policy.Quota{}, policy.Quota{}
	for _, n := range v.nodes {
		if !n.schedulable {
			continue
		}
		perNode := classify(p, n.gpus)
		for class, count := range perNode {
			capacity[class] += count
			maxAlloc[class] = max(maxAlloc[class], count)
		}
	}
	return capacity, maxAlloc
}

// account adds (sign 1) or removes (-1) a job's demand from its namespace's totals.
func (v *View) account(ns string, j job, sign int) {
	agg := v.held[ns]
	if agg == nil {
		agg = &byModel{held: map[string]int{}, borrowed: map[string]int{}}
		v.held[ns] = agg
	}
	for model, n := range j.demand {
		agg.held[model] += sign * n
		v.total[model] += sign * n
		if j.borrowed {
			agg.borrowed[model] += sign * n
		}
	}
}

func (v *View) remove(key jobKey) {
	if old, ok := v.jobs[key]; ok {
		v.account(key.namespace, old, -1)
		delete(v.jobs, key)
	}
}

// classify turns GPUs by model into a quota: all GPUs, and per class.
func classify(p *policy.Policy, byModel map[string]int) policy.Quota {
	q := policy.Quota{}
	for model, n := range byModel {
		if n == 0 {
			continue
		}
		q[policy.AllGPUs] += n
		if c := p.ClassOf(model); c != "" {
			q[c] += n
		}
	}
	return q
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

// Capacity is the number of schedulable, healthy GPUs.
func (v *View) Capacity() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	total := 0
	for _, n := range v.nodes {
		if n.schedulable {
			for _, c := range n.gpus {
				total += c
			}
		}
	}
	return total
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
