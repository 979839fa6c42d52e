package policyhcl

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

type usageBody struct {
	IdleBelow *float64 `hcl:"idle_below,optional"`
	Retention *string  `hcl:"retention,optional"`
}

func (p *parser) usage(b *hcl.Block) hcl.Diagnostics {
	var ub usageBody
	if d := gohcl.DecodeBody(b.Body, nil, &ub); d.HasErrors() {
		return d
	}
	var diags hcl.Diagnostics
	if ub.Retention != nil {
		d, err := time.ParseDuration(*ub.Retention)
		if err != nil || d < 24*time.Hour {
			diags = append(diags, errorAt(attrRange(b, "retention"), "Invalid duration",
				fmt.Sprintf("usage: retention = %q is not a duration of at least 24h (days are written in hours: 400 days is \"9600h\")", *ub.Retention)))
		} else {
			p.Usage.Retention = d
		}
	}
	if ub.IdleBelow == nil {
		return diags
	}
	if v := *ub.IdleBelow; v <= 0 || v > 100 {
		return append(diags, errorAt(attrRange(b, "idle_below"), "Invalid idle threshold", fmt.Sprintf("usage: idle_below = %g is not a utilisation percentage above 0 and at most 100", v)))
	}
	p.Usage.IdleBelow = *ub.IdleBelow
	return diags
}

// attrRange is where attribute name is set in block b, or the block's header.
func attrRange(b *hcl.Block, name string) hcl.Range {
	if attrs, _ := b.Body.JustAttributes(); attrs != nil {
		if a, ok := attrs[name]; ok {
			return a.Range
		}
	}
	return b.DefRange
}

// topLevel decodes top-level attribute a, which the policy set may hold
// once, into out.
func topLevel(a *hcl.Attribute, seen map[string]hcl.Range, out any) hcl.Diagnostics {
	if prev, dup := seen[a.Name]; dup {
		return hcl.Diagnostics{duplicate(a.Name, "", a.Range, prev)}
	}
	seen[a.Name] = a.Range
	return gohcl.DecodeExpression(a.Expr, nil, out)
}

// currency reads the top-level currency attribute (once in the policy set).
func (p *parser) currency(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	var c string
	if d := topLevel(a, seen, &c); d.HasErrors() {
		return d
	}
	if c == "" || strings.ContainsAny(c, " \t\n") {
		return hcl.Diagnostics{errorAt(a.Range, "Invalid currency", fmt.Sprintf("currency = %q is not a currency code such as \"USD\"", c))}
	}
	p.Currency = c
	return nil
}

type fairShareBody struct {
	HalfLife         *string  `hcl:"half_life,optional"`
	IdleWeight       *float64 `hcl:"idle_weight,optional"`
	OldestFirstAfter *string  `hcl:"oldest_first_after,optional"`
}

func (p *parser) fairShare(b *hcl.Block) hcl.Diagnostics {
	var fb fairShareBody
	if d := gohcl.DecodeBody(b.Body, nil, &fb); d.HasErrors() {
		return d
	}
	p.FairShare.Enabled = true
	var diags hcl.Diagnostics
	if fb.HalfLife != nil {
		d, err := time.ParseDuration(*fb.HalfLife)
		if err != nil || d < time.Minute {
			diags = append(diags, errorAt(attrRange(b, "half_life"), "Invalid duration",
				fmt.Sprintf("fair_share: half_life = %q is not a duration of at least 1m", *fb.HalfLife)))
		} else {
			p.FairShare.HalfLife = d
		}
	}
	if fb.IdleWeight != nil {
		if w := *fb.IdleWeight; w < 0 || w > 100 {
			diags = append(diags, errorAt(attrRange(b, "idle_weight"), "Invalid idle weight",
				fmt.Sprintf("fair_share: idle_weight = %g must be from 0 (idle time is free) to 100", w)))
		} else {
			p.FairShare.IdleWeight = w
		}
	}
	if v := fb.OldestFirstAfter; v != nil {
		d, err := time.ParseDuration(*v)
		if err != nil || d < 0 {
			diags = append(diags, errorAt(attrRange(b, "oldest_first_after"), "Invalid duration",
				fmt.Sprintf("fair_share: oldest_first_after = %q is not a duration of 0 or more (\"6h\"; 0: the share alone orders borrowing work)", *v)))
		} else {
			p.FairShare.OldestFirstAfter = d
		}
	}
	return diags
}

// approvers reads the top-level approvers attribute (once in the policy set):
// token names, "role:<name>" or "policy:<name>".
func (p *parser) approvers(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	var list []string
	if d := topLevel(a, seen, &list); d.HasErrors() {
		return d
	}
	for _, entry := range list {
		kind, name, qualified := strings.Cut(entry, ":")
		if entry == "" || (qualified && (name == "" || (kind != policy.SubmitterRole && kind != policy.SubmitterPolicy))) {
			return hcl.Diagnostics{errorAt(a.Range, "Invalid approver",
				fmt.Sprintf("approvers: %q is neither a token name nor \"role:<name>\" or \"policy:<name>\"", entry))}
		}
	}
	p.Approvers = list
	return nil
}

// either reads a top-level attribute that is one of two words into *dst.
func either(a *hcl.Attribute, seen map[string]hcl.Range, dst *string, one, other string) hcl.Diagnostics {
	var v string
	if d := topLevel(a, seen, &v); d.HasErrors() {
		return d
	}
	if v != one && v != other {
		return hcl.Diagnostics{errorAt(a.Range, "Invalid "+a.Name, fmt.Sprintf("%s = %q is neither %q nor %q", a.Name, v, one, other))}
	}
	*dst = v
	return nil
}

// dispatchOrder reads dispatch_order: region names, each once.
func (p *parser) dispatchOrder(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	var order []string
	if d := topLevel(a, seen, &order); d.HasErrors() {
		return d
	}
	for i, name := range order {
		if strings.TrimSpace(name) == "" || slices.Contains(order[:i], name) {
			return hcl.Diagnostics{errorAt(a.Range, "Invalid dispatch_order",
				fmt.Sprintf("dispatch_order names region %q: each entry must be a region's name, given once", name))}
		}
	}
	p.Dispatch.Order = order
	return nil
}

// queueRegion reads a queue's spill_after (a duration of 0 or more) and
// region ("auto", its one value: the queue's jobs that name no region leave
// it to the broker).
func queueRegion(b *hcl.Block, q *policy.Queue, qb queueBody) hcl.Diagnostics {
	var diags hcl.Diagnostics
	if v := qb.SpillAfter; v != nil {
		if g, err := time.ParseDuration(*v); err != nil || g < 0 {
			diags = append(diags, errorAt(attrRange(b, "spill_after"), "Invalid duration",
				fmt.Sprintf("queue %q: spill_after = %q is not a duration of 0 or more", q.Name, *v)))
		} else {
			q.SpillAfter = &g
		}
	}
	if v := qb.Region; v != nil {
		if *v != policy.RegionAuto {
			diags = append(diags, errorAt(attrRange(b, "region"), "Invalid region",
				fmt.Sprintf("queue %q: region = %q: its one value is %q (the broker chooses the region of the queue's jobs that name none)", q.Name, *v, policy.RegionAuto)))
		}
		q.AutoRegion = true
	}
	return diags
}

// undeclaredAccess reads undeclared_gpu_access: "refuse" or "warn".
func (p *parser) undeclaredAccess(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	return either(a, seen, &p.UndeclaredGPUAccess, policy.AccessRefuse, policy.AccessWarn)
}

// overLimit reads over_limit: "reclaim" or "wait".
func (p *parser) overLimit(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	return either(a, seen, &p.OverLimit, policy.OverReclaim, policy.OverWait)
}

// grace reads a top-level grace (over_limit_grace, make_room_grace): a
// duration of 0 or more.
func grace(a *hcl.Attribute, seen map[string]hcl.Range, dst *time.Duration) hcl.Diagnostics {
	var v string
	if d := topLevel(a, seen, &v); d.HasErrors() {
		return d
	}
	g, err := time.ParseDuration(v)
	if err != nil || g < 0 {
		return hcl.Diagnostics{errorAt(a.Range, "Invalid duration",
			fmt.Sprintf("%s = %q is not a duration of 0 or more", a.Name, v))}
	}
	*dst = g
	return nil
}
