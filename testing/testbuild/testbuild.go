// Package testbuild makes the fixtures the broker's tests share: policies,
// Nomad nodes with GPUs, and GPU jobs, each in one line.
package testbuild

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// H100 is the model the fake backend reports by default.
const H100 = "NVIDIA H100 80GB HBM3"

// Policy parses one policy file, failing the test on any diagnostic.
func Policy(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, diags := policyhcl.Parse(map[string][]byte{"policy.hcl": []byte(src)}, 0)
	if diags.HasErrors() {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	return p
}

// Fixed is a policy.Source that always gives p.
type Fixed struct{ P *policy.Policy }

// Current is p.
func (f Fixed) Current() *policy.Policy { return f.P }

// Node is a ready, eligible Nomad node with healthy and sick GPUs of model.
func Node(id, model string, healthy, sick int) *api.Node {
	var inst []*api.NodeDevice
	for i := 0; i < healthy+sick; i++ {
		inst = append(inst, &api.NodeDevice{ID: fmt.Sprintf("%s-%d", id, i), Healthy: i < healthy,
			Locality: &api.NodeDeviceLocality{PciBusID: fmt.Sprintf("0000:%02x:00.0", i+1)}})
	}
	return &api.Node{ID: id, Status: api.NodeStatusReady, SchedulingEligibility: api.NodeSchedulingEligible,
		NodeResources: &api.NodeResources{Devices: []*api.NodeDeviceResource{
			{Vendor: "nvidia", Type: "gpu", Name: model, Instances: inst}}}}
}

// SharedGPUs adds to node n gpus GPUs of model offered as replicas each, in
// their own group as the device plugin offers them: "<model> (shared)", with
// the attributes shared = true and replicas.
func SharedGPUs(n *api.Node, model string, gpus, replicas int) *api.Node {
	var inst []*api.NodeDevice
	for g := 0; g < gpus; g++ {
		for r := 0; r < replicas; r++ {
			inst = append(inst, &api.NodeDevice{ID: fmt.Sprintf("%s-shared-%d-%d", n.ID, g, r), Healthy: true})
		}
	}
	n.NodeResources.Devices = append(n.NodeResources.Devices, &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu",
		Name: model + " (shared)", Instances: inst, Attributes: map[string]*api.Attribute{
			"shared": {BoolVal: ptr(true)}, "replicas": {IntVal: ptr(int64(replicas))}}})
	return n
}

// JobBuilder makes an *api.Job.
type JobBuilder struct{ job *api.Job }

// Job starts a running service job in namespace ns.
func Job(ns, id string) *JobBuilder {
	return &JobBuilder{job: &api.Job{ID: &id, Name: &id, Namespace: &ns, Type: ptr(api.JobTypeService),
		Status: ptr("running"), Meta: map[string]string{}}}
}

// Group adds a task group of count allocations, each with one task asking
// for gpus devices named device (e.g. "nvidia/gpu").
func (b *JobBuilder) Group(name string, count, gpus int, device string) *JobBuilder {
	tg := &api.TaskGroup{Name: &name, Count: &count, Tasks: []*api.Task{{Name: "t", Driver: "raw_exec",
		Resources: &api.Resources{Devices: []*api.RequestedDevice{{Name: device, Count: ptr(uint64(gpus))}}}}}}
	b.job.TaskGroups = append(b.job.TaskGroups, tg)
	return b
}

// Type sets the job type.
func (b *JobBuilder) Type(t string) *JobBuilder { b.job.Type = &t; return b }

// Meta sets a job meta key.
func (b *JobBuilder) Meta(k, v string) *JobBuilder { b.job.Meta[k] = v; return b }

// Priority sets the job priority.
func (b *JobBuilder) Priority(p int) *JobBuilder { b.job.Priority = &p; return b }

// Canary gives every group an update block with n canaries.
func (b *JobBuilder) Canary(n int) *JobBuilder {
	b.job.Update = &api.UpdateStrategy{Canary: &n}
	return b
}

// AutoRevert gives the job an update block with auto_revert: a failing
// deployment goes back to its latest stable version.
func (b *JobBuilder) AutoRevert() *JobBuilder {
	b.job.Update = &api.UpdateStrategy{AutoRevert: ptr(true)}
	return b
}

// Stable marks the job's version stable, as Nomad does once its deployment
// succeeded.
func (b *JobBuilder) Stable() *JobBuilder { b.job.Stable = ptr(true); return b }

// Parent makes it a dispatched or periodic child of the job with id parent.
func (b *JobBuilder) Parent(parent string) *JobBuilder { b.job.ParentID = &parent; return b }

// ModifyIndex sets Nomad's JobModifyIndex.
func (b *JobBuilder) ModifyIndex(i uint64) *JobBuilder { b.job.JobModifyIndex = &i; return b }

// Dead marks the job dead as Nomad returns one whose work is over: its
// status changed at an index after the version's registration (so after
// ModifyIndex, if set).
func (b *JobBuilder) Dead() *JobBuilder {
	var registered uint64
	if b.job.JobModifyIndex != nil {
		registered = *b.job.JobModifyIndex
	}
	b.job.Status, b.job.ModifyIndex = ptr("dead"), ptr(registered+1)
	return b
}

// Stopped marks the job stopped.
func (b *JobBuilder) Stopped() *JobBuilder { b.job.Stop = ptr(true); return b }

// Build returns the job.
func (b *JobBuilder) Build() *api.Job { return b.job }

// Register returns the job as a register request body.
func (b *JobBuilder) Register() string {
	body, err := json.Marshal(map[string]any{"Job": b.job})
	if err != nil {
		panic(err)
	}
	return string(body)
}

func ptr[T any](v T) *T { return &v }

// AllocBuilder makes an *api.Allocation as Nomad's events carry it.
type AllocBuilder struct{ a *api.Allocation }

// Alloc starts a running allocation of job (namespace ns) on node, holding
// the GPUs with device ids gpus, created and modified at index.
func Alloc(id, ns, job, node string, index uint64, gpus ...string) *AllocBuilder {
	a := &api.Allocation{ID: id, Namespace: ns, JobID: job, TaskGroup: "g", NodeID: node,
		DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusRunning,
		CreateIndex: index, ModifyIndex: index, TaskStates: map[string]*api.TaskState{"t": {State: "running"}}}
	if len(gpus) > 0 {
		a.AllocatedResources = &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"t": {
			Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: H100, DeviceIDs: gpus}}}}}
	}
	return &AllocBuilder{a: a}
}

// Started sets when its task started.
func (b *AllocBuilder) Started(at time.Time) *AllocBuilder {
	b.a.TaskStates["t"].StartedAt = at
	return b
}

// Finished sets its task's end.
func (b *AllocBuilder) Finished(at time.Time) *AllocBuilder {
	b.a.TaskStates["t"].FinishedAt = at
	return b
}

// Restarted adds a restart event of its task at each time.
func (b *AllocBuilder) Restarted(at ...time.Time) *AllocBuilder {
	for _, t := range at {
		b.a.TaskStates["t"].Events = append(b.a.TaskStates["t"].Events, &api.TaskEvent{Type: api.TaskRestarting, Time: t.UnixNano()})
	}
	return b
}

// Status sets its desired and client status, modified at index.
func (b *AllocBuilder) Status(desired, client string, index uint64) *AllocBuilder {
	b.a.DesiredStatus, b.a.ClientStatus, b.a.ModifyIndex = desired, client, index
	return b
}

// PreemptedBy marks it evicted by Nomad's preemption for allocation by, at index.
func (b *AllocBuilder) PreemptedBy(by string, index uint64) *AllocBuilder {
	b.a.DesiredStatus, b.a.PreemptedByAllocation, b.a.ModifyIndex, b.a.AllocModifyIndex = api.AllocDesiredStatusEvict, by, index, index
	return b
}

// Build returns the allocation.
func (b *AllocBuilder) Build() *api.Allocation { return b.a }
