package policyhcl

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// actionsFor are the actions that make sense for each condition: moving an
// idle, expired or unadmitted job elsewhere changes nothing about it.
var actionsFor = map[policy.Condition][]policy.Action{
	policy.CondIdle:       {policy.ActionStop, policy.ActionRequeue, policy.ActionNotify},
	policy.CondLifetime:   {policy.ActionStop, policy.ActionNotify},
	policy.CondUnhealthy:  {policy.ActionReschedule, policy.ActionStop, policy.ActionNotify},
	policy.CondRestarts:   {policy.ActionStop, policy.ActionReschedule, policy.ActionNotify},
	policy.CondUnadmitted: {policy.ActionStop, policy.ActionRequeue, policy.ActionNotify},
}

type reclaimSettingsBody struct {
	Period    *string `hcl:"period,optional"`
	Retention *string `hcl:"retention,optional"`
}

func (p *parser) reclaimSettings(b *hcl.Block) hcl.Diagnostics {
	var sb reclaimSettingsBody
	if d := gohcl.DecodeBody(b.Body, nil, &sb); d.HasErrors() {
		return d
	}
	var diags hcl.Diagnostics
	for _, s := range []struct {
		attr string
		v    *string
		dst  *time.Duration
		min  time.Duration
		max  time.Duration // 0: none
	}{{"period", sb.Period, &p.ReclaimSettings.Period, time.Second, maxReclaimPeriod}, {"retention", sb.Retention, &p.ReclaimSettings.Retention, time.Minute, 0}} {
		if s.v == nil {
			continue
		}
		d, err := time.ParseDuration(*s.v)
		if err != nil || d < s.min || s.max > 0 && d > s.max {
			bound := "at least " + s.min.String()
			if s.max > 0 {
				bound += " and at most " + s.max.String()
			}
			diags = append(diags, errorAt(b.DefRange, "Invalid duration", fmt.Sprintf("reclaim_settings: %s = %q is not a duration of %s", s.attr, *s.v, bound)))
			continue
		}
		*s.dst = d
	}
	return diags
}

// maxReclaimPeriod bounds reclaim_settings.period: the reclaim pass also
// charges GPU time and measures over-limit time, which a period of years
// ("2562047h") silently turned off.
const maxReclaimPeriod = 10 * time.Minute

type reclaimBody struct {
	Workload           *string  `hcl:"workload,optional"`
	Queue              *string  `hcl:"queue,optional"`
	Tenant             *string  `hcl:"tenant,optional"`
	IdleBelow          *float64 `hcl:"idle_below,optional"`
	IdleFor            *string  `hcl:"idle_for,optional"`
	MaxLifetime        *string  `hcl:"max_lifetime,optional"`
	MaxExtend          *string  `hcl:"max_extend,optional"`
	DeviceUnhealthyFor *string  `hcl:"device_unhealthy_for,optional"`
	RestartsAbove      *int     `hcl:"restarts_above,optional"`
	Within             *string  `hcl:"within,optional"`
	Unadmitted         *bool    `hcl:"unadmitted,optional"`
	Action             string   `hcl:"action"`
	Grace              *string  `hcl:"grace,optional"`
	Mode               *string  `hcl:"mode,optional"`
}

// addReclaim reads a reclaim block; selectors naming queues and tenants are
// checked once every block is read.
// Long: one attribute per rule setting, each with its own file:line diagnostic.
func (p *parser) addReclaim(b *hcl.Block) hcl.Diagnostics {
	var rb reclaimBody
	if d := gohcl.DecodeBody(b.Body, nil, &rb); d.HasErrors() {
		return d
	}
	name := b.Labels[0]
	if _, dup := p.Reclaim[name]; dup {
		return hcl.Diagnostics{duplicate("reclaim", name, b.DefRange, p.defs["reclaim "+name])}
	}
	r := &policy.ReclaimRule{Name: name, Action: policy.Action(rb.Action), Mode: policy.ModeDryRun, Pos: pos(b.DefRange)}
	attrs, _ := b.Body.JustAttributes()
	at := func(attr string) hcl.Range {
		if a, ok := attrs[attr]; ok {
			return a.Expr.Range()
		}
		return b.DefRange
	}
	var diags hcl.Diagnostics
	bad := func(attr, summary, detail string) {
		diags = append(diags, errorAt(at(attr), summary, fmt.Sprintf("reclaim %q: %s", name, detail)))
	}
	duration := func(attr string, v *string, dst *time.Duration) {
		if v == nil {
			return
		}
		d, err := time.ParseDuration(*v)
		if err != nil || d < 0 {
			bad(attr, "Invalid duration", fmt.Sprintf("%s = %q is not a duration such as \"30m\" or \"8h\"", attr, *v))
			return
		}
		*dst = d
	}
	for _, s := range []struct {
		v   *string
		dst *string
	}{{rb.Workload, &r.Workload}, {rb.Queue, &r.Queue}, {rb.Tenant, &r.Tenant}} {
		if s.v != nil {
			*s.dst = *s.v
		}
	}
	duration("idle_for", rb.IdleFor, &r.IdleFor)
	duration("max_lifetime", rb.MaxLifetime, &r.MaxLifetime)
	duration("max_extend", rb.MaxExtend, &r.MaxExtend)
	duration("device_unhealthy_for", rb.DeviceUnhealthyFor, &r.DeviceUnhealthyFor)
	duration("within", rb.Within, &r.Within)
	duration("grace", rb.Grace, &r.Grace)
	if rb.Mode != nil {
		r.Mode = policy.Mode(*rb.Mode)
		if r.Mode != policy.ModeEnforce && r.Mode != policy.ModeDryRun {
			bad("mode", "Invalid reclaim mode", fmt.Sprintf("mode %q is neither %q nor %q", *rb.Mode, policy.ModeEnforce, policy.ModeDryRun))
		}
	}

	// Exactly one condition, each with its companion attribute.
	var conds []policy.Condition
	if rb.IdleBelow != nil || rb.IdleFor != nil {
		conds = append(conds, policy.CondIdle)
		if rb.IdleBelow == nil || rb.IdleFor == nil {
			bad("idle_below", "Incomplete condition", "idle_below and idle_for go together: every GPU below idle_below % for idle_for")
		} else if r.IdleBelow = *rb.IdleBelow; r.IdleBelow <= 0 || r.IdleBelow > 100 {
			bad("idle_below", "Invalid idle threshold", fmt.Sprintf("idle_below = %g is not a utilisation percentage above 0 and at most 100", r.IdleBelow))
		}
	}
	if rb.MaxLifetime != nil {
		conds = append(conds, policy.CondLifetime)
	}
	if rb.MaxExtend != nil && rb.MaxLifetime == nil {
		bad("max_extend", "max_extend without max_lifetime", "max_extend bounds how far a job's nomad-gpu.ttl may extend max_lifetime")
	}
	if rb.DeviceUnhealthyFor != nil {
		conds = append(conds, policy.CondUnhealthy)
	}
	if rb.RestartsAbove != nil || rb.Within != nil {
		conds = append(conds, policy.CondRestarts)
		if rb.RestartsAbove == nil || rb.Within == nil {
			bad("restarts_above", "Incomplete condition", "restarts_above and within go together: more than restarts_above restarts within that long")
		} else if r.RestartsAbove = *rb.RestartsAbove; r.RestartsAbove < 0 {
			bad("restarts_above", "Invalid restart count", fmt.Sprintf("restarts_above = %d is below 0", r.RestartsAbove))
		}
	}
	if rb.Unadmitted != nil {
		if !*rb.Unadmitted {
			bad("unadmitted", "Invalid condition", "unadmitted = false matches nothing; remove the rule, or set unadmitted = true")
		}
		conds = append(conds, policy.CondUnadmitted)
	}
	switch len(conds) {
	case 0:
		diags = append(diags, errorAt(b.DefRange, "Reclaim rule without a condition", fmt.Sprintf(
			"reclaim %q sets none of idle_below + idle_for, max_lifetime, device_unhealthy_for, restarts_above + within, unadmitted; set exactly one", name)))
	case 1:
		r.Condition = conds[0]
		allowed := actionsFor[r.Condition]
		ok := false
		for _, a := range allowed {
			ok = ok || a == r.Action
		}
		if !ok {
			names := make([]string, len(allowed))
			for i, a := range allowed {
				names[i] = string(a)
			}
			bad("action", "Action does not fit the condition", fmt.Sprintf("action %q does not make sense for %s; use one of %s",
				rb.Action, r.Condition, strings.Join(names, ", ")))
		}
	default:
		names := make([]string, len(conds))
		for i, c := range conds {
			names[i] = string(c)
		}
		diags = append(diags, errorAt(b.DefRange, "Reclaim rule with several conditions", fmt.Sprintf(
			"reclaim %q sets %s; a rule has exactly one condition, so write one rule for each", name, strings.Join(names, " and "))))
	}
	p.Reclaim[name] = r
	p.defs["reclaim "+name] = b.DefRange
	return diags
}

// checkReclaimSelectors checks that reclaim rules name queues and tenants the
// policy defines.
func (p *parser) checkReclaimSelectors() hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, r := range p.ReclaimRules() {
		if _, ok := p.Queues[r.Queue]; r.Queue != "" && !ok {
			diags = append(diags, errorAt(rangeOf(r.Pos), "Unknown queue", fmt.Sprintf("reclaim %q selects queue %q, which no queue block defines", r.Name, r.Queue)))
		}
		if _, ok := p.Tenants[r.Tenant]; r.Tenant != "" && !ok {
			diags = append(diags, errorAt(rangeOf(r.Pos), "Unknown tenant", fmt.Sprintf("reclaim %q selects tenant %q, which no tenant block defines", r.Name, r.Tenant)))
		}
	}
	return diags
}
