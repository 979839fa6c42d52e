// Package testbuild makes the fixtures the broker's tests share: policies,
// Nomad nodes with GPUs, and GPU jobs, each in one line.
package testbuild

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// H100 is the model the fake backend reports by default.
const H100 = "NVIDIA H100 80GB HBM3"

// Policy parses one policy file, failing the test on any diagnostic.
func Policy(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, diags := policy.Parse(map[string][]byte{"policy.hcl": []byte(src)}, 0)
	if diags.HasErrors() {
		t.Fatal(policy.FormatDiagnostics(diags))
	}
	return p
}

// Node is a ready, eligible Nomad node with healthy and sick GPUs of model.
func Node(id, model string, healthy, sick int) *api.Node {
	var inst []*api.NodeDevice
	for i := 0; i < healthy+sick; i++ {
		inst = append(inst, &api.NodeDevice{ID: fmt.Sprintf("%s-%d", id, i), Healthy: i < healthy})
	}
	return &api.Node{ID: id, Status: api.NodeStatusReady, SchedulingEligibility: api.NodeSchedulingEligible,
		NodeResources: &api.NodeResources{Devices: []*api.NodeDeviceResource{
			{Vendor: "nvidia", Type: "gpu", Name: model, Instances: inst}}}}
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

// ModifyIndex sets Nomad's JobModifyIndex.
func (b *JobBuilder) ModifyIndex(i uint64) *JobBuilder { b.job.JobModifyIndex = &i; return b }

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
