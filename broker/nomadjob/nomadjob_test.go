package nomadjob_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

func ptr[T any](v T) *T { return &v }

func TestAdmissionDemand(t *testing.T) {
	job := &api.Job{ID: ptr("train"), Meta: map[string]string{nomadjob.MetaQueue: "dev"}, TaskGroups: []*api.TaskGroup{
		{Name: ptr("workers"), Count: ptr(3), Tasks: []*api.Task{
			{Resources: &api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(2))}}}},
			{Resources: &api.Resources{Devices: []*api.RequestedDevice{{Name: "gpu"}}}},
		}},
		{Name: ptr("eval"), Tasks: []*api.Task{
			{Resources: &api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu/NVIDIA H100 80GB HBM3", Count: ptr(uint64(1))}}}},
		}},
		{Name: ptr("cpu-only"), Count: ptr(5), Tasks: []*api.Task{
			{Resources: &api.Resources{Devices: []*api.RequestedDevice{{Name: "amd/fpga"}}}},
		}},
	}}
	a := nomadjob.Admission(job, "vision")
	if len(a.Groups) != 2 || a.Queue != "dev" || a.Groups[0].Count != 3 || a.Groups[0].GPUsPerAlloc != 3 ||
		a.Groups[1].Count != 1 || a.Groups[1].Model != "NVIDIA H100 80GB HBM3" {
		t.Fatalf("got %+v", a)
	}
}

func TestApplyChangesOnlyPriorityAndMeta(t *testing.T) {
	src := `{"ID":"train","Priority":50,"Meta":{"owner":"ana"},"TaskGroups":[{"Name":"g","Count":2}],"Unknown":{"kept":true}}`
	var raw map[string]any
	json.Unmarshal([]byte(src), &raw)
	d := admission.Decision{Outcome: admission.AdmitBorrowed, Tenant: "vision", Queue: "training", Workload: "training", Priority: 20}
	nomadjob.Apply(raw, d, "v1:1:sig")
	out, _ := json.Marshal(raw)
	want := `{"ID":"train","Meta":{"nomad-gpu.admission":"v1:1:sig","nomad-gpu.borrowed":"true","nomad-gpu.queue":"training","nomad-gpu.tenant":"vision","nomad-gpu.workload":"training","owner":"ana"},"Priority":20,"TaskGroups":[{"Count":2,"Name":"g"}],"Unknown":{"kept":true}}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
}

func TestStampVerifies(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	stamp := s.Stamp("vision", "train", d, time.Unix(100, 0))
	job := &api.Job{ID: ptr("train"), Priority: ptr(60), Meta: map[string]string{
		nomadjob.MetaTenant: "vision", nomadjob.MetaQueue: "training", nomadjob.MetaAdmission: stamp}}
	if !s.Verify("vision", job) {
		t.Fatal("own stamp not verified")
	}
	job.Priority = ptr(80)
	if s.Verify("vision", job) {
		t.Error("a stamp survived a priority change")
	}
	if (nomadjob.Stamper{Key: []byte("other")}).Verify("vision", job) {
		t.Error("another key verified the stamp")
	}
}
