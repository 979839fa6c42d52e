package policy

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
)

// Usage is the usage block: how GPU use is measured.
type Usage struct {
	// IdleBelow (percent): a GPU sampled below it is idle, at or above it
	// busy (right-sizing, and the idle share of GPU-hours).
	IdleBelow float64
}

// DefaultIdleBelow is usage.idle_below when the policy sets none.
const DefaultIdleBelow = 5

type usageBody struct {
	IdleBelow *float64 `hcl:"idle_below,optional"`
}

func (p *Policy) usage(b *hcl.Block) hcl.Diagnostics {
	var ub usageBody
	if d := gohcl.DecodeBody(b.Body, nil, &ub); d.HasErrors() {
		return d
	}
	if ub.IdleBelow == nil {
		return nil
	}
	if v := *ub.IdleBelow; v <= 0 || v > 100 {
		attrs, _ := b.Body.JustAttributes()
		rng := b.DefRange
		if a, ok := attrs["idle_below"]; ok {
			rng = a.Range
		}
		return hcl.Diagnostics{errorAt(rng, "Invalid idle threshold", fmt.Sprintf("usage: idle_below = %g is not a utilisation percentage above 0 and at most 100", v))}
	}
	p.Usage.IdleBelow = *ub.IdleBelow
	return nil
}
