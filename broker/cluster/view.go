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

// View is safe for concurrent use.
type View struct {
	mu      sync.RWMutex
	nodes   map[string]node
	jobs    map[jobKey]job
	changed chan struct{}
}

type node struct {
	schedulable bool
	gpus        map[string]int // healthy GPUs by model
}

type jobKey struct{ namespace, id string }

type job struct {
	groups   []admission.Group
	borrowed bool
}

// NewView returns an empty view.
func NewView() *View {
	return &View{nodes: map[string]node{}, jobs: map[jobKey]job{}, changed: make(chan struct{}, 1)}
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
	v.nodes, v.jobs = map[string]node{}, map[jobKey]job{}
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
	v.nodes[n.ID] = nd
	v.mu.Unlock()
	v.notify()
}

// ForgetNode drops a deregistered node.
func (v *View) ForgetNode(id string) {
	v.mu.Lock()
	delete(v.nodes, id)
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
	a := nomadjob.Admission(j, ns)
	v.mu.Lock()
	if live && len(a.Groups) > 0 {
		v.jobs[key] = job{groups: a.Groups, borrowed: j.Meta[nomadjob.MetaBorrowed] == "true"}
	} else {
		delete(v.jobs, key)
	}
	v.mu.Unlock()
	v.notify()
}

// ForgetJob drops a deregistered job.
func (v *View) ForgetJob(namespace, id string) {
	v.mu.Lock()
	delete(v.jobs, jobKey{namespace, id})
	v.mu.Unlock()
	v.notify()
}

// Usage is the admission snapshot under a policy. A live job counts with its
// whole declared demand, placed or not, so that two quick submissions cannot
// both take the same GPUs or the same quota.
func (v *View) Usage(p *policy.Policy) admission.Usage { return v.UsageWithout(p, "", "") }

// UsageWithout is Usage as if the job namespace/id did not exist: the snapshot
// for deciding on a new version of that job.
func (v *View) UsageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	v.mu.RLock()
	defer v.mu.RUnlock()
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Idle: policy.Quota{}, MaxAlloc: policy.Quota{}}
	capacity := policy.Quota{}
	for _, n := range v.nodes {
		if !n.schedulable {
			continue
		}
		perNode := policy.Quota{}
		for model, count := range n.gpus {
			perNode[policy.AllGPUs] += count
			if c := p.ClassOf(model); c != "" {
				perNode[c] += count
			}
		}
		for class, count := range perNode {
			capacity[class] += count
			if count > u.MaxAlloc[class] {
				u.MaxAlloc[class] = count
			}
		}
	}
	held := policy.Quota{}
	for key, j := range v.jobs {
		if key == (jobKey{namespace, id}) {
			continue
		}
		demand, _ := admission.Demand(p, admission.Job{Groups: j.groups})
		for class, n := range demand {
			held[class] += n
		}
		t := p.TenantOf(key.namespace)
		if t == nil {
			continue
		}
		tu := u.Tenants[t.Name]
		tu.Used = add(tu.Used, demand)
		if j.borrowed {
			tu.Borrowed = add(tu.Borrowed, demand)
		}
		u.Tenants[t.Name] = tu
	}
	for class, c := range capacity {
		u.Idle[class] = max(c-held[class], 0)
	}
	return u
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
