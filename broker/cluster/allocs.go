package cluster

import (
	"cmp"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Alloc is an allocation that holds GPUs: running or about to (pending,
// which includes a task waiting to restart), or evicted by Nomad's
// preemption (kept until Nomad collects it, so that the broker can requeue
// a borrowed job it evicted).
type Alloc struct {
	ID, Namespace, JobID, Group, NodeID string
	// CreateIndex is Nomad's index at its creation: a job modified after
	// it (JobModifyIndex above it) is a version it does not run. (Events
	// carry no job version: Nomad strips the job from them.)
	CreateIndex uint64
	// JobIndex is the JobModifyIndex of the job's live version in the view
	// when the allocation was read; 0 when the view holds no such GPU job.
	JobIndex  uint64
	Preempted bool
	// PreemptedAt is, for a preempted one, Nomad's index at its preemption
	// (AllocModifyIndex; a listing, which has none, gives ModifyIndex, at
	// or after it): a job registered after it has dealt with it. Its
	// CreateIndex does not tell: the broker's in-place changes of a running
	// job's priority (sub-bands, promotion) register the job again without
	// replacing its allocations.
	PreemptedAt uint64
	// GPUs are the device ids the allocation holds (held, for a preempted
	// one), and Tasks the task holding each.
	GPUs, Tasks []string
	StartedAt   time.Time // its first task's start; zero while none started
	Restarts    []time.Time
	// ModifyIndex orders what the listing and the events say of it.
	ModifyIndex uint64
	// Tenant and Queue are its job's, from a verified stamp ("" if not).
	Tenant, Queue string
	// EndedAt is when an ended allocation's tasks ended (EndedAllocs only);
	// zero while it is being stopped and its tasks still run.
	EndedAt time.Time
}

// ObserveAlloc records an allocation from an event or a listing (the
// listing's stubs with their resources carry all that is read here).
// Allocations changes are not signalled on Changed: admission counts jobs'
// demand, not allocations.
func (v *View) ObserveAlloc(a *api.Allocation) {
	v.mu.Lock()
	changed := v.observeAlloc(a, true)
	v.mu.Unlock()
	if changed {
		v.notify() // what stopped allocations held is free now
	}
}

// observeAlloc records a; fromEvent: what became of it is told (a listing
// says what is, not what happened). It reports whether the GPUs counted as
// used changed.
func (v *View) observeAlloc(a *api.Allocation, fromEvent bool) bool {
	old, had := v.allocs[a.ID]
	if had && a.ModifyIndex < old.ModifyIndex {
		return false
	}
	preempted := a.DesiredStatus == api.AllocDesiredStatusEvict && a.PreemptedByAllocation != ""
	live := a.DesiredStatus == api.AllocDesiredStatusRun &&
		(a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending)
	gpus, tasks := gpuIDs(a.AllocatedResources)
	tenant, queue := old.Tenant, old.Queue
	if j, ok := v.jobs.live[jobKey{a.Namespace, a.JobID}]; ok && !had {
		tenant, queue = j.tenant, j.queue
	}
	if fromEvent && v.allocEvent != nil && len(gpus) > 0 {
		ev := AllocEvent{Namespace: a.Namespace, Job: a.JobID, Tenant: tenant, Queue: queue, At: v.clock.Now()}
		if !had && a.PreviousAllocation != "" && live {
			ev.Event = "retried"
			v.allocEvent(ev)
		}
		if a.ClientStatus == api.AllocClientStatusRunning && live && (!had || old.StartedAt.IsZero()) {
			ev.Event = "running"
			v.allocEvent(ev)
		}
		switch {
		case had && !old.Preempted && preempted:
			ev.Event = "preempted"
			v.allocEvent(ev)
		case had && !old.Preempted && !live && !preempted:
			ev.Event = allocEnd(a)
			v.allocEvent(ev)
		}
	}
	// An allocation Nomad stops (its job stopped, updated or reclaimed)
	// holds its GPUs until its client says its tasks ended: a task may
	// checkpoint for its whole kill_timeout, and a job admitted meanwhile
	// would put its tenant over the limit. One stopped before its tasks ran
	// (pending) holds nothing, and its client may never report on it.
	holding := !preempted && (a.ClientStatus == api.AllocClientStatusRunning ||
		a.ClientStatus == api.AllocClientStatusPending && a.DesiredStatus == api.AllocDesiredStatusRun)
	changed := v.hold(a, holding)
	v.ended.track(a, old, had, live, v.clock)
	if (!preempted && !live) || len(gpus) == 0 {
		delete(v.allocs, a.ID)
		v.rooms = nil
		return changed
	}
	out := Alloc{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, Group: a.TaskGroup, NodeID: a.NodeID,
		CreateIndex: a.CreateIndex, Preempted: preempted, GPUs: gpus, Tasks: tasks, ModifyIndex: a.ModifyIndex, Tenant: tenant, Queue: queue}
	if preempted {
		out.PreemptedAt = cmp.Or(a.AllocModifyIndex, a.ModifyIndex)
	}
	for _, ts := range a.TaskStates {
		if ts == nil {
			continue
		}
		if !ts.StartedAt.IsZero() && (out.StartedAt.IsZero() || ts.StartedAt.Before(out.StartedAt)) {
			out.StartedAt = ts.StartedAt
		}
		for _, ev := range ts.Events {
			if ev != nil && ev.Type == api.TaskRestarting {
				out.Restarts = append(out.Restarts, time.Unix(0, ev.Time))
			}
		}
	}
	v.allocs[a.ID] = out
	v.rooms = nil
	return changed
}

// tasksEnded is when a's tasks ended by its client (the last to finish;
// the allocation's last change when none says), zero while they run.
func tasksEnded(a *api.Allocation) time.Time {
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
	default:
		return time.Time{}
	}
	var end time.Time
	for _, ts := range a.TaskStates {
		if ts != nil && ts.FinishedAt.After(end) {
			end = ts.FinishedAt
		}
	}
	if end.IsZero() && a.ModifyTime != 0 {
		end = time.Unix(0, a.ModifyTime)
	}
	return end
}

// EndedAlloc is what the usage ledger charges of an allocation Nomad says
// ended (complete, failed or lost) holding GPUs: its GPUs and its tasks'
// first start and last end by its client; false for any other.
func EndedAlloc(a *api.Allocation) (Alloc, bool) {
	gpus, _ := gpuIDs(a.AllocatedResources)
	end := tasksEnded(a)
	if len(gpus) == 0 || end.IsZero() {
		return Alloc{}, false
	}
	out := Alloc{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, Group: a.TaskGroup, NodeID: a.NodeID, GPUs: gpus, EndedAt: end}
	for _, ts := range a.TaskStates {
		if ts != nil && !ts.StartedAt.IsZero() && (out.StartedAt.IsZero() || ts.StartedAt.Before(out.StartedAt)) {
			out.StartedAt = ts.StartedAt
		}
	}
	return out, !out.StartedAt.IsZero()
}

// EndedAllocs returns the allocations that stopped holding GPUs within
// the last hour or are being stopped (EndedAt zero), with what they held
// while running, by id.
func (v *View) EndedAllocs() []Alloc {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.ended.list()
}

// hold records what a holds while holding (its client runs it, or is about
// to), and what it no longer holds otherwise; it reports whether the GPUs counted as used
// changed.
func (v *View) hold(a *api.Allocation, holding bool) bool {
	key := jobKey{a.Namespace, a.JobID}
	h := hold{key: key, created: a.CreateIndex}
	if holding && a.AllocatedResources != nil {
		h.byModel = map[string]int{}
		for _, t := range a.AllocatedResources.Tasks {
			for _, d := range t.Devices {
				if d != nil && nomadjob.IsGPUGroup(d.Vendor, d.Type) {
					h.byModel[d.Name] += len(d.DeviceIDs)
				}
			}
		}
	}
	v.holds.set(a.ID, h)
	return v.reexcess(key)
}

// AllocEvent is what became of a GPU allocation: Event is running (its
// first task started), complete, failed, lost, stopped, preempted, or
// retried (a replacement placed for one). Tenant and Queue are its job's,
// from a verified stamp, else "". At is when the view learned it (its
// clock).
type AllocEvent struct {
	Namespace, Job, Tenant, Queue, Event string
	At                                   time.Time
}

// allocEnd names how an allocation that held GPUs ended: complete, failed
// or lost by its tasks or its node, else stopped (by a user, a reclaim
// decision, a job update or a drain).
func allocEnd(a *api.Allocation) string {
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		if a.DesiredStatus == api.AllocDesiredStatusRun {
			return a.ClientStatus
		}
	}
	return "stopped"
}

// gpuIDs are the GPU device ids an allocation holds, and the task holding each.
func gpuIDs(r *api.AllocatedResources) (ids, tasks []string) {
	if r == nil {
		return nil, nil
	}
	for name, t := range r.Tasks {
		if t == nil {
			continue
		}
		for _, d := range t.Devices {
			if d != nil && nomadjob.IsGPUGroup(d.Vendor, d.Type) {
				ids = append(ids, d.DeviceIDs...)
				for range d.DeviceIDs {
					tasks = append(tasks, name)
				}
			}
		}
	}
	return ids, tasks
}

// GPUAllocs returns every allocation holding GPUs, by id, each with its
// job's live modify index.
func (v *View) GPUAllocs() []Alloc {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]Alloc, 0, len(v.allocs))
	for _, a := range v.allocs {
		a.JobIndex = v.jobs.live[jobKey{a.Namespace, a.JobID}].modifyIndex
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// NodeGPUs returns every GPU of a node, by device id.
func (v *View) NodeGPUs(nodeID string) map[string]GPU {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]GPU, len(v.nodes[nodeID].devices))
	for id, g := range v.nodes[nodeID].devices {
		out[id] = g
	}
	return out
}

// NodeInventory is what one node's GPUs of one model are doing.
type NodeInventory struct {
	Node, Pool, Model string
	Schedulable       bool
	// Total = Healthy + unhealthy; Allocated are held by running or
	// pending allocations; Free are healthy, unheld, on a schedulable node.
	Total, Healthy, Allocated, Free int
	// Unhealthy counts the unhealthy GPUs by why (GPU.Why).
	Unhealthy map[string]int
}

// Inventory returns, per node and model, its GPUs by state.
func (v *View) Inventory() []NodeInventory {
	v.mu.RLock()
	defer v.mu.RUnlock()
	held := v.holders()
	var out []NodeInventory
	for id, n := range v.nodes {
		byModel := map[string]*NodeInventory{}
		for dev, g := range n.devices {
			inv := byModel[g.Model]
			if inv == nil {
				inv = &NodeInventory{Node: id, Pool: n.pool, Model: g.Model, Schedulable: n.schedulable, Unhealthy: map[string]int{}}
				byModel[g.Model] = inv
			}
			inv.Total++
			if !g.Healthy {
				inv.Unhealthy[g.Why]++
			}
			_, isHeld := held[dev]
			switch {
			case isHeld:
				inv.Allocated++
				if g.Healthy {
					inv.Healthy++
				}
			case g.Healthy:
				inv.Healthy++
				if n.schedulable {
					inv.Free++
				}
			}
		}
		for _, inv := range byModel {
			out = append(out, *inv)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Model < out[j].Model
	})
	return out
}

// GPUNodes returns the ids of the nodes that have GPUs.
func (v *View) GPUNodes() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []string
	for id, n := range v.nodes {
		if len(n.devices) > 0 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// holders are the allocations holding each GPU, by device id (not those
// preempted: they hold theirs no more). The caller holds v.mu.
func (v *View) holders() map[string]Alloc {
	out := map[string]Alloc{}
	for _, a := range v.allocs {
		if !a.Preempted {
			for _, id := range a.GPUs {
				out[id] = a
			}
		}
	}
	return out
}
