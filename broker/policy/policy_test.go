package policy_test

import (
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

const queues = `
queue "inference" { priority = 80 }
queue "training" {
  priority = 60
  workload = "training"
}
queue "dev" { priority = 40 }
borrowing {
  enabled  = true
  priority = 20
}
`

func TestSubmittersAreRolesOrPolicies(t *testing.T) {
	p, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues), "tenants.hcl": []byte(`tenant "a" {
  namespaces = ["a"]
  queues     = ["dev"]
  submitters = ["role:ml", "policy:a-write"]
}
tenant "b" {
  namespaces = ["b"]
  queues     = ["dev"]
}`)}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	a, b := p.Tenants["a"], p.Tenants["b"]
	cases := []struct {
		name   string
		tenant *policy.Tenant
		grants policy.Grants
		want   bool
	}{
		{"role", a, policy.Grants{Roles: []string{"other", "ml"}}, true},
		{"policy", a, policy.Grants{Policies: []string{"a-write"}}, true},
		{"a role named like the policy", a, policy.Grants{Roles: []string{"a-write"}}, false},
		{"a policy named like the role", a, policy.Grants{Policies: []string{"ml"}}, false},
		{"nothing", a, policy.Grants{}, false},
		{"management", a, policy.Grants{Management: true}, true},
		{"a tenant with no submitters", b, policy.Grants{Roles: []string{"ml"}, Policies: []string{"a-write"}}, false},
	}
	for _, c := range cases {
		if got := c.tenant.MaySubmit(c.grants); got != c.want {
			t.Errorf("%s: MaySubmit = %t, want %t", c.name, got, c.want)
		}
	}
}

func TestApproversAndAnExtraLimitForOneJob(t *testing.T) {
	p, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + `
approvers = ["ops-oncall", "role:sre", "policy:gpu-approve"]
tenant "vision" {
  namespaces = ["vision", "vision-dev"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 4
}
`)}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	for _, c := range []struct {
		name string
		g    policy.Grants
		want bool
	}{
		{"ops-oncall", policy.Grants{}, true},
		{"ana", policy.Grants{Roles: []string{"sre"}}, true},
		{"ana", policy.Grants{Policies: []string{"gpu-approve"}}, true},
		{"ana", policy.Grants{Roles: []string{"ops-oncall"}, Policies: []string{"sre"}}, false},
	} {
		if got := p.MayApprove(c.name, c.g); got != c.want {
			t.Errorf("MayApprove(%s, %+v) = %t", c.name, c.g, got)
		}
	}
	raised := p.WithExtraLimit("vision", 3)
	if raised.TenantOf("vision-dev").Limit.Total() != 7 || p.TenantOf("vision-dev").Limit.Total() != 4 || raised.TenantOf("vision").Guaranteed.Total() != 2 {
		t.Errorf("raised %v, original %v", raised.TenantOf("vision-dev").Limit, p.TenantOf("vision-dev").Limit)
	}
}

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
	for model, want := range map[string]string{"NVIDIA H100 80GB HBM3": "h100", "A10": "exact", "A100": "", "NVIDIA A100": ""} {
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
	if got := (policy.Submitter{Kind: policy.SubmitterRole, Name: "ml"}).String(); got != "role:ml" {
		t.Errorf("Submitter: %s", got)
	}
}
