package policyhcl_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

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

func TestExamplePoliciesAreValid(t *testing.T) {
	p, diags := policyhcl.LoadDir("../../policies", 16)
	if diags.HasErrors() {
		t.Fatalf("policies/ is invalid:\n%s", policyhcl.FormatDiagnostics(diags))
	}
	vision := p.TenantOf("vision")
	if vision == nil || vision.DefaultQueue() != "training" || vision.Guaranteed.Total() != 8 || vision.Limit.Total() != 12 {
		t.Fatalf("tenant vision read wrong: %+v", vision)
	}
	if p.ClassOf("NVIDIA H100 80GB HBM3") != "h100" || p.ClassOf("NVIDIA A100-SXM4-40GB") != "" {
		t.Errorf("gpu_class h100 does not match H100 models only")
	}
	if research := p.Tenants["research"]; research.Guaranteed["h100"] != 2 || research.Limit["h100"] != 8 {
		t.Errorf("per-class quotas read wrong: %+v", research)
	}
	if !p.Borrowing.Enabled || p.Borrowing.Priority != 20 || !p.Preemption.Batch || !p.Preemption.Service {
		t.Errorf("borrowing/preemption read wrong: %+v %+v", p.Borrowing, p.Preemption)
	}
	if len(p.Reclaim) != 5 || p.Reclaim["idle-dev"].Mode != policy.ModeEnforce || p.Reclaim["unadmitted"].Mode != policy.ModeDryRun {
		t.Errorf("reclaim rules read wrong: %d rules", len(p.Reclaim))
	}
}

func TestDiagnosticsNameFileLineAndRule(t *testing.T) {
	cases := []struct {
		name     string
		tenants  string
		capacity int
		want     string // a line of the formatted diagnostics
		warning  bool   // the set is still valid
	}{
		{name: "unknown key", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  guarantee = 3
}`, want: `tenants.hcl:4:3: error: Unsupported argument: An argument named "guarantee" is not expected here.`},
		// Issue 34 §5: each was accepted.
		{name: "a reclaim period of years", tenants: "reclaim_settings {\n  period = \"2562047h\"\n}",
			want: `tenants.hcl:1:1: error: Invalid duration: reclaim_settings: period = "2562047h" is not a duration of at least 1s and at most 10m0s`},
		{name: "a tenant name with a NUL", tenants: "tenant \"a\\u0000b\" {\n  namespaces = [\"a\"]\n  queues = [\"dev\"]\n}",
			want: `tenants.hcl:1:8: error: Invalid name: a tenant name holds a control character: "a\x00b"`},
		{name: "namespace claimed twice", tenants: `tenant "a" {
  namespaces = ["shared"]
  queues = ["dev"]
}
tenant "b" {
  namespaces = ["shared"]
  queues = ["dev"]
}`, want: `tenants.hcl:5:1: error: Namespace claimed twice: namespace "shared" belongs to tenant "a"`},
		{name: "default queue missing", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = []
}`, want: `tenants.hcl:1:1: error: Default queue missing`},
		{name: "unknown queue", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["batch"]
}`, want: `tenants.hcl:1:1: error: Unknown queue: tenant "a" uses queue "batch"`},
		{name: "guaranteed above limit", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  guaranteed = 9
  limit = 4
}`, want: `tenants.hcl:4:16: error: Guarantee above limit: tenant "a" is guaranteed 9 GPUs but limited to 4`},
		{name: "unknown class", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  guaranteed = { a100 = 2 }
}`, want: `tenants.hcl:4:16: error: Invalid quota: tenant "a" guaranteed: unknown GPU class "a100"`},
		{name: "fractional quota", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  guaranteed = 1.5
}`, want: `error: Invalid quota: tenant "a" guaranteed: a quota is a whole number of GPUs`},
		{name: "duplicate tenant", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
}
tenant "a" {
  namespaces = ["b"]
  queues = ["dev"]
}`, want: `tenants.hcl:5:1: error: Duplicate tenant: tenant "a" is already defined at tenants.hcl:1,1-11`},
		{name: "submitter of no kind", tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  submitters = ["role:ml", "vision-write"]
}`, want: `tenants.hcl:4:16: error: Invalid submitter: tenant "a": submitter "vision-write" is neither "role:<Nomad ACL role>" nor "policy:<Nomad ACL policy>"`},
		{name: "guarantees above capacity", capacity: 4, warning: true, tenants: `tenant "a" {
  namespaces = ["a"]
  queues = ["dev"]
  guaranteed = 5
  limit = 5
}`, want: `warning: Guarantees exceed capacity: tenants are guaranteed 5 GPUs in all, the cluster has 4`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues), "tenants.hcl": []byte(c.tenants)}, c.capacity)
			out := policyhcl.FormatDiagnostics(diags)
			if !strings.Contains(out, c.want) {
				t.Fatalf("want a diagnostic containing\n  %s\ngot\n%s", c.want, out)
			}
			if c.warning != (p != nil) {
				t.Errorf("valid=%t, want %t", p != nil, c.warning)
			}
		})
	}
}

// Guaranteed work runs in bands within 9 of each other, in the queues'
// order, so that Nomad preempts no tenant's guaranteed job for another's.
// Bands closer than 10 are no longer worth a warning; a queue that
// preempts within guarantee 10 or more above another band is.
func TestBandRules(t *testing.T) {
	src := `
queue "inference" { priority = 80 }
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
queue "urgent" {
  priority                  = 95
  preempts_within_guarantee = true
}
borrowing {
  enabled = true
  priority = 35
}`
	p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(src)}, 0)
	out := policyhcl.FormatDiagnostics(diags)
	if p == nil {
		t.Fatalf("%s", out)
	}
	bands := map[string]int{}
	for name, q := range p.Queues {
		bands[name] = q.Band
	}
	if want := map[string]int{"inference": 49, "training": 45, "dev": 40, "urgent": 95}; !maps.Equal(bands, want) {
		t.Errorf("bands %v, want %v", bands, want)
	}
	for _, want := range []string{
		`q.hcl:5:1: warning: Guaranteed work preempts guaranteed work: queue "urgent" (preempts_within_guarantee, priority 95) is 10 or more above queue`,
		`q.hcl:9:1: warning: Borrowing band too close: borrowing priority 35 is less than 10 below queue "dev" (40)`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "warning") != 2 {
		t.Errorf("want two warnings:\n%s", out)
	}
	// Without borrowing nothing runs below the bands: no warning.
	off := strings.Replace(src, "enabled = true", "enabled = false", 1)
	if _, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(off)}, 0); len(diags) != 0 {
		t.Errorf("borrowing off: %s", policyhcl.FormatDiagnostics(diags))
	}
	// Priorities closer than the spread keep their own (no band goes up).
	close := `
queue "a" { priority = 42 }
queue "b" { priority = 41 }
queue "c" { priority = 70 }`
	p, diags = policyhcl.Parse(map[string][]byte{"q.hcl": []byte(close)}, 0)
	if p == nil || p.Queues["b"].Band != 41 || p.Queues["a"].Band != 42 || p.Queues["c"].Band != 50 || len(diags) != 0 {
		t.Errorf("close priorities: %+v %+v %+v\n%s", p.Queues["a"], p.Queues["b"], p.Queues["c"], policyhcl.FormatDiagnostics(diags))
	}
}

func TestBorrowingBandMustBeBelowEveryQueue(t *testing.T) {
	src := `
queue "a" { priority = 60 }
borrowing {
  enabled  = true
  priority = 60
}`
	p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(src)}, 0)
	want := `q.hcl:3:1: error: Borrowing band not below every queue: borrowing priority 60 must be below queue "a" (60)`
	if out := policyhcl.FormatDiagnostics(diags); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
}

func TestPromoteBelowIsAShareOfTheGuarantee(t *testing.T) {
	src := `
queue "a" { priority = 60 }
borrowing {
  enabled       = true
  promote_below = %s
}`
	p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(src, "1.5"))}, 0)
	want := `q.hcl:5:3: error: Invalid share: borrowing: promote_below = 1.5 is not a share of the guarantee from 0 (never) to 1`
	if out := policyhcl.FormatDiagnostics(diags); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
	p, diags = policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(src, "0.6"))}, 0)
	if diags.HasErrors() || p.Borrowing.PromoteBelow != 0.6 {
		t.Fatalf("promote_below = 0.6: %v %s", p, policyhcl.FormatDiagnostics(diags))
	}
	// A workload's own: the same share, named by its workload.
	wsrc := src + `
workload "a" {
  promote_below = %s
}`
	p, diags = policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(wsrc, "0.6", "-1"))}, 0)
	want = `q.hcl:8:3: error: Invalid share: workload "a": promote_below = -1 is not a share of the guarantee from 0 (never) to 1`
	if out := policyhcl.FormatDiagnostics(diags); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
	p, diags = policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(wsrc, "0", "1"))}, 0)
	if diags.HasErrors() || p.PromoteBelow("a") != 1 || p.MaxPromoteBelow() != 1 {
		t.Fatalf("workload promote_below = 1: %v %s", p, policyhcl.FormatDiagnostics(diags))
	}
}

// Sub-bands lie between the borrowing priority and 10 below the lowest band:
// a policy without room for one is refused where it asks for them.
func TestSubBandsNeedRoomBelowTheLowestBand(t *testing.T) {
	src := `
queue "a" { priority = %d }
borrowing {
  enabled       = true
  sub_bands     = true
  sub_band_step = "%s"
}`
	parse := func(prio int, step string) (*policy.Policy, string) {
		p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(src, prio, step))}, 0)
		return p, policyhcl.FormatDiagnostics(diags)
	}
	want := `q.hcl:5:3: error: No room for sub-bands: borrowing: sub_bands needs the borrowing priority (20) more than 10 below the lowest queue band (30)`
	if p, out := parse(30, "15m"); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
	want = `q.hcl:6:3: error: Invalid duration: borrowing: sub_band_step = "0s" is not a duration above 0`
	if p, out := parse(60, "0s"); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
	p, out := parse(34, "1m")
	if p == nil || !p.Borrowing.SubBands || p.Borrowing.SubBandStep != time.Minute || p.SubBandRoom() != 4 {
		t.Fatalf("band 34, step 1m: %v %s", p, out)
	}
	p, _ = parse(60, "15m")
	if room := p.SubBandRoom(); room != policy.GuaranteedSpread {
		t.Errorf("band 60: room %d, want %d (sub-bands never 10 apart)", room, policy.GuaranteedSpread)
	}
	// On by default, and without room simply none.
	for prio, room := range map[int]int{30: 0, 34: 4} {
		p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf("queue \"a\" { priority = %d }\nborrowing { enabled = true }\n", prio))}, 0)
		if p == nil || diags.HasErrors() || !p.Borrowing.SubBands || p.Borrowing.SubBandStep != policy.DefaultSubBandStep || p.SubBandRoom() != room {
			t.Errorf("the defaults, band %d: %v %s (want sub-bands on, %d of them)", prio, p, policyhcl.FormatDiagnostics(diags), room)
		}
	}
}

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

// Nomad takes a priority of 0 for its default, 50: a borrowing band of 0
// would put borrowed work above the guaranteed bands (issue 34 §5).
func TestBorrowingPriorityIsANomadPriority(t *testing.T) {
	for _, prio := range []int{0, 101} {
		src := fmt.Sprintf("queue \"training\" { priority = 60 }\nborrowing {\n  priority = %d\n}\n", prio)
		_, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
		want := fmt.Sprintf("p.hcl:3:3: error: Invalid priority: borrowing: priority %d is not a Nomad priority (1 to 100)", prio)
		if got := policyhcl.FormatDiagnostics(diags); !strings.Contains(got, want) {
			t.Errorf("priority %d: %s", prio, got)
		}
	}
}

func TestPlacement(t *testing.T) {
	parse := func(body string) (*policy.Policy, string) {
		p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte("queue \"a\" { priority = 60 }\nplacement {\n" + body + "\n}\n")}, 0)
		return p, policyhcl.FormatDiagnostics(diags)
	}
	if p, out := parse(""); p == nil || p.Placement.Mode != policy.PlaceBroker || p.Placement.ReserveAfter != policy.DefaultReserveAfter {
		t.Fatalf("defaults: %+v %s", p, out)
	}
	if p, out := parse(`  mode = "nomad"` + "\n" + `  reserve_after = "0"`); p == nil || p.Placement.Mode != policy.PlaceNomad || p.Placement.ReserveAfter != 0 {
		t.Fatalf("mode nomad, never reserve: %+v %s", p, out)
	}
	for body, want := range map[string]string{
		`  mode = "scheduler"`:     `q.hcl:3:3: error: Invalid placement mode: placement: mode = "scheduler": want "broker"`,
		`  reserve_after = "soon"`: `q.hcl:3:3: error: Invalid duration: placement: reserve_after = "soon" is not a duration of 0 or more`,
		`  reserve_after = "-1h"`:  `q.hcl:3:3: error: Invalid duration: placement: reserve_after = "-1h"`,
		`  spread = true`:          `q.hcl:3:3: error: Unsupported argument`,
	} {
		if p, out := parse(body); p != nil || !strings.Contains(out, want) {
			t.Errorf("%s: want %q, got\n%s", body, want, out)
		}
	}
}

func TestMaxPreemptionsIsACountOfEvictions(t *testing.T) {
	src := "queue \"a\" { priority = 60 }\nborrowing {\n  enabled = true\n%s}\n"
	parse := func(attr string) (*policy.Policy, string) {
		p, diags := policyhcl.Parse(map[string][]byte{"q.hcl": []byte(fmt.Sprintf(src, attr))}, 0)
		return p, policyhcl.FormatDiagnostics(diags)
	}
	want := `q.hcl:4:3: error: Invalid count: borrowing: max_preemptions = -1: want 0 (no cap) or more evictions while borrowed`
	if p, out := parse("  max_preemptions = -1\n"); p != nil || !strings.Contains(out, want) {
		t.Fatalf("want %q, got\n%s", want, out)
	}
	for attr, want := range map[string]int{"": policy.DefaultMaxPreemptions, "  max_preemptions = 0\n": 0, "  max_preemptions = 3\n": 3} {
		if p, out := parse(attr); p == nil || p.Borrowing.MaxPreemptions != want {
			t.Errorf("%q: %v %s, want max_preemptions %d", attr, p, out, want)
		}
	}
}
