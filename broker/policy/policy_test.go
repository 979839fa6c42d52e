package policy_test

import (
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// The questions the engines ask of a policy built in code, as a parser
// would build it: no files involved.
func TestAPolicyAnswersWithoutBeingParsed(t *testing.T) {
	dev := &policy.Workload{Name: "dev", MaxGPUs: 1}
	vision := &policy.Tenant{Name: "vision", Namespaces: []string{"vision", "vision-dev"}, Queues: []string{"training", "dev"},
		Guaranteed: policy.Quota{"h100": 2}, Limit: policy.Quota{"h100": 4, "a100": 2}}
	p := &policy.Policy{
		Queues:    map[string]*policy.Queue{"training": {Name: "training", Priority: 60}, "dev": {Name: "dev", Priority: 40, Workload: "dev"}},
		Tenants:   map[string]*policy.Tenant{"vision": vision},
		Classes:   map[string]*policy.GPUClass{"h100": {Name: "h100", Models: []string{"NVIDIA H100*"}}, "exact": {Name: "exact", Models: []string{"A10"}}},
		Workloads: map[string]*policy.Workload{"dev": dev},
		Reclaim:   map[string]*policy.ReclaimRule{"b": {Name: "b"}, "a": {Name: "a"}},
		Borrowing: policy.Borrowing{Enabled: true, Priority: 20},
	}
	if p.TenantOf("vision") != nil {
		t.Fatal("answered before Index")
	}
	p.Index()
	if p.TenantOf("vision-dev") != vision || p.TenantOf("search") != nil {
		t.Errorf("TenantOf after Index")
	}
	if vision.DefaultQueue() != "training" || !vision.Allows("dev") || vision.Allows("inference") {
		t.Errorf("queues of vision")
	}
	for model, want := range map[string]string{"NVIDIA H100 80GB HBM3": "h100", "A10": "exact", "A100": "", "NVIDIA A100": "",
		"A10 (island 1)": "exact", "A10 (island x)": "", "A10 (shared)": "", "NVIDIA H100 80GB HBM3 (island 0)": "h100"} {
		if got := p.ClassOf(model); got != want {
			t.Errorf("ClassOf(%q) = %q, want %q", model, got, want)
		}
	}
	if p.WorkloadFor("vision", "dev") != dev || p.WorkloadFor("vision", "") != nil || p.WorkloadFor("search", "dev") != nil || p.WorkloadOf("none") != nil {
		t.Errorf("workloads")
	}
	if r := p.ReclaimRules(); len(r) != 2 || r[0].Name != "a" {
		t.Errorf("rules in name order: %v", r)
	}
	if got := (policy.Quota{"h100": 4, "a100": 2}).Total(); got != 6 {
		t.Errorf("total of classes: %g", got)
	}
	if got := (policy.Quota{policy.AllGPUs: 5, "h100": 4}).Total(); got != 5 {
		t.Errorf("total with an all-GPUs key: %g", got)
	}
	strict := p.StrictQuotas()
	if strict.Borrowing.Enabled || strict.TenantOf("vision").Limit.Total() != 2 || !p.Borrowing.Enabled || p.TenantOf("vision").Limit.Total() != 6 {
		t.Errorf("strict quotas: limit %v, borrowing %v; the original changed: %v", strict.TenantOf("vision").Limit, strict.Borrowing.Enabled, p.TenantOf("vision").Limit)
	}
	if got := (policy.Pos{File: "tenants.hcl", Line: 3, Column: 5}).String(); got != "tenants.hcl:3:5" {
		t.Errorf("Pos: %s", got)
	}
	vision.Submitters = []policy.Submitter{{Kind: policy.SubmitterRole, Name: "ml"}, {Kind: policy.SubmitterPolicy, Name: "v-write"}}
	for _, c := range []struct {
		g    policy.Grants
		want bool
	}{
		{policy.Grants{Roles: []string{"ml"}}, true},
		{policy.Grants{Policies: []string{"v-write"}}, true},
		{policy.Grants{Roles: []string{"v-write"}}, false}, // a role named like the policy
		{policy.Grants{Management: true}, true},
		{policy.Grants{}, false},
	} {
		if got := vision.MaySubmit(c.g); got != c.want {
			t.Errorf("MaySubmit(%+v) = %t", c.g, got)
		}
	}
	p.Approvers = []string{"ops", "role:sre", "policy:gpu-approve"}
	if !p.MayApprove("ops", policy.Grants{}) || !p.MayApprove("ana", policy.Grants{Roles: []string{"sre"}}) ||
		!p.MayApprove("ana", policy.Grants{Policies: []string{"gpu-approve"}}) || p.MayApprove("ana", policy.Grants{Roles: []string{"ops"}}) {
		t.Error("MayApprove")
	}
	raised := p.WithExtraLimit("vision", 3)
	// Each class it names is raised: one job may take the extra GPUs of any.
	if raised.TenantOf("vision-dev").Limit["h100"] != 7 || raised.TenantOf("vision-dev").Limit["a100"] != 5 || p.TenantOf("vision-dev").Limit.Total() != 6 || raised.WithExtraLimit("nobody", 3).Tenants["vision"] != raised.Tenants["vision"] {
		t.Errorf("an extra limit for one tenant: raised %v, original %v", raised.TenantOf("vision-dev").Limit, p.TenantOf("vision-dev").Limit)
	}
	if got := (policy.Submitter{Kind: policy.SubmitterRole, Name: "ml"}).String(); got != "role:ml" {
		t.Errorf("Submitter: %s", got)
	}
}

// Borrowed work's sub-band doubles its GPU time at stake with each step up,
// and stops at the room below the lowest band.
func TestSubBandsDoubleTheWorkAtStakeEachStepUp(t *testing.T) {
	p := &policy.Policy{
		Queues:    map[string]*policy.Queue{"training": {Name: "training", Priority: 60}, "dev": {Name: "dev", Priority: 40}},
		Borrowing: policy.Borrowing{Enabled: true, Priority: 20, SubBands: true, SubBandStep: 15 * time.Minute},
	}
	p.Index()
	for _, c := range []struct {
		gpus    float64
		running time.Duration
		want    int
	}{
		{1, 0, 20}, {1, 14 * time.Minute, 20}, {1, 15 * time.Minute, 21}, {1, 29 * time.Minute, 21}, {1, 30 * time.Minute, 22},
		{4, 15 * time.Minute, 23}, {8, time.Hour, 26}, {8, 100 * time.Hour, 29}, // 40 - 10 - 20: 10 sub-bands, 20 to 29
	} {
		if got := p.SubBand(c.gpus, c.running); got != c.want {
			t.Errorf("%g GPUs for %s: sub-band %d, want %d", c.gpus, c.running, got, c.want)
		}
	}
	// When the next move up comes: 1 GPU for 10 minutes reaches 15
	// GPU-minutes 5 minutes later; 4 GPUs at 21 (15 GPU-minutes) reach
	// 30 GPU-minutes at 7.5 minutes; the top sub-band never moves.
	for _, c := range []struct {
		gpus          float64
		running, want time.Duration
	}{{1, 10 * time.Minute, 5 * time.Minute}, {4, 225 * time.Second, 225 * time.Second}, {8, 100 * time.Hour, 0}} {
		if got := p.NextSubBand(c.gpus, c.running); got != c.want {
			t.Errorf("%g GPUs for %s: next sub-band in %s, want %s", c.gpus, c.running, got, c.want)
		}
		if next := p.NextSubBand(c.gpus, c.running); next > 0 && p.SubBand(c.gpus, c.running+next) != p.SubBand(c.gpus, c.running)+1 {
			t.Errorf("%g GPUs for %s: no move up %s later", c.gpus, c.running, next)
		}
	}
	p.Borrowing.SubBands = false
	if got := p.SubBand(8, 100*time.Hour); got != 20 {
		t.Errorf("sub-bands off: %d, want the borrowing priority 20", got)
	}
	if got := p.NextSubBand(8, time.Hour); got != 0 {
		t.Errorf("sub-bands off: next in %s, want never", got)
	}
}
