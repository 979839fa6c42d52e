package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
)

// Usage is the usage block: how GPU use is measured.
type Usage struct {
	// IdleBelow (percent): a GPU sampled below it is idle, at or above it
	// busy (right-sizing, and the idle share of GPU-hours).
	IdleBelow float64
	// Retention is how long daily GPU-hour rollups are kept.
	Retention time.Duration
}

// Defaults of the usage block and of currency.
const (
	DefaultIdleBelow      = 5
	DefaultUsageRetention = 400 * 24 * time.Hour
	DefaultCurrency       = "USD"
)

type usageBody struct {
	IdleBelow *float64 `hcl:"idle_below,optional"`
	Retention *string  `hcl:"retention,optional"`
}

func (p *Policy) usage(b *hcl.Block) hcl.Diagnostics {
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

// currency reads the top-level currency attribute (once in the policy set).
func (p *Policy) currency(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	if prev, dup := seen["currency"]; dup {
		return hcl.Diagnostics{duplicate("currency", "", a.Range, prev)}
	}
	seen["currency"] = a.Range
	var c string
	if d := gohcl.DecodeExpression(a.Expr, nil, &c); d.HasErrors() {
		return d
	}
	if c == "" || strings.ContainsAny(c, " \t\n") {
		return hcl.Diagnostics{errorAt(a.Range, "Invalid currency", fmt.Sprintf("currency = %q is not a currency code such as \"USD\"", c))}
	}
	p.Currency = c
	return nil
}

// FairShare is the fair_share block: queue order by each tenant's recent
// GPU-hours rather than by what it holds this moment.
type FairShare struct {
	// Enabled: a fair_share block is present. Without one the decayed
	// GPU-hours are kept all the same (with the defaults), only not used.
	Enabled bool
	// HalfLife: GPU-hours this long ago count half.
	HalfLife time.Duration
	// IdleWeight is what an allocated but idle GPU-hour counts for, a busy
	// one counting 1.
	IdleWeight float64
}

// Defaults of the fair_share block.
const (
	DefaultHalfLife   = 24 * time.Hour
	DefaultIdleWeight = 1.0
)

type fairShareBody struct {
	HalfLife   *string  `hcl:"half_life,optional"`
	IdleWeight *float64 `hcl:"idle_weight,optional"`
}

func (p *Policy) fairShare(b *hcl.Block) hcl.Diagnostics {
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
	return diags
}

// Budget is a tenant's budget block: GPU-hours (allocated) per period.
type Budget struct {
	GPUHours float64
	Period   string // BudgetDay, BudgetWeek or BudgetMonth (UTC; weeks start on Monday)
}

// Budget periods.
const (
	BudgetDay   = "day"
	BudgetWeek  = "week"
	BudgetMonth = "month"
)

// approvers reads the top-level approvers attribute (once in the policy set):
// token names, "role:<name>" or "policy:<name>".
func (p *Policy) approvers(a *hcl.Attribute, seen map[string]hcl.Range) hcl.Diagnostics {
	if prev, dup := seen["approvers"]; dup {
		return hcl.Diagnostics{duplicate("approvers", "", a.Range, prev)}
	}
	seen["approvers"] = a.Range
	var list []string
	if d := gohcl.DecodeExpression(a.Expr, nil, &list); d.HasErrors() {
		return d
	}
	for _, entry := range list {
		kind, name, qualified := strings.Cut(entry, ":")
		if entry == "" || (qualified && (name == "" || (kind != SubmitterRole && kind != SubmitterPolicy))) {
			return hcl.Diagnostics{errorAt(a.Range, "Invalid approver",
				fmt.Sprintf("approvers: %q is neither a token name nor \"role:<name>\" or \"policy:<name>\"", entry))}
		}
	}
	p.Approvers = list
	return nil
}
