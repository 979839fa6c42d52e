package policyhcl_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// rule writes a reclaim block "r" with one attribute a line, from line 2.
func rule(attrs ...string) string {
	return "reclaim \"r\" {\n  " + strings.Join(attrs, "\n  ") + "\n}\n"
}

// The example policies carry issue 7's rules, one attribute a line (HCL
// allows a single-line block only with a single attribute).
func TestReclaimRulesAsWritten(t *testing.T) {
	p, diags := policyhcl.LoadDir("../../policies", 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	var got []string
	for _, r := range p.ReclaimRules() {
		got = append(got, r.Name+" "+string(r.Condition)+" "+string(r.Action)+" "+string(r.Mode))
	}
	want := "[crash-loop restarts_above stop enforce dev-ttl max_lifetime stop enforce idle-dev idle_below stop enforce " +
		"sick-gpu device_unhealthy_for reschedule enforce unadmitted unadmitted stop dry-run]"
	if s := strings.Join(strings.Fields(strings.Trim(strings.Join(got, " "), " ")), " "); "["+s+"]" != want {
		t.Errorf("rules:\n got [%s]\nwant %s", s, want)
	}
	idle := p.Reclaim["idle-dev"]
	if idle.Workload != "dev" || idle.IdleBelow != 5 || idle.IdleFor != 30*time.Minute || idle.Grace != 5*time.Minute {
		t.Errorf("idle-dev: %+v", idle)
	}
	if ttl := p.Reclaim["dev-ttl"]; ttl.MaxLifetime != 8*time.Hour || ttl.MaxExtend != 4*time.Hour {
		t.Errorf("dev-ttl: %+v", ttl)
	}
	if cl := p.Reclaim["crash-loop"]; cl.RestartsAbove != 5 || cl.Within != 30*time.Minute {
		t.Errorf("crash-loop: %+v", cl)
	}
	if p.Usage.IdleBelow != 5 {
		t.Errorf("usage: %+v", p.Usage)
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues)}, 0)
	if s := p.ReclaimSettings; s.Period != 30*time.Second || s.Retention != 30*24*time.Hour {
		t.Errorf("default reclaim_settings: %+v %s", s, policyhcl.FormatDiagnostics(diags))
	}
	if p.Usage.IdleBelow != 5 || p.Usage.Retention != 400*24*time.Hour || p.Currency != "USD" {
		t.Errorf("defaults: usage %+v, currency %q", p.Usage, p.Currency)
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + "currency = \"EUR\"\ngpu_class \"h100\" {\n  models = [\"H100\"]\n  price_per_gpu_hour = 2.5\n}\nusage {\n  retention = \"48h\"\n}\n")}, 0)
	if p == nil || p.Currency != "EUR" || p.Classes["h100"].PricePerGPUHour != 2.5 || p.Usage.Retention != 48*time.Hour {
		t.Errorf("currency, price, retention: %s", policyhcl.FormatDiagnostics(diags))
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  budget {\n    gpu_hours = 2000\n    period = \"month\"\n  }\n}\n")}, 0)
	if p == nil || *p.Tenants["t"].Budget != (policy.Budget{GPUHours: 2000, Period: "month"}) {
		t.Errorf("budget: %s", policyhcl.FormatDiagnostics(diags))
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + "fair_share {\n  idle_weight = 2\n}\n")}, 0)
	if p == nil || p.FairShare != (policy.FairShare{Enabled: true, HalfLife: 24 * time.Hour, IdleWeight: 2, OldestFirstAfter: 6 * time.Hour}) {
		t.Errorf("fair_share: %s", policyhcl.FormatDiagnostics(diags))
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + "fair_share {\n  oldest_first_after = \"0\"\n}\n")}, 0)
	if p == nil || p.FairShare.OldestFirstAfter != 0 {
		t.Errorf("fair_share oldest_first_after = 0: %s", policyhcl.FormatDiagnostics(diags))
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + "reclaim_settings {\n  period = \"5s\"\n  retention = \"48h\"\n}\n")}, 0)
	if p == nil || p.ReclaimSettings.Period != 5*time.Second || p.ReclaimSettings.Retention != 48*time.Hour {
		t.Errorf("reclaim_settings: %v %s", p, policyhcl.FormatDiagnostics(diags))
	}
}

func TestReclaimRuleDiagnostics(t *testing.T) {
	cases := []struct{ name, rule, want string }{
		{"no condition", rule(`action = "stop"`),
			`reclaim.hcl:1:1: error: Reclaim rule without a condition: reclaim "r" sets none of idle_below + idle_for, max_lifetime`},
		{"two conditions", rule(`max_lifetime = "8h"`, `unadmitted = true`, `action = "stop"`),
			`reclaim.hcl:1:1: error: Reclaim rule with several conditions: reclaim "r" sets max_lifetime and unadmitted`},
		{"action that makes no sense", rule(`max_lifetime = "8h"`, `action = "reschedule"`),
			`reclaim.hcl:3:12: error: Action does not fit the condition: reclaim "r": action "reschedule" does not make sense for max_lifetime; use one of stop, notify`},
		{"unknown action", rule(`unadmitted = true`, `action = "purge"`),
			`reclaim.hcl:3:12: error: Action does not fit the condition: reclaim "r": action "purge" does not make sense for unadmitted; use one of stop, requeue, notify`},
		{"half a condition", rule(`idle_below = 5`, `action = "stop"`),
			`reclaim.hcl:2:16: error: Incomplete condition: reclaim "r": idle_below and idle_for go together`},
		{"bad duration", rule(`max_lifetime = "8 hours"`, `action = "stop"`),
			`reclaim.hcl:2:18: error: Invalid duration: reclaim "r": max_lifetime = "8 hours" is not a duration`},
		{"bad threshold", rule(`idle_below = 150`, `idle_for = "1m"`, `action = "stop"`),
			`reclaim.hcl:2:16: error: Invalid idle threshold: reclaim "r": idle_below = 150 is not a utilisation percentage`},
		{"bad mode", rule(`unadmitted = true`, `action = "stop"`, `mode = "on"`),
			`reclaim.hcl:4:10: error: Invalid reclaim mode: reclaim "r": mode "on" is neither "enforce" nor "dry-run"`},
		{"unknown queue", rule(`queue = "batch"`, `unadmitted = true`, `action = "stop"`),
			`reclaim.hcl:1:1: error: Unknown queue: reclaim "r" selects queue "batch"`},
		{"max_extend alone", rule(`max_extend = "1h"`, `unadmitted = true`, `action = "stop"`),
			`reclaim.hcl:2:16: error: max_extend without max_lifetime`},
		{"bad period", "reclaim_settings {\n  period = \"0s\"\n}\n",
			`reclaim.hcl:1:1: error: Invalid duration: reclaim_settings: period = "0s" is not a duration of at least 1s`},
		{"bad usage threshold", "usage {\n  idle_below = 0\n}\n",
			`reclaim.hcl:2:3: error: Invalid idle threshold: usage: idle_below = 0 is not a utilisation percentage above 0 and at most 100`},
		{"two usage blocks", "usage {\n  idle_below = 3\n}\nusage {\n  idle_below = 4\n}\n",
			`reclaim.hcl:4:1: error: Duplicate usage`},
		{"short usage retention", "usage {\n  retention = \"1h\"\n}\n",
			`reclaim.hcl:2:3: error: Invalid duration: usage: retention = "1h" is not a duration of at least 24h`},
		{"negative price", "gpu_class \"a100\" {\n  models = [\"A100\"]\n  price_per_gpu_hour = -1\n}\n",
			`reclaim.hcl:3:3: error: Negative price: gpu_class "a100": price_per_gpu_hour = -1 is below 0`},
		{"bad currency", "currency = \"US dollars\"\n",
			`reclaim.hcl:1:1: error: Invalid currency: currency = "US dollars" is not a currency code`},
		{"bad half-life", "fair_share {\n  half_life = \"1s\"\n}\n",
			`reclaim.hcl:2:3: error: Invalid duration: fair_share: half_life = "1s" is not a duration of at least 1m`},
		{"negative idle weight", "fair_share {\n  idle_weight = -1\n}\n",
			`reclaim.hcl:2:3: error: Invalid idle weight: fair_share: idle_weight = -1 must be from 0`},
		{"negative oldest_first_after", "fair_share {\n  oldest_first_after = \"-1h\"\n}\n",
			`reclaim.hcl:2:3: error: Invalid duration: fair_share: oldest_first_after = "-1h" is not a duration of 0 or more`},
		{"bad budget period", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  budget {\n    gpu_hours = 10\n    period = \"year\"\n  }\n}\n",
			`reclaim.hcl:4:3: error: Invalid budget period: tenant "t": budget period "year" is none of "day", "week", "month"`},
		{"a queued request larger than Consul keeps", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  max_queued_request_bytes = 1048576\n}\n",
			`reclaim.hcl:1:1: error: Queue limit out of range: tenant "t": max_queued must be from 0 to 100000 and max_queued_request_bytes from 1 to 491520`},
		{"a queue limit no queue holds", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  max_queued = 1e12\n}\n",
			`reclaim.hcl:1:1: error: Queue limit out of range: tenant "t": max_queued must be from 0 to 100000`},
		{"a tenant without a name", "tenant \"\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n}\n",
			`reclaim.hcl:1:8: error: Empty name: a tenant block needs a name`},
		{"an empty namespace", "tenant \"t\" {\n  namespaces = [\"\"]\n  queues = [\"dev\"]\n}\n",
			`reclaim.hcl:1:1: error: Invalid namespace: tenant "t": namespace "" is not a Nomad namespace name`},
		{"a namespace Nomad would refuse", "tenant \"t\" {\n  namespaces = [\"team a\"]\n  queues = [\"dev\"]\n}\n",
			`reclaim.hcl:1:1: error: Invalid namespace: tenant "t": namespace "team a" is not a Nomad namespace name`},
		{"negative approval bound", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  approvals {\n    max_extra_gpus = -1\n  }\n}\n",
			`reclaim.hcl:4:3: error: Invalid approval bound: tenant "t": approvals max_extra_gpus = -1 must be 0 or more`},
		{"approvals beyond a week", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  approvals {\n    max_duration = \"8d\"\n  }\n}\n",
			`reclaim.hcl:4:3: error: Invalid approval bound: tenant "t": approvals max_duration = "8d" is not a duration above 0 and at most 168h0m0s`},
		{"bad over_limit", "over_limit = \"kill\"\n",
			`reclaim.hcl:1:1: error: Invalid over_limit: over_limit = "kill" is neither "reclaim" nor "wait"`},
		{"bad over_limit_grace", "over_limit_grace = \"soon\"\n",
			`reclaim.hcl:1:1: error: Invalid duration: over_limit_grace = "soon" is not a duration of 0 or more`},
		{"bad make_room", "make_room = true\n",
			`reclaim.hcl:1:1: error: Invalid make_room: make_room = "true" is neither "reclaim" nor "wait"`},
		{"negative make_room_grace", "make_room_grace = \"-1m\"\n",
			`reclaim.hcl:1:1: error: Invalid duration: make_room_grace = "-1m" is not a duration of 0 or more`},
		{"make_room twice", "make_room = \"wait\"\nmake_room = \"wait\"\n",
			`reclaim.hcl:2:1: error: Attribute redefined: The argument "make_room" was already set at reclaim.hcl:1`},
		{"a region cap above the tenant's limit", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  limit = 4\n  region \"west\" {\n    limit = 8\n  }\n}\n",
			`reclaim.hcl:5:3: error: Invalid region limit: tenant "t": region "west" limit = 8 must be from 0 to the tenant's limit, 4`},
		{"a region capped twice", "tenant \"t\" {\n  namespaces = [\"t\"]\n  queues = [\"dev\"]\n  limit = 4\n  region \"west\" {\n    limit = 1\n  }\n  region \"west\" {\n    limit = 2\n  }\n}\n",
			`reclaim.hcl:8:3: error: Duplicate region: tenant "t": region "west" is given twice`},
		{"bad dispatch", "dispatch = \"random\"\n",
			`reclaim.hcl:1:1: error: Invalid dispatch: dispatch = "random" is neither "ordered" nor "best_fit"`},
		{"a region twice in dispatch_order", "dispatch_order = [\"west\", \"west\"]\n",
			`reclaim.hcl:1:1: error: Invalid dispatch_order: dispatch_order names region "west": each entry must be a region's name, given once`},
		{"bad queue dispatch", "queue \"q\" {\n  priority = 10\n  dispatch = \"nearest\"\n}\n",
			`reclaim.hcl:3:3: error: Invalid dispatch: queue "q": dispatch = "nearest" is neither "ordered" nor "best_fit"`},
		{"bad spill_after", "spill_after = \"-1m\"\n",
			`reclaim.hcl:1:1: error: Invalid duration: spill_after = "-1m" is not a duration of 0 or more`},
		{"bad queue spill_after", "queue \"q\" {\n  priority = 10\n  spill_after = \"later\"\n}\n",
			`reclaim.hcl:3:3: error: Invalid duration: queue "q": spill_after = "later" is not a duration of 0 or more`},
		{"bad region_lost_timeout", "region_lost_timeout = \"soon\"\n",
			`reclaim.hcl:1:1: error: Invalid duration: region_lost_timeout = "soon" is not a duration of 0 or more`},
		{"bad on_region_loss", "on_region_loss = \"retry\"\n",
			`reclaim.hcl:1:1: error: Invalid on_region_loss: on_region_loss = "retry" is neither "requeue" nor "hold"`},
		{"bad workload on_region_loss", "workload \"w\" {\n  on_region_loss = \"drop\"\n}\n",
			`reclaim.hcl:2:3: error: Invalid workload: workload "w": on_region_loss = "drop" is neither "requeue" nor "hold"`},
		{"a queue naming a region", "queue \"q\" {\n  priority = 10\n  region = \"west\"\n}\n",
			`reclaim.hcl:3:3: error: Invalid region: queue "q": region = "west": its one value is "auto" (the broker chooses the region of the queue's jobs that name none)`},
		{"bad undeclared_gpu_access", "undeclared_gpu_access = \"allow\"\n",
			`reclaim.hcl:1:1: error: Invalid undeclared_gpu_access: undeclared_gpu_access = "allow" is neither "refuse" nor "warn"`},
		{"bad approver", "approvers = [\"ops\", \"group:sre\"]\n",
			`reclaim.hcl:1:1: error: Invalid approver: approvers: "group:sre" is neither a token name nor "role:<name>" or "policy:<name>"`},
		{"queue of no workload", "workload \"dev\" {\n  max_gpus = 1\n}\n",
			`queues.hcl:2:1: error: Unknown workload: queue "inference" has workload "inference", which no workload block defines`},
		{"bad default ttl", "workload \"dev\" {\n  default_ttl = \"a day\"\n}\n",
			`reclaim.hcl:2:3: error: Invalid workload: workload "dev": default_ttl = "a day" is not a duration above 0`},
		{"unknown attribute", rule(`idle = true`, `action = "stop"`),
			`reclaim.hcl:2:3: error: Unsupported argument: An argument named "idle" is not expected here.`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues), "reclaim.hcl": []byte(c.rule)}, 0)
			if out := policyhcl.FormatDiagnostics(diags); p != nil || !strings.Contains(out, c.want) {
				t.Errorf("want a diagnostic containing\n  %s\ngot\n%s", c.want, out)
			}
		})
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
	// No approvals block: an approval at most doubles the limit, for a week.
	if b := p.Tenants["vision"].Approvals; b.MaxExtraGPUs != 4 || b.MaxDuration != policy.MaxApprovalDuration {
		t.Errorf("default approval bounds: %+v", b)
	}
	bounded, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(queues + `
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  limit      = 4
  approvals {
    max_extra_gpus = 8
    max_duration   = "48h"
  }
}
`)}, 0)
	if bounded == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	vision := bounded.Tenants["vision"]
	if err := vision.CheckApproval(8, 48*time.Hour); err != nil {
		t.Errorf("within the bounds: %v", err)
	}
	for _, c := range []struct {
		extra int
		d     time.Duration
		want  string
	}{
		{9, time.Hour, "at most 8 GPUs above its limit"},
		{0, 49 * time.Hour, "last at most 48h0m0s (approvals { max_duration }), not 49h0m0s"},
	} {
		if err := vision.CheckApproval(c.extra, c.d); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckApproval(%d, %s) = %v, want %q", c.extra, c.d, err, c.want)
		}
	}
	raised := p.WithExtraLimit("vision", 3)
	if raised.TenantOf("vision-dev").Limit.Total() != 7 || p.TenantOf("vision-dev").Limit.Total() != 4 || raised.TenantOf("vision").Guaranteed.Total() != 2 {
		t.Errorf("raised %v, original %v", raised.TenantOf("vision-dev").Limit, p.TenantOf("vision-dev").Limit)
	}
}

// Dispatch: ordered by default, spilling at once; the top level sets the
// mode, the order and spill_after, a queue its own mode and spill_after, and
// whether its jobs that name no region are auto.
func TestDispatchIsReadPerPolicyAndQueue(t *testing.T) {
	src := queues + `
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "serving"]
}
queue "serving" {
  priority    = 70
  dispatch    = "best_fit"
  spill_after = "10m"
  region      = "auto"
}
`
	p, diags := policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(src)}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	if got := p.DispatchFor("vision", ""); got.Mode != "ordered" || len(got.Order) != 0 || got.SpillAfter != 0 || p.AutoRegionFor("vision", "") {
		t.Errorf("default: %+v, auto %v; want ordered, no order, spilling at once, not auto", got, p.AutoRegionFor("vision", ""))
	}
	if got := p.DispatchFor("vision", "serving"); got.Mode != "best_fit" || got.SpillAfter != 10*time.Minute || !p.AutoRegionFor("vision", "serving") {
		t.Errorf("queue serving: %+v, auto %v; want best_fit, spill_after 10m, auto", got, p.AutoRegionFor("vision", "serving"))
	}
	p, diags = policyhcl.Parse(map[string][]byte{"queues.hcl": []byte(src + "dispatch = \"best_fit\"\ndispatch_order = [\"west\", \"east\"]\nspill_after = \"1h\"\n")}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	if got := p.DispatchFor("vision", "training"); got.Mode != "best_fit" || strings.Join(got.Order, ",") != "west,east" || got.SpillAfter != time.Hour {
		t.Errorf("top level: %+v; want best_fit, west,east, spill_after 1h", got)
	}
	if got := p.DispatchFor("vision", "serving"); got.SpillAfter != 10*time.Minute {
		t.Errorf("queue serving under a top-level spill_after: %+v; want its own 10m", got)
	}
}

// Region loss: a lost region's jobs wait 15m by default; then a batch job is
// requeued and any other held, unless the policy or the job's workload says
// otherwise.
func TestRegionLossIsReadPerPolicyAndWorkload(t *testing.T) {
	src := `
queue "training" {
  priority = 60
}
queue "serving" {
  priority = 70
}
workload "training" {}
workload "serving" {
  on_region_loss = "requeue"
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "serving"]
}
`
	p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	for _, c := range []struct{ queue, typ, want string }{
		{"training", "batch", "requeue"}, {"training", "service", "hold"}, {"serving", "service", "requeue"},
	} {
		if got := p.OnRegionLossFor("vision", c.queue, c.typ); got != c.want {
			t.Errorf("default, a %s job of %s: %q, want %q", c.typ, c.queue, got, c.want)
		}
	}
	if p.RegionLostTimeout != 15*time.Minute {
		t.Errorf("region_lost_timeout %s by default, want 15m", p.RegionLostTimeout)
	}
	p, diags = policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src + "region_lost_timeout = \"5m\"\non_region_loss = \"hold\"\n")}, 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	if got := p.OnRegionLossFor("vision", "", "batch"); got != "hold" || p.RegionLostTimeout != 5*time.Minute {
		t.Errorf("top level hold, 5m: a batch job %q, timeout %s", got, p.RegionLostTimeout)
	}
	if got := p.OnRegionLossFor("vision", "serving", "batch"); got != "requeue" {
		t.Errorf("workload serving's own requeue under a top-level hold: %q", got)
	}
}
