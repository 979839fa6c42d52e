package cluster

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Regions is the broker's view over every Nomad region it governs, one View
// each: a job is decided on its own region's nodes, idle GPUs and borrowed
// work, against its tenant's usage over all regions (one quota). With one
// region it is that region's View and nothing more.
type Regions struct {
	home     *View
	homeName string           // the broker's own region as Nomad names it
	others   map[string]*View // the other regions', by name
	// Addresses are the Nomad agents the other regions are reached at, by
	// name ("": through the broker's own region's agent, which forwards).
	Addresses map[string]string
	// mu makes one admission at a time across regions: two regions'
	// admissions for one tenant must each see the other's.
	mu sync.Mutex
	// drained are the regions no new work goes to (gpu-broker region
	// drain), each with who drained it and when.
	drainMu sync.RWMutex
	drained map[string]string
}

// SetDrained sets the regions drained now (region → who and when; none:
// every region takes work), and sets off a queue pass.
func (r *Regions) SetDrained(drained map[string]string) {
	r.drainMu.Lock()
	r.drained = maps.Clone(drained)
	r.drainMu.Unlock()
	r.home.notify()
}

// Drained says who drained region and when, "" while it takes work.
func (r *Regions) Drained(region string) string {
	r.drainMu.RLock()
	defer r.drainMu.RUnlock()
	return r.drained[region]
}

// region is j's region as its decision reads what holds work back there
// (admission.Region), less what its view adds (View.usageFor).
func (r *Regions) region(j admission.Job) admission.Region {
	name := j.Where.Region
	if name == "" {
		name = r.homeName
	}
	return admission.Region{Name: name, DrainedBy: r.Drained(name)}
}

// NewRegions is the view over home (the broker's own region, named
// homeName) and others (by region name, each SetRegion to its name).
func NewRegions(homeName string, home *View, others map[string]*View) *Regions {
	return &Regions{home: home, homeName: homeName, others: others}
}

// In is the view of region as a request names it, and the name admission
// keys it by ("" for the broker's own: "", "global" or its name); false
// when the broker does not govern region.
func (r *Regions) In(region string) (*View, string, bool) {
	if region == "" || region == api.GlobalRegion || region == r.homeName {
		return r.home, "", true
	}
	v, ok := r.others[region]
	return v, region, ok
}

// Generation moves whenever any region's view changes (View.Generation):
// the sum of theirs, each of which only grows.
func (r *Regions) Generation() uint64 {
	n := r.home.Generation()
	for _, v := range r.others {
		n += v.Generation()
	}
	return n
}

// NodesGeneration moves whenever any region's nodes change as preparing a
// job reads them (View.NodesGeneration).
func (r *Regions) NodesGeneration() uint64 {
	n := r.home.NodesGeneration()
	for _, v := range r.others {
		n += v.NodesGeneration()
	}
	return n
}

// CgroupBoundGPUNodes is View.CgroupBoundGPUNodes of region, as a request
// names it; none for a region not governed.
func (r *Regions) CgroupBoundGPUNodes(region string) ([]string, int) {
	if v, _, ok := r.In(region); ok {
		return v.CgroupBoundGPUNodes(region)
	}
	return nil, 0
}

// Names are the regions governed, the broker's own first, then by name.
func (r *Regions) Names() []string {
	return append([]string{r.homeName}, slices.Sorted(maps.Keys(r.others))...)
}

// Views are the views by region name ("" the broker's own).
func (r *Regions) Views() map[string]*View {
	out := maps.Clone(r.others)
	if out == nil {
		out = map[string]*View{}
	}
	out[""] = r.home
	return out
}

// elsewhere is what j's tenant holds in the regions other than in's (the
// decision on j reads its own tenant's usage alone).
func (r *Regions) elsewhere(p *policy.Policy, j admission.Job, in *View) map[string]admission.TenantUsage {
	return r.tenantHeld(p, j.Namespace).othersThan(in)
}

// held is what one tenant holds in each region's view.
type held struct {
	tenant string
	views  []*View
	usage  []admission.TenantUsage // usage[i] is what it holds in views[i]
}

// tenantHeld is what namespace's tenant holds in each region (nothing for a
// namespace of no tenant). Another region's job of the same name is another
// job: nothing is left out.
func (r *Regions) tenantHeld(p *policy.Policy, namespace string) held {
	t := p.TenantOf(namespace)
	if t == nil {
		return held{}
	}
	h := held{tenant: t.Name, views: make([]*View, 0, len(r.others)+1), usage: make([]admission.TenantUsage, 0, len(r.others)+1)}
	h.views, h.usage = append(h.views, r.home), append(h.usage, r.home.tenantUsage(p, namespace, ""))
	for _, v := range r.others {
		h.views, h.usage = append(h.views, v), append(h.usage, v.tenantUsage(p, namespace, ""))
	}
	return h
}

// othersThan is what the tenant holds in the views other than in, by its
// name (nil when it is no tenant's), summed into one usage: a dispatch over
// many regions reads it once per region it decides on.
func (h held) othersThan(in *View) map[string]admission.TenantUsage {
	if h.tenant == "" {
		return nil
	}
	var (
		sum   admission.TenantUsage
		other bool
	)
	for i, v := range h.views {
		if v == in {
			continue
		}
		tu := h.usage[i]
		other = true
		sum.Used, sum.Borrowed = add(sum.Used, tu.Used), add(sum.Borrowed, tu.Borrowed)
		if len(tu.Unsettled) > 0 {
			sum.Unsettled = add(sum.Unsettled, tu.Unsettled)
		}
		if sum.OverBudget == "" {
			sum.OverBudget = tu.OverBudget
		}
		if sum.OwedSince.IsZero() {
			sum.OwedSince = tu.OwedSince
		}
	}
	if !other {
		return nil
	}
	return map[string]admission.TenantUsage{h.tenant: sum}
}

// addTenants adds what tenants hold elsewhere to u's.
func addTenants(u admission.Usage, elsewhere map[string]admission.TenantUsage) {
	for name, e := range elsewhere {
		tu := u.Tenants[name]
		tu.Used, tu.Borrowed = add(tu.Used, e.Used), add(tu.Borrowed, e.Borrowed)
		if len(e.Unsettled) > 0 {
			tu.Unsettled = add(tu.Unsettled, e.Unsettled)
		}
		if tu.OverBudget == "" {
			tu.OverBudget = e.OverBudget
		}
		if tu.OwedSince.IsZero() {
			tu.OwedSince = e.OwedSince
		}
		u.Tenants[name] = tu
	}
}

// unknownRegion is the decision on a job of a region the broker does not
// govern (the gate refuses such a request before it is decided).
func unknownRegion(j admission.Job) admission.Decision {
	return admission.Decision{Outcome: admission.Reject, Rule: "region",
		Reason: "region " + j.Where.Region + " is not one this broker governs"}
}

// UsageFor is j's region's usage without j, its tenant's as held in every
// region.
func (r *Regions) UsageFor(p *policy.Policy, j admission.Job) admission.Usage {
	v, _, ok := r.In(j.Where.Region)
	if !ok {
		return admission.Usage{Tenants: map[string]admission.TenantUsage{}}
	}
	u := v.usageIn(p, j, r.region(j))
	addTenants(u, r.elsewhere(p, j, v))
	return u
}

// EachUsage hands each of n jobs of namespace to f with the usage it sees
// in its region (UsageFor), in order, until f returns false. job(i) is the
// job as a region would decide on it (dispatch), built when reached; false:
// none there. What its tenant holds in each region is read once.
func (r *Regions) EachUsage(p *policy.Policy, namespace string, n int, job func(i int) (admission.Job, bool), f func(i int, j admission.Job, u admission.Usage) bool) {
	if n == 0 {
		return
	}
	h := r.tenantHeld(p, namespace)
	for i := range n {
		j, ok := job(i)
		if !ok {
			continue
		}
		u := admission.Usage{Tenants: map[string]admission.TenantUsage{}}
		if v, _, ok := r.In(j.Where.Region); ok {
			u = v.usageIn(p, j, r.region(j))
			addTenants(u, h.othersThan(v))
		}
		if !f(i, j, u) {
			return
		}
	}
}

// Free is how many free GPUs j's allocations could take in its region, node
// by node (admission.FreeFor, on the rooms its decision sees): what
// best_fit dispatch ranks regions by.
func (r *Regions) Free(j admission.Job) int {
	v, _, ok := r.In(j.Where.Region)
	if !ok {
		return 0
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return admission.FreeFor(j, v.nodeRooms(j.Where, jobKey{j.Namespace, j.ID}))
}

// Admit decides on j in its region and reserves its demand there.
func (r *Regions) Admit(p *policy.Policy, j admission.Job) (admission.Decision, *Reservation) {
	v, _, ok := r.In(j.Where.Region)
	if !ok {
		return unknownRegion(j), nil
	}
	var (
		d   admission.Decision
		res *Reservation
	)
	if len(r.others) == 0 {
		d, res = v.admit(p, j, nil, r.region(j))
	} else {
		r.mu.Lock()
		d, res = v.admit(p, j, r.elsewhere(p, j, v), r.region(j))
		r.mu.Unlock()
	}
	return d, res
}

// UsageWithout is every region's usage without the job namespace/id of the
// broker's own region: tenants' and idle GPUs summed, the largest node's
// GPUs the largest of any region.
func (r *Regions) UsageWithout(p *policy.Policy, namespace, id string) admission.Usage {
	u := r.home.UsageWithout(p, namespace, id)
	for _, v := range r.others {
		o := v.UsageWithout(p, namespace, "")
		addTenants(u, o.Tenants)
		u.Idle = add(u.Idle, o.Idle)
		for class, n := range o.MaxAlloc {
			u.MaxAlloc[class] = max(u.MaxAlloc[class], n)
		}
	}
	return u
}

// NodesFitting, FittingNodes and Islanded are the broker's own region's: a
// request is prepared against its own region's view (In).
func (r *Regions) NodesFitting(model string, gpus int) int { return r.home.NodesFitting(model, gpus) }

func (r *Regions) FittingNodes(model string, gpus int) []string {
	return r.home.FittingNodes(model, gpus)
}

func (r *Regions) Islanded(model string) bool { return r.home.Islanded(model) }

// LockJob holds off other decisions on namespace/id in any region: the
// broker's own region's locks serve all.
func (r *Regions) LockJob(namespace, id string) (unlock func()) { return r.home.LockJob(namespace, id) }

// JobRegion is the region whose view holds the live GPU job namespace/id,
// as Nomad names it ("": the broker's own; the first other by name where
// several do); ok is false where none does.
func (r *Regions) JobRegion(namespace, id string) (region string, ok bool) {
	if r.home.HasJob(namespace, id) {
		return "", true
	}
	for _, name := range slices.Sorted(maps.Keys(r.others)) {
		if r.others[name].HasJob(namespace, id) {
			return name, true
		}
	}
	return "", false
}

// Running reports whether any region runs the job.
func (r *Regions) Running(namespace, id string) bool {
	for _, v := range r.Views() {
		if v.Running(namespace, id) {
			return true
		}
	}
	return false
}

// Rooms are every region's rooms, each named by its region.
func (r *Regions) Rooms() []admission.NodeRoom {
	out := r.home.Rooms()
	for _, name := range slices.Sorted(maps.Keys(r.others)) {
		out = append(slices.Clip(out), r.others[name].Rooms()...)
	}
	return out
}

// HeldNodes are the nodes held for waiting jobs in every region.
func (r *Regions) HeldNodes() map[string]string {
	out := r.home.HeldNodes()
	for _, v := range r.others {
		maps.Copy(out, v.HeldNodes())
	}
	return out
}

// HoldNodes holds nodes in every region (node ids are unique across them).
func (r *Regions) HoldNodes(held map[string]string) {
	for _, v := range r.Views() {
		v.HoldNodes(held)
	}
}

// Map is every region's GPU map, each node named by its region when there
// are several.
func (r *Regions) Map(idleBelow float64) []MapNode {
	out := r.home.Map(idleBelow)
	if len(r.others) > 0 {
		for i := range out {
			out[i].Region = r.homeName
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.others)) {
		for _, n := range r.others[name].Map(idleBelow) {
			n.Region = name
			out = append(out, n)
		}
	}
	return out
}

// Inventory is every region's nodes' GPU inventory.
func (r *Regions) Inventory() []NodeInventory {
	out := r.home.Inventory()
	for _, name := range slices.Sorted(maps.Keys(r.others)) {
		out = append(slices.Clip(out), r.others[name].Inventory()...)
	}
	return out
}

// Followed is the broker's own region's progress.
func (r *Regions) Followed() (index, listings uint64) { return r.home.Followed() }

// Synced reports whether the broker's own region is listed: another
// region out of reach holds up nothing but its own jobs.
func (r *Regions) Synced() bool { return r.home.Synced() }

// Capacity is the GPUs of every region (a policy's guarantees are over all).
func (r *Regions) Capacity() int {
	n := 0
	for _, v := range r.Views() {
		n += v.Capacity()
	}
	return n
}

// GPUsCameBack counts GPUs back in service in any region.
func (r *Regions) GPUsCameBack() uint64 {
	var n uint64
	for _, v := range r.Views() {
		n += v.GPUsCameBack()
	}
	return n
}

// Changed is signalled when any region's view changes, until ctx ends.
func (r *Regions) Changed(ctx context.Context) <-chan struct{} {
	if len(r.others) == 0 {
		return r.home.Changed()
	}
	out := make(chan struct{}, 1)
	for _, v := range r.Views() {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-v.Changed():
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out
}

// Governs reports whether region (as a request names it) is one of the
// regions the broker governs.
func (r *Regions) Governs(region string) bool {
	_, _, ok := r.In(region)
	return ok
}

// RegionOf is the one other region than the broker's own whose view has a
// live job of namespace with id (with prefix, an id starting with it), as
// Nomad names it. A read that names no region finds a job the broker
// dispatched there so. "" when the broker's own region has such a job, or no
// other region or more than one has.
func (r *Regions) RegionOf(namespace, id string, prefix bool) string {
	if r.home.Knows(namespace, id, prefix) {
		return ""
	}
	found := ""
	for _, name := range slices.Sorted(maps.Keys(r.others)) {
		if r.others[name].Knows(namespace, id, prefix) {
			if found != "" {
				return ""
			}
			found = name
		}
	}
	return found
}

// RegionStatus is a governed region as GET /v1/gpu/regions lists it.
type RegionStatus struct {
	Name    string `json:"name"`
	Own     bool   `json:"own"`               // the broker's own region (its nomad block's)
	Address string `json:"address,omitempty"` // another region's own agent ("": through the own region's)
	Synced  bool   `json:"synced"`            // its nodes and jobs are listed
	Nodes   int    `json:"nodes"`             // nodes with GPUs
	GPUs    int    `json:"gpus"`
	Free    int    `json:"free_gpus"` // healthy GPUs no allocation holds
	// Drained says who drained it and when ("": it takes new work).
	Drained string `json:"drained,omitempty"`
	// Unreachable says since when following it fails, and why ("": it is
	// followed); its jobs stay charged until region_lost_timeout.
	Unreachable string `json:"unreachable,omitempty"`
}

// Status is every governed region's, the broker's own first.
func (r *Regions) Status() []RegionStatus {
	out := make([]RegionStatus, 0, 1+len(r.others))
	for i, name := range r.Names() {
		v, _, _ := r.In(name)
		st := RegionStatus{Name: name, Own: i == 0, Synced: v.Synced(), Drained: r.Drained(name)}
		if !st.Own {
			st.Address = r.Addresses[name]
		}
		if since, why := v.Unreachable(); !since.IsZero() {
			st.Unreachable = "since " + since.UTC().Format(time.RFC3339) + ": " + why
		}
		for _, n := range v.Map(0) {
			st.Nodes++
			for _, g := range n.GPUs {
				st.GPUs++
				if g.State == GPUFree {
					st.Free++
				}
			}
		}
		out = append(out, st)
	}
	return out
}
