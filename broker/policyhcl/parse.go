// Package policyhcl reads the broker's HCL policy files into a policy.Policy:
// every block and attribute checked, every problem an HCL diagnostic with
// the file:line:col it is about, and a policy only when there is no error.
package policyhcl

import (
	"fmt"
	"math/big"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

var fileSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "currency"}, {Name: "approvers"}, {Name: "undeclared_gpu_access"}, {Name: "over_limit"}, {Name: "over_limit_grace"}, {Name: "make_room"}, {Name: "make_room_grace"}, {Name: "dispatch"}, {Name: "dispatch_order"}, {Name: "spill_after"}, {Name: "region_lost_timeout"}, {Name: "on_region_loss"}}, Blocks: []hcl.BlockHeaderSchema{
	{Type: "queue", LabelNames: []string{"name"}},
	{Type: "tenant", LabelNames: []string{"name"}},
	{Type: "gpu_class", LabelNames: []string{"name"}},
	{Type: "borrowing"},
	{Type: "preemption"},
	{Type: "placement"},
	{Type: "region", LabelNames: []string{"name"}},
	{Type: "reclaim", LabelNames: []string{"name"}},
	{Type: "reclaim_settings"},
	{Type: "usage"},
	{Type: "fair_share"},
	{Type: "workload", LabelNames: []string{"name"}},
}}

type regionBody struct {
	Broker string `hcl:"broker"`
}

type queueBody struct {
	Priority                int     `hcl:"priority"`
	Workload                *string `hcl:"workload,optional"`
	PreemptsWithinGuarantee bool    `hcl:"preempts_within_guarantee,optional"`
	Dispatch                *string `hcl:"dispatch,optional"`
	SpillAfter              *string `hcl:"spill_after,optional"`
	Region                  *string `hcl:"region,optional"`
}

type tenantBody struct {
	Namespaces []string        `hcl:"namespaces"`
	Queues     []string        `hcl:"queues"`
	Guaranteed hcl.Expression  `hcl:"guaranteed,optional"`
	Limit      hcl.Expression  `hcl:"limit,optional"`
	MaxQueued  *int            `hcl:"max_queued,optional"`
	MaxRequest *int            `hcl:"max_queued_request_bytes,optional"`
	Submitters hcl.Expression  `hcl:"submitters,optional"`
	Budget     *budgetBody     `hcl:"budget,block"`
	Approvals  *approvalsBody  `hcl:"approvals,block"`
	Regions    []regionCapBody `hcl:"region,block"`
}

type regionCapBody struct {
	Name  string    `hcl:"name,label"`
	Limit float64   `hcl:"limit"`
	Range hcl.Range `hcl:",def_range"`
}

type approvalsBody struct {
	MaxExtraGPUs *int      `hcl:"max_extra_gpus,optional"`
	MaxDuration  *string   `hcl:"max_duration,optional"`
	Range        hcl.Range `hcl:",def_range"`
}

type budgetBody struct {
	GPUHours float64   `hcl:"gpu_hours"`
	Period   string    `hcl:"period"`
	Range    hcl.Range `hcl:",def_range"`
}

type classBody struct {
	Models []string `hcl:"models"`
	Price  *float64 `hcl:"price_per_gpu_hour,optional"`
}

type borrowingBody struct {
	Enabled    *bool   `hcl:"enabled,optional"`
	Priority   *int    `hcl:"priority,optional"`
	Backoff    *string `hcl:"backoff,optional"`
	MaxBackoff *string `hcl:"max_backoff,optional"`
	// PromoteBelow is a share of the guarantee, 0 to 1.
	PromoteBelow *float64 `hcl:"promote_below,optional"`
	SubBands     *bool    `hcl:"sub_bands,optional"`
	SubBandStep  *string  `hcl:"sub_band_step,optional"`
	// MaxPreemptions caps a job's evictions while borrowed (0: no cap).
	MaxPreemptions *int `hcl:"max_preemptions,optional"`
}

type placementBody struct {
	Mode         *string `hcl:"mode,optional"`
	ReserveAfter *string `hcl:"reserve_after,optional"`
}

type preemptionBody struct {
	Batch   *bool `hcl:"batch,optional"`
	Service *bool `hcl:"service,optional"`
}

// parser builds one policy from its files, and remembers what it needs to
// check across blocks.
type parser struct {
	*policy.Policy
	byNamespace map[string]*policy.Tenant // each namespace's tenant so far
	defs        map[string]hcl.Range      // where each "<block type> <name>" is defined, for duplicates
	subBands    hcl.Range                 // where borrowing's sub_bands is set: one asked for needs room, the default goes without
}

// pos is where an HCL range starts, as the policy keeps it.
func pos(r hcl.Range) policy.Pos {
	return policy.Pos{File: r.Filename, Line: r.Start.Line, Column: r.Start.Column}
}

// rangeOf is a policy position as an HCL range, for a diagnostic.
func rangeOf(p policy.Pos) hcl.Range {
	start := hcl.Pos{Line: p.Line, Column: p.Column}
	return hcl.Range{Filename: p.File, Start: start, End: start}
}

// Defaults of the optional blocks.
const defaultBorrowingPriority = 20

// Parse reads a policy set from file contents keyed by file name. capacity is
// the cluster's GPU count for the over-commitment warning (0: unknown, no check).
// Long: the policy's blocks in their fixed order, each checked against the ones read before it.
func Parse(files map[string][]byte, capacity int) (*policy.Policy, hcl.Diagnostics) {
	pol := &policy.Policy{Queues: map[string]*policy.Queue{}, Tenants: map[string]*policy.Tenant{}, Classes: map[string]*policy.GPUClass{}, Regions: map[string]*policy.Region{},
		Reclaim: map[string]*policy.ReclaimRule{}, Workloads: map[string]*policy.Workload{}, ReclaimSettings: policy.ReclaimSettings{Period: policy.DefaultReclaimPeriod, Retention: policy.DefaultReclaimRetention},
		Borrowing: policy.Borrowing{Priority: defaultBorrowingPriority, Backoff: policy.DefaultBorrowBackoff, MaxBackoff: policy.DefaultBorrowMaxBackoff,
			SubBands: true, SubBandStep: policy.DefaultSubBandStep, MaxPreemptions: policy.DefaultMaxPreemptions}, Preemption: policy.Preemption{Batch: true, Service: true},
		Placement: policy.Placement{Mode: policy.DefaultPlacementMode, ReserveAfter: policy.DefaultReserveAfter},
		Usage:     policy.Usage{IdleBelow: policy.DefaultIdleBelow, Retention: policy.DefaultUsageRetention}, Currency: policy.DefaultCurrency, UndeclaredGPUAccess: policy.AccessRefuse,
		OverLimit: policy.OverReclaim, OverLimitGrace: policy.DefaultOverLimitGrace, MakeRoom: policy.OverReclaim, MakeRoomGrace: policy.DefaultMakeRoomGrace,
		FairShare: policy.FairShare{HalfLife: policy.DefaultHalfLife, IdleWeight: policy.DefaultIdleWeight, OldestFirstAfter: policy.DefaultOldestFirstAfter},
		Dispatch:  policy.Dispatch{Mode: policy.DispatchOrdered}, RegionLostTimeout: policy.DefaultRegionLostTimeout}
	p := &parser{Policy: pol, byNamespace: map[string]*policy.Tenant{}, defs: map[string]hcl.Range{}}
	var diags hcl.Diagnostics
	var tenantBlocks []*hcl.Block
	var tenantBodies []tenantBody
	seenSingleton := map[string]hcl.Range{}

	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f, d := ParseFile(files[name], name)
		diags = append(diags, d...)
		if f == nil {
			continue
		}
		content, d := f.Body.Content(fileSchema)
		diags = append(diags, d...)
		if content == nil {
			continue
		}
		if a, ok := content.Attributes["currency"]; ok {
			diags = append(diags, p.currency(a, seenSingleton)...)
		}
		if a, ok := content.Attributes["approvers"]; ok {
			diags = append(diags, p.approvers(a, seenSingleton)...)
		}
		if a, ok := content.Attributes["undeclared_gpu_access"]; ok {
			diags = append(diags, p.undeclaredAccess(a, seenSingleton)...)
		}
		if a, ok := content.Attributes["over_limit"]; ok {
			diags = append(diags, p.overLimit(a, seenSingleton)...)
		}
		if a, ok := content.Attributes["over_limit_grace"]; ok {
			diags = append(diags, grace(a, seenSingleton, &p.OverLimitGrace)...)
		}
		if a, ok := content.Attributes["make_room"]; ok {
			diags = append(diags, either(a, seenSingleton, &p.MakeRoom, policy.OverReclaim, policy.OverWait)...)
		}
		if a, ok := content.Attributes["make_room_grace"]; ok {
			diags = append(diags, grace(a, seenSingleton, &p.MakeRoomGrace)...)
		}
		if a, ok := content.Attributes["dispatch"]; ok {
			diags = append(diags, either(a, seenSingleton, &p.Dispatch.Mode, policy.DispatchOrdered, policy.DispatchBestFit)...)
		}
		if a, ok := content.Attributes["dispatch_order"]; ok {
			diags = append(diags, p.dispatchOrder(a, seenSingleton)...)
		}
		if a, ok := content.Attributes["spill_after"]; ok {
			diags = append(diags, grace(a, seenSingleton, &p.Dispatch.SpillAfter)...)
		}
		if a, ok := content.Attributes["region_lost_timeout"]; ok {
			diags = append(diags, grace(a, seenSingleton, &p.RegionLostTimeout)...)
		}
		if a, ok := content.Attributes["on_region_loss"]; ok {
			diags = append(diags, either(a, seenSingleton, &p.OnRegionLoss, policy.RegionLossRequeue, policy.RegionLossHold)...)
		}
		for _, b := range content.Blocks {
			if len(b.Labels) > 0 && strings.TrimSpace(b.Labels[0]) == "" {
				diags = append(diags, errorAt(b.LabelRanges[0], "Empty name",
					fmt.Sprintf("a %s block needs a name: %s \"<name>\" { … }", b.Type, b.Type)))
				continue
			}
			if len(b.Labels) > 0 && strings.ContainsFunc(b.Labels[0], unicode.IsControl) {
				// Names become metric labels, KV keys and log fields.
				diags = append(diags, errorAt(b.LabelRanges[0], "Invalid name",
					fmt.Sprintf("a %s name holds a control character: %q", b.Type, b.Labels[0])))
				continue
			}
			switch b.Type {
			case "queue":
				var qb queueBody
				if d := gohcl.DecodeBody(b.Body, nil, &qb); d.HasErrors() {
					diags = append(diags, d...)
					continue
				}
				q := &policy.Queue{Name: b.Labels[0], Priority: qb.Priority, Workload: b.Labels[0], PreemptsWithinGuarantee: qb.PreemptsWithinGuarantee,
					Pos: pos(b.DefRange)}
				if qb.Workload != nil {
					q.Workload = *qb.Workload
				}
				if v := qb.Dispatch; v != nil {
					if *v != policy.DispatchOrdered && *v != policy.DispatchBestFit {
						diags = append(diags, errorAt(attrRange(b, "dispatch"), "Invalid dispatch",
							fmt.Sprintf("queue %q: dispatch = %q is neither %q nor %q", q.Name, *v, policy.DispatchOrdered, policy.DispatchBestFit)))
					}
					q.Dispatch = *v
				}
				diags = append(diags, queueRegion(b, q, qb)...)
				if _, dup := p.Queues[q.Name]; dup {
					diags = append(diags, duplicate("queue", q.Name, b.DefRange, p.defs["queue "+q.Name]))
					continue
				}
				if q.Priority < 1 || q.Priority > 100 {
					diags = append(diags, errorAt(b.DefRange, "Queue priority out of range",
						fmt.Sprintf("queue %q has priority %d; Nomad priorities run from 1 to 100", q.Name, q.Priority)))
				}
				p.Queues[q.Name] = q
				p.defs["queue "+q.Name] = b.DefRange
			case "tenant":
				var tb tenantBody
				if d := gohcl.DecodeBody(b.Body, nil, &tb); d.HasErrors() {
					diags = append(diags, d...)
					continue
				}
				tenantBlocks, tenantBodies = append(tenantBlocks, b), append(tenantBodies, tb)
			case "gpu_class":
				var cb classBody
				if d := gohcl.DecodeBody(b.Body, nil, &cb); d.HasErrors() {
					diags = append(diags, d...)
					continue
				}
				c := &policy.GPUClass{Name: b.Labels[0], Models: cb.Models, Pos: pos(b.DefRange)}
				if cb.Price != nil {
					if c.PricePerGPUHour = *cb.Price; c.PricePerGPUHour < 0 {
						diags = append(diags, errorAt(attrRange(b, "price_per_gpu_hour"), "Negative price",
							fmt.Sprintf("gpu_class %q: price_per_gpu_hour = %g is below 0", c.Name, c.PricePerGPUHour)))
					}
				}
				if _, dup := p.Classes[c.Name]; dup {
					diags = append(diags, duplicate("gpu_class", c.Name, b.DefRange, p.defs["gpu_class "+c.Name]))
					continue
				}
				if len(c.Models) == 0 {
					diags = append(diags, errorAt(b.DefRange, "GPU class without models",
						fmt.Sprintf("gpu_class %q must list at least one model (device name)", c.Name)))
				}
				p.Classes[c.Name] = c
				p.defs["gpu_class "+c.Name] = b.DefRange
			case "region":
				var rb regionBody
				if d := gohcl.DecodeBody(b.Body, nil, &rb); d.HasErrors() {
					diags = append(diags, d...)
					continue
				}
				r := &policy.Region{Name: b.Labels[0], Broker: rb.Broker, Pos: pos(b.DefRange)}
				if _, dup := p.Regions[r.Name]; dup {
					diags = append(diags, duplicate("region", r.Name, b.DefRange, p.defs["region "+r.Name]))
					continue
				}
				if u, err := url.Parse(r.Broker); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					diags = append(diags, errorAt(b.DefRange, "Region broker address invalid",
						fmt.Sprintf("region %q: broker %q must be an http:// or https:// address", r.Name, r.Broker)))
				}
				p.Regions[r.Name] = r
				p.defs["region "+r.Name] = b.DefRange
			case "reclaim":
				diags = append(diags, p.addReclaim(b)...)
			case "workload":
				diags = append(diags, p.addWorkload(b)...)
			case "borrowing", "preemption", "placement", "reclaim_settings", "usage", "fair_share":
				if prev, dup := seenSingleton[b.Type]; dup {
					diags = append(diags, duplicate(b.Type, "", b.DefRange, prev))
					continue
				}
				seenSingleton[b.Type] = b.DefRange
				diags = append(diags, decodeSingleton(p, b)...)
			}
		}
	}
	for i, b := range tenantBlocks {
		diags = append(diags, p.addTenant(b, tenantBodies[i])...)
	}
	diags = append(diags, p.checkReclaimSelectors()...)
	diags = append(diags, p.checkWorkloads()...)
	pol.Index() // the bands, which check reads
	diags = append(diags, p.check(capacity, seenSingleton["borrowing"])...)
	if diags.HasErrors() {
		return nil, diags
	}
	return pol, diags
}

func decodeSingleton(p *parser, b *hcl.Block) hcl.Diagnostics {
	switch b.Type {
	case "reclaim_settings":
		return p.reclaimSettings(b)
	case "usage":
		return p.usage(b)
	case "fair_share":
		return p.fairShare(b)
	case "placement":
		return p.placement(b)
	case "borrowing":
		return p.borrowing(b)
	}
	var pb preemptionBody
	d := gohcl.DecodeBody(b.Body, nil, &pb)
	if pb.Batch != nil {
		p.Preemption.Batch = *pb.Batch
	}
	if pb.Service != nil {
		p.Preemption.Service = *pb.Service
	}
	return d
}

func (p *parser) borrowing(b *hcl.Block) hcl.Diagnostics {
	var bb borrowingBody
	d := gohcl.DecodeBody(b.Body, nil, &bb)
	if bb.Enabled != nil {
		p.Borrowing.Enabled = *bb.Enabled
	}
	if bb.Priority != nil {
		if *bb.Priority < 1 || *bb.Priority > 100 {
			// Nomad takes a priority of 0 for its default, 50: borrowed
			// work above the guaranteed bands.
			d = append(d, errorAt(attrRange(b, "priority"), "Invalid priority",
				fmt.Sprintf("borrowing: priority %d is not a Nomad priority (1 to 100)", *bb.Priority)))
		}
		p.Borrowing.Priority = *bb.Priority
	}
	for _, set := range []struct {
		key string
		v   *string
		to  *time.Duration
	}{{"backoff", bb.Backoff, &p.Borrowing.Backoff}, {"max_backoff", bb.MaxBackoff, &p.Borrowing.MaxBackoff}} {
		if set.v == nil {
			continue
		}
		v, err := time.ParseDuration(*set.v)
		if err != nil || v < 0 {
			d = append(d, errorAt(attrRange(b, set.key), "Invalid duration",
				fmt.Sprintf("borrowing: %s = %q is not a duration of 0 or more (\"30m\", \"24h\"; 0: no backoff)", set.key, *set.v)))
			continue
		}
		*set.to = v
	}
	if v := bb.PromoteBelow; v != nil {
		if bad := promoteBelow(b, "borrowing", *v); bad != nil {
			d = append(d, bad)
		} else {
			p.Borrowing.PromoteBelow = *v
		}
	}
	if bb.SubBands != nil {
		p.Borrowing.SubBands, p.subBands = *bb.SubBands, attrRange(b, "sub_bands")
	}
	if v := bb.SubBandStep; v != nil {
		if step, err := time.ParseDuration(*v); err != nil || step <= 0 {
			d = append(d, errorAt(attrRange(b, "sub_band_step"), "Invalid duration",
				fmt.Sprintf("borrowing: sub_band_step = %q is not a duration above 0 (GPU time at stake of the lowest sub-band: \"15m\")", *v)))
		} else {
			p.Borrowing.SubBandStep = step
		}
	}
	if v := bb.MaxPreemptions; v != nil {
		if *v < 0 {
			d = append(d, errorAt(attrRange(b, "max_preemptions"), "Invalid count",
				fmt.Sprintf("borrowing: max_preemptions = %d: want 0 (no cap) or more evictions while borrowed, after which a job runs only within its guarantee", *v)))
		} else {
			p.Borrowing.MaxPreemptions = *v
		}
	}
	if p.Borrowing.MaxBackoff < p.Borrowing.Backoff {
		d = append(d, errorAt(attrRange(b, "max_backoff"), "Invalid duration",
			fmt.Sprintf("borrowing: max_backoff %s is below backoff %s", p.Borrowing.MaxBackoff, p.Borrowing.Backoff)))
	}
	return d
}

func (p *parser) placement(b *hcl.Block) hcl.Diagnostics {
	var pb placementBody
	d := gohcl.DecodeBody(b.Body, nil, &pb)
	if pb.Mode != nil {
		if *pb.Mode != policy.PlaceBroker && *pb.Mode != policy.PlaceNomad {
			d = append(d, errorAt(attrRange(b, "mode"), "Invalid placement mode",
				fmt.Sprintf("placement: mode = %q: want %q (the broker pins each admitted job to the nodes it chose) or %q (Nomad chooses)",
					*pb.Mode, policy.PlaceBroker, policy.PlaceNomad)))
		} else {
			p.Placement.Mode = *pb.Mode
		}
	}
	if v := pb.ReserveAfter; v != nil {
		if after, err := time.ParseDuration(*v); err != nil || after < 0 {
			d = append(d, errorAt(attrRange(b, "reserve_after"), "Invalid duration",
				fmt.Sprintf("placement: reserve_after = %q is not a duration of 0 or more (\"6h\"; 0: never hold a node for a waiting job)", *v)))
		} else {
			p.Placement.ReserveAfter = after
		}
	}
	return d
}

// validNamespace is what Nomad takes as a namespace's name.
var validNamespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)

// Long: one attribute per tenant setting, each with its own file:line diagnostic.
func (p *parser) addTenant(b *hcl.Block, tb tenantBody) hcl.Diagnostics {
	var diags hcl.Diagnostics
	t := &policy.Tenant{Name: b.Labels[0], Namespaces: tb.Namespaces, Queues: tb.Queues, Pos: pos(b.DefRange),
		MaxQueued: policy.DefaultMaxQueued, MaxQueuedRequestBytes: policy.DefaultMaxQueuedRequestBytes}
	if tb.MaxQueued != nil {
		t.MaxQueued = *tb.MaxQueued
	}
	if tb.MaxRequest != nil {
		t.MaxQueuedRequestBytes = *tb.MaxRequest
	}
	if t.MaxQueued < 0 || t.MaxQueued > policy.MaxMaxQueued || t.MaxQueuedRequestBytes < 1 || t.MaxQueuedRequestBytes > policy.MaxQueuedRequestBytes {
		return hcl.Diagnostics{errorAt(b.DefRange, "Queue limit out of range",
			fmt.Sprintf("tenant %q: max_queued must be from 0 to %d and max_queued_request_bytes from 1 to %d (a queued request is kept "+
				"with its entry in one Consul KV value, of at most 512 KiB by default)", t.Name, policy.MaxMaxQueued, policy.MaxQueuedRequestBytes))}
	}
	for _, ns := range t.Namespaces {
		if !validNamespace.MatchString(ns) {
			return hcl.Diagnostics{errorAt(b.DefRange, "Invalid namespace",
				fmt.Sprintf("tenant %q: namespace %q is not a Nomad namespace name (1 to 128 letters, digits and dashes)", t.Name, ns))}
		}
	}
	var subDiags hcl.Diagnostics
	if t.Submitters, subDiags = submitters(tb.Submitters, t.Name); subDiags.HasErrors() {
		return subDiags
	}
	if _, dup := p.Tenants[t.Name]; dup {
		return hcl.Diagnostics{duplicate("tenant", t.Name, b.DefRange, p.defs["tenant "+t.Name])}
	}
	p.Tenants[t.Name] = t
	p.defs["tenant "+t.Name] = b.DefRange
	if len(t.Queues) == 0 {
		diags = append(diags, errorAt(b.DefRange, "Default queue missing",
			fmt.Sprintf("tenant %q lists no queues; the first one is its default queue", t.Name)))
	}
	for _, q := range t.Queues {
		if _, ok := p.Queues[q]; !ok {
			diags = append(diags, errorAt(b.DefRange, "Unknown queue",
				fmt.Sprintf("tenant %q uses queue %q, which no queue block defines", t.Name, q)))
		}
	}
	for _, ns := range t.Namespaces {
		if other, taken := p.byNamespace[ns]; taken {
			diags = append(diags, errorAt(b.DefRange, "Namespace claimed twice",
				fmt.Sprintf("namespace %q belongs to tenant %q (%s) and to tenant %q; a namespace belongs to one tenant",
					ns, other.Name, other.Pos, t.Name)))
			continue
		}
		p.byNamespace[ns] = t
	}
	var d hcl.Diagnostics
	t.Guaranteed, d = p.quota(tb.Guaranteed, "guaranteed", t.Name)
	diags = append(diags, d...)
	t.Limit, d = p.quota(tb.Limit, "limit", t.Name)
	diags = append(diags, d...)
	if t.Limit == nil {
		t.Limit = t.Guaranteed // no limit given: never beyond the guarantee
	}
	for class, g := range t.Guaranteed {
		if l, ok := t.Limit[class]; ok && g > l {
			diags = append(diags, errorAt(tb.Guaranteed.Range(), "Guarantee above limit",
				fmt.Sprintf("tenant %q is guaranteed %g %s but limited to %g", t.Name, g, className(class), l)))
		}
	}
	if t.Guaranteed == nil {
		t.Guaranteed = policy.Quota{}
	}
	diags = append(diags, approvalBounds(t, tb.Approvals)...)
	diags = append(diags, regionCaps(t, tb.Regions)...)
	if bb := tb.Budget; bb != nil {
		switch {
		case bb.GPUHours <= 0:
			diags = append(diags, errorAt(bb.Range, "Invalid budget",
				fmt.Sprintf("tenant %q: budget gpu_hours = %g must be above 0", t.Name, bb.GPUHours)))
		case bb.Period != policy.BudgetDay && bb.Period != policy.BudgetWeek && bb.Period != policy.BudgetMonth:
			diags = append(diags, errorAt(bb.Range, "Invalid budget period",
				fmt.Sprintf("tenant %q: budget period %q is none of \"day\", \"week\", \"month\"", t.Name, bb.Period)))
		default:
			t.Budget = &policy.Budget{GPUHours: bb.GPUHours, Period: bb.Period}
		}
	}
	return diags
}

// regionCaps sets t's per-region limits from its region blocks: each a
// number of GPUs from 0 to its limit, each region once.
func regionCaps(t *policy.Tenant, blocks []regionCapBody) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, rb := range blocks {
		switch _, dup := t.RegionLimits[rb.Name]; {
		case strings.TrimSpace(rb.Name) == "":
			diags = append(diags, errorAt(rb.Range, "Empty name", fmt.Sprintf("tenant %q: a region block needs the region's name", t.Name)))
		case dup:
			diags = append(diags, errorAt(rb.Range, "Duplicate region", fmt.Sprintf("tenant %q: region %q is given twice", t.Name, rb.Name)))
		case rb.Limit < 0 || rb.Limit > t.Limit.Total():
			diags = append(diags, errorAt(rb.Range, "Invalid region limit",
				fmt.Sprintf("tenant %q: region %q limit = %g must be from 0 to the tenant's limit, %g", t.Name, rb.Name, rb.Limit, t.Limit.Total())))
		default:
			if t.RegionLimits == nil {
				t.RegionLimits = map[string]float64{}
			}
			t.RegionLimits[rb.Name] = rb.Limit
		}
	}
	return diags
}

// approvalBounds sets t's approval bounds from its approvals block (nil:
// none), after its limit: by default an approval at most doubles the limit
// and lasts at most policy.MaxApprovalDuration.
func approvalBounds(t *policy.Tenant, ab *approvalsBody) hcl.Diagnostics {
	t.Approvals = policy.ApprovalBounds{MaxExtraGPUs: int(t.Limit.Total()), MaxDuration: policy.MaxApprovalDuration}
	if ab == nil {
		return nil
	}
	var diags hcl.Diagnostics
	if n := ab.MaxExtraGPUs; n != nil {
		if *n < 0 {
			diags = append(diags, errorAt(ab.Range, "Invalid approval bound",
				fmt.Sprintf("tenant %q: approvals max_extra_gpus = %d must be 0 or more", t.Name, *n)))
		}
		t.Approvals.MaxExtraGPUs = *n
	}
	if s := ab.MaxDuration; s != nil {
		d, err := time.ParseDuration(*s)
		if err != nil || d <= 0 || d > policy.MaxApprovalDuration {
			diags = append(diags, errorAt(ab.Range, "Invalid approval bound",
				fmt.Sprintf("tenant %q: approvals max_duration = %q is not a duration above 0 and at most %s", t.Name, *s, policy.MaxApprovalDuration)))
		}
		t.Approvals.MaxDuration = d
	}
	return diags
}

// submitters reads ["role:<name>", "policy:<name>", ...].
func submitters(expr hcl.Expression, tenant string) ([]policy.Submitter, hcl.Diagnostics) {
	if expr == nil {
		return nil, nil
	}
	if v, diags := expr.Value(nil); diags.HasErrors() || v.IsNull() {
		return nil, diags
	}
	var list []string
	if diags := gohcl.DecodeExpression(expr, nil, &list); diags.HasErrors() {
		return nil, diags
	}
	out := make([]policy.Submitter, 0, len(list))
	for _, s := range list {
		kind, name, _ := strings.Cut(s, ":")
		if (kind != policy.SubmitterRole && kind != policy.SubmitterPolicy) || name == "" {
			return nil, hcl.Diagnostics{errorAt(expr.Range(), "Invalid submitter",
				fmt.Sprintf("tenant %q: submitter %q is neither \"role:<Nomad ACL role>\" nor \"policy:<Nomad ACL policy>\"", tenant, s))}
		}
		out = append(out, policy.Submitter{Kind: kind, Name: name})
	}
	return out, nil
}

// quota reads `n` (all GPUs) or `{ class = n, ... }`.
func (p *parser) quota(expr hcl.Expression, attr, tenant string) (policy.Quota, hcl.Diagnostics) {
	if expr == nil {
		return nil, nil
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() || v.IsNull() {
		return nil, diags
	}
	bad := func(detail string) (policy.Quota, hcl.Diagnostics) {
		return nil, hcl.Diagnostics{errorAt(expr.Range(), "Invalid quota", fmt.Sprintf("tenant %q %s: %s", tenant, attr, detail))}
	}
	count := func(v cty.Value) (int, bool) {
		if v.Type() != cty.Number || v.IsNull() || !v.IsKnown() {
			return 0, false
		}
		n, acc := v.AsBigFloat().Int64()
		return int(n), acc == big.Exact && n >= 0 && n <= 1_000_000
	}
	if v.Type() == cty.Number {
		n, ok := count(v)
		if !ok {
			return bad("a quota is a whole number of GPUs, 0 or more")
		}
		return policy.Quota{policy.AllGPUs: float64(n)}, nil
	}
	if !v.Type().IsObjectType() && !v.Type().IsMapType() {
		return bad("write a number of GPUs, or { <gpu_class> = <number>, ... }")
	}
	q := policy.Quota{}
	for k, cv := range v.AsValueMap() {
		if _, ok := p.Classes[k]; !ok {
			return bad(fmt.Sprintf("unknown GPU class %q (define it with a gpu_class block)", k))
		}
		n, ok := count(cv)
		if !ok {
			return bad(fmt.Sprintf("class %q: a quota is a whole number of GPUs, 0 or more", k))
		}
		q[k] = float64(n)
	}
	return q, nil
}

// check runs the whole-set rules: bands, borrowing below queues, capacity.
func (p *parser) check(capacity int, borrowingRange hcl.Range) hcl.Diagnostics {
	var diags hcl.Diagnostics
	queues := make([]*policy.Queue, 0, len(p.Queues))
	for _, q := range p.Queues {
		queues = append(queues, q)
	}
	sort.Slice(queues, func(i, j int) bool { return queues[i].Priority < queues[j].Priority })
	if p.Borrowing.Enabled && len(queues) > 0 {
		// A queue that preempts within guarantee runs at its priority: 10 or
		// more above another queue's band, its jobs evict that queue's
		// guaranteed jobs, another tenant's included.
		for _, hi := range queues {
			if !hi.PreemptsWithinGuarantee {
				continue
			}
			for _, lo := range queues {
				if lo != hi && hi.Priority-lo.Band >= policy.MinPriorityGap {
					diags = append(diags, warningAt(rangeOf(hi.Pos), "Guaranteed work preempts guaranteed work",
						fmt.Sprintf("queue %q (preempts_within_guarantee, priority %d) is %d or more above queue %q's band (%d) while borrowing is on: "+
							"its jobs may evict another tenant's jobs that run within their guarantee, not only borrowed ones",
							hi.Name, hi.Priority, policy.MinPriorityGap, lo.Name, lo.Band)))
					break
				}
			}
		}
		lowest := queues[0]
		switch {
		case p.Borrowing.Priority >= lowest.Priority:
			diags = append(diags, errorAt(borrowingRange, "Borrowing band not below every queue",
				fmt.Sprintf("borrowing priority %d must be below queue %q (%d), or borrowed work could not be preempted",
					p.Borrowing.Priority, lowest.Name, lowest.Priority)))
		case lowest.Priority-p.Borrowing.Priority < policy.MinPriorityGap:
			diags = append(diags, warningAt(borrowingRange, "Borrowing band too close",
				fmt.Sprintf("borrowing priority %d is less than %d below queue %q (%d): Nomad will not preempt borrowed work for it",
					p.Borrowing.Priority, policy.MinPriorityGap, lowest.Name, lowest.Priority)))
		case p.Borrowing.SubBands && p.subBands != (hcl.Range{}) && p.SubBandRoom() == 0:
			diags = append(diags, errorAt(p.subBands, "No room for sub-bands",
				fmt.Sprintf("borrowing: sub_bands needs the borrowing priority (%d) more than %d below the lowest queue band (%d): "+
					"the sub-bands lie between them, each still preemptible by guaranteed work", p.Borrowing.Priority, policy.MinPriorityGap, lowest.Band)))
		}
	}
	if capacity > 0 {
		total := 0.0
		for _, t := range p.Tenants {
			total += t.Guaranteed.Total()
		}
		if total > float64(capacity) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "Guarantees exceed capacity",
				Detail: fmt.Sprintf("tenants are guaranteed %g GPUs in all, the cluster has %d", total, capacity)})
		}
	}
	return diags
}

func className(class string) string {
	if class == policy.AllGPUs {
		return "GPUs"
	}
	return class + " GPUs"
}

func duplicate(kind, name string, at, prev hcl.Range) *hcl.Diagnostic {
	what := kind
	if name != "" {
		what = fmt.Sprintf("%s %q", kind, name)
	}
	return errorAt(at, "Duplicate "+kind, fmt.Sprintf("%s is already defined at %s", what, prev))
}

func errorAt(r hcl.Range, summary, detail string) *hcl.Diagnostic {
	return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: r.Ptr()}
}

func warningAt(r hcl.Range, summary, detail string) *hcl.Diagnostic {
	d := errorAt(r, summary, detail)
	d.Severity = hcl.DiagWarning
	if r.Filename == "" {
		d.Subject = nil
	}
	return d
}

// promoteBelow checks a promote_below of block b (what names it in the
// message): a share of the guarantee.
func promoteBelow(b *hcl.Block, what string, v float64) *hcl.Diagnostic {
	if v < 0 || v > 1 {
		return errorAt(attrRange(b, "promote_below"), "Invalid share",
			fmt.Sprintf("%s: promote_below = %g is not a share of the guarantee from 0 (never) to 1", what, v))
	}
	return nil
}
