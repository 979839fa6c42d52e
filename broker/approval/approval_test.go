package approval_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// boundedPolicy gives vision a limit of 4 and approvals of at most 2 GPUs
// above it.
const boundedPolicy = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision", "vision-b"]
  queues     = ["training"]
  limit      = 4
  approvals { max_extra_gpus = 2 }
}
`

func TestCheck(t *testing.T) {
	ok := approval.Approval{Namespace: "vision", Job: "big", Reason: "deadline", ExtraGPUs: 2, For: "4h"}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]approval.Approval{
		"no reason":   {Namespace: "vision", Job: "big", ExtraGPUs: 2, For: "4h"},
		"both":        {Namespace: "vision", Job: "big", Reason: "r", ExtraGPUs: 2, Priority: 80, For: "4h"},
		"neither":     {Namespace: "vision", Job: "big", Reason: "r", For: "4h"},
		"too long":    {Namespace: "vision", Job: "big", Reason: "r", Priority: 80, For: "200h"},
		"bad prio":    {Namespace: "vision", Job: "big", Reason: "r", Priority: 101, For: "1h"},
		"no duration": {Namespace: "vision", Job: "big", Reason: "r", Priority: 80},
	} {
		if err := a.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestForOnlyWhileGrantedAndOnlyForItsJob(t *testing.T) {
	p := testbuild.Policy(t, strings.Replace(boundedPolicy, "max_extra_gpus = 2", "max_extra_gpus = 3", 1))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	extra := approval.Approval{Namespace: "vision", Job: "big", Reason: "r", ExtraGPUs: 3, For: "1h", State: approval.Pending}
	prio := approval.Approval{Namespace: "vision", Job: "big", Reason: "r", Priority: 90, For: "30m", State: approval.Pending}
	none := admission.Granted{}
	if g := approval.For([]approval.Approval{extra, prio}, p, "vision", "big", now); g != none {
		t.Fatalf("pending approvals applied: %+v", g)
	}
	extra.Grant("ops", now)
	prio.Grant("ops", now)
	if g := approval.For([]approval.Approval{extra, prio}, p, "vision", "big", now.Add(10*time.Minute)); g != (admission.Granted{ExtraGPUs: 3, Priority: 90}) {
		t.Errorf("granted: %+v", g)
	}
	if g := approval.For([]approval.Approval{extra, prio}, p, "vision", "other", now); g != none {
		t.Errorf("applied to another job: %+v", g)
	}
	if g := approval.For([]approval.Approval{extra, prio}, p, "vision", "big", now.Add(45*time.Minute)); g != (admission.Granted{ExtraGPUs: 3}) {
		t.Errorf("after the priority expired: %+v", g)
	}
	if g := approval.For([]approval.Approval{extra}, p, "vision", "big", now.Add(time.Hour)); g != none {
		t.Errorf("applied at its expiry: %+v", g)
	}
}

// The GPUs above the limit that approvals grant are bounded by the
// tenant's max_extra_gpus for a job and for the tenant's jobs together, not
// per approval (N4: three grants of +2 gave one job +6).
func TestApprovalsAreBoundedPerJobAndPerTenant(t *testing.T) {
	p := testbuild.Policy(t, boundedPolicy)
	vision := p.Tenants["vision"]
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var granted []approval.Approval
	ask := func(id, ns, job string) approval.Approval {
		return approval.Approval{ID: id, Namespace: ns, Job: job, Reason: "r", ExtraGPUs: 2, For: "1h", State: approval.Pending}
	}
	first := ask("a1", "vision", "big")
	if err := approval.CheckGrant(granted, first, vision, now); err != nil {
		t.Fatalf("the first +2 (max 2): %v", err)
	}
	first.Grant("ops", now)
	granted = append(granted, first)
	for _, a := range []approval.Approval{ask("a2", "vision", "big"), ask("a3", "vision-b", "other")} {
		if err := approval.CheckGrant(granted, a, vision, now); err == nil || !strings.Contains(err.Error(), "at most 2") {
			t.Errorf("another +2 for %s/%s beside the first: %v", a.Namespace, a.Job, err)
		}
	}
	// Granted past the bound anyway (a policy lowered since, or records
	// written by hand): what they grant is still the bound.
	second := ask("a2", "vision", "big")
	second.Grant("ops", now)
	granted = append(granted, second)
	if g := approval.For(granted, p, "vision", "big", now); g.ExtraGPUs != 2 {
		t.Errorf("two +2 grants for one job: +%d, want +2", g.ExtraGPUs)
	}
	if extra := approval.ExtraByTenant(granted, p, now)["vision"]; extra != 2 {
		t.Errorf("vision's extra GPUs: %g, want 2", extra)
	}
	if err := approval.CheckGrant(granted, ask("a4", "vision", "big"), vision, now.Add(2*time.Hour)); err != nil {
		t.Errorf("once both expired: %v", err)
	}
}

// A person is their tokens' name; a login token is named after its auth
// method, so it stands for its name with its roles and policies.
func TestIdentityIsThePersonNotTheToken(t *testing.T) {
	sre := policy.Grants{Roles: []string{"sre", "gpu"}, Policies: []string{"read"}}
	for _, c := range []struct {
		a, b   string
		ga, gb policy.Grants
		same   bool
	}{
		{"bob", "bob", policy.Grants{}, sre, true},
		{"bob", "ana", sre, sre, false},
		{"OIDC-okta", "OIDC-okta", sre, policy.Grants{Roles: []string{"gpu", "sre"}, Policies: []string{"read"}}, true},
		{"OIDC-okta", "OIDC-okta", sre, policy.Grants{Roles: []string{"user-ana"}}, false},
		{"JWT-ci", "OIDC-ci", sre, sre, false},
	} {
		if same := approval.Identity(c.a, c.ga) == approval.Identity(c.b, c.gb); same != c.same {
			t.Errorf("%s %+v and %s %+v: same person %t, want %t", c.a, c.ga, c.b, c.gb, same, c.same)
		}
	}
	old := approval.Approval{RequestedBy: "bob (acc-1)", RequestedAccessor: "acc-1"} // recorded before identities
	if !old.SamePerson("bob", policy.Grants{}) || old.SamePerson("ana", policy.Grants{}) {
		t.Errorf("an old request is bob's by its token's name")
	}
}

// Nobody grants their own request with another of their tokens: one named
// after them with a suffix, or one holding all their roles and policies,
// whatever else. N5: dana-ci, with dana's roles, and dana2, with dana's
// roles and one more, granted dana's request.
func TestSamePersonCoversTheirOtherTokens(t *testing.T) {
	dana := policy.Grants{Roles: []string{"ml-user", "gpu-approve"}}
	asked := approval.Approval{RequestedBy: "dana (acc-1)", RequestedAccessor: "acc-1", RequestedIdentity: "dana",
		RequestedGrants: approval.GrantsOf(dana)}
	ops := policy.Grants{Roles: []string{"sre"}}
	for _, c := range []struct {
		token string
		g     policy.Grants
		same  bool
	}{
		{"dana", ops, true},
		{"dana-ci", ops, true},
		{"dana.laptop", policy.Grants{}, true},
		{"dana@ci", ops, true},
		{"ci-bot", policy.Grants{Roles: []string{"gpu-approve", "ml-user"}}, true},                             // dana's rights, another name
		{"dana2", policy.Grants{Roles: []string{"gpu-approve", "ml-user"}, Policies: []string{"extra"}}, true}, // and one more
		{"ops-lead", policy.Grants{Roles: []string{"gpu-approve", "ops-lead", "sre"}}, false},                  // another approver, a role of their own
		{"ops-oncall", ops, false},
		{"danaher", ops, false}, // another name that starts like hers
		{"dan", ops, false},     // hers starts like it, with no separator
		{"ci-bot", policy.Grants{Roles: []string{"ml-user"}}, false}, // some of her rights, not the same
	} {
		if got := asked.SamePerson(c.token, c.g); got != c.same {
			t.Errorf("%s %+v: same person as dana %t, want %t", c.token, c.g, got, c.same)
		}
	}
	anonymous := approval.Approval{RequestedBy: "anonymous", RequestedIdentity: "anonymous"}
	if anonymous.SamePerson("ops-oncall", policy.Grants{}) {
		t.Errorf("no grants on either side are not the same rights")
	}
}
