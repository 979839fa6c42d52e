package policyhcl

import (
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

type workloadBody struct {
	Gang            *bool   `hcl:"gang,optional"`
	CheckpointGrace *string `hcl:"checkpoint_grace,optional"`
	RestartAttempts *int    `hcl:"restart_attempts,optional"`
	RequireUpdate   *bool   `hcl:"require_update,optional"`
	ProtectMinCount *bool   `hcl:"protect_min_count,optional"`
	MaxGPUs         *int    `hcl:"max_gpus,optional"`
	DefaultTTL      *string `hcl:"default_ttl,optional"`
	Shared          *bool   `hcl:"shared,optional"`
	OnRegionLoss    *string `hcl:"on_region_loss,optional"`
	// PromoteBelow overrides borrowing.promote_below for its work.
	PromoteBelow *float64 `hcl:"promote_below,optional"`
}

func (p *parser) addWorkload(b *hcl.Block) hcl.Diagnostics {
	var wb workloadBody
	if d := gohcl.DecodeBody(b.Body, nil, &wb); d.HasErrors() {
		return d
	}
	w := &policy.Workload{Name: b.Labels[0], Pos: pos(b.DefRange)}
	if _, dup := p.Workloads[w.Name]; dup {
		return hcl.Diagnostics{duplicate("workload", w.Name, b.DefRange, p.defs["workload "+w.Name])}
	}
	var diags hcl.Diagnostics
	bad := func(attr, detail string) {
		diags = append(diags, errorAt(attrRange(b, attr), "Invalid workload", fmt.Sprintf("workload %q: %s", w.Name, detail)))
	}
	for _, d := range []struct {
		attr string
		v    *string
		dst  *time.Duration
	}{{"checkpoint_grace", wb.CheckpointGrace, &w.CheckpointGrace}, {"default_ttl", wb.DefaultTTL, &w.DefaultTTL}} {
		if d.v == nil {
			continue
		}
		v, err := time.ParseDuration(*d.v)
		if err != nil || v <= 0 {
			bad(d.attr, fmt.Sprintf("%s = %q is not a duration above 0", d.attr, *d.v))
			continue
		}
		*d.dst = v
	}
	for _, n := range []struct {
		attr string
		v    *int
		dst  *int
	}{{"restart_attempts", wb.RestartAttempts, &w.RestartAttempts}, {"max_gpus", wb.MaxGPUs, &w.MaxGPUs}} {
		if n.v == nil {
			continue
		}
		if *n.v < 1 {
			bad(n.attr, fmt.Sprintf("%s = %d must be 1 or more", n.attr, *n.v))
			continue
		}
		*n.dst = *n.v
	}
	for _, f := range []struct {
		v   *bool
		dst *bool
	}{{wb.Gang, &w.Gang}, {wb.RequireUpdate, &w.RequireUpdate}, {wb.ProtectMinCount, &w.ProtectMinCount}, {wb.Shared, &w.Shared}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if v := wb.OnRegionLoss; v != nil {
		if *v != policy.RegionLossRequeue && *v != policy.RegionLossHold {
			bad("on_region_loss", fmt.Sprintf("on_region_loss = %q is neither %q nor %q", *v, policy.RegionLossRequeue, policy.RegionLossHold))
		}
		w.OnRegionLoss = *v
	}
	if v := wb.PromoteBelow; v != nil {
		if d := promoteBelow(b, fmt.Sprintf("workload %q", w.Name), *v); d != nil {
			diags = append(diags, d)
		} else {
			w.PromoteBelow = v
		}
	}
	p.Workloads[w.Name] = w
	p.defs["workload "+w.Name] = b.DefRange
	return diags
}

// checkWorkloads: once a policy defines workloads, every queue's workload
// names one of them.
func (p *parser) checkWorkloads() hcl.Diagnostics {
	if len(p.Workloads) == 0 {
		return nil
	}
	names := make([]string, 0, len(p.Workloads))
	for n := range p.Workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	var diags hcl.Diagnostics
	for _, q := range p.Queues {
		if _, ok := p.Workloads[q.Workload]; !ok {
			diags = append(diags, errorAt(rangeOf(q.Pos), "Unknown workload",
				fmt.Sprintf("queue %q has workload %q, which no workload block defines (defined: %v)", q.Name, q.Workload, names)))
		}
	}
	return diags
}
