package gpuapi

import (
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// TenantUsage is one row of GET /v1/gpu/usage.
type TenantUsage struct {
	// GPUs; a time-sliced replica counts as its share of one.
	Tenant     string  `json:"tenant"`
	Used       float64 `json:"used"`
	Borrowed   float64 `json:"borrowed"`
	Guaranteed float64 `json:"guaranteed"`
	Limit      float64 `json:"limit"`
	Queued     float64 `json:"queued"`
	// Budget is its GPU-hour budget in the current period, if it has one.
	Budget *usage.BudgetState `json:"budget,omitempty"`
}

func (s *API) usage(r *http.Request) (any, error) {
	p := s.policies.Current()
	u := s.cluster.UsageWithout(p, "", "")
	queued := map[string]float64{}
	if entries, err := s.queue.List(r.Context()); err == nil {
		for _, e := range entries {
			queued[e.Tenant] += e.Demand
		}
	}
	var budgets map[string]usage.BudgetState
	if s.rollups != nil {
		now := s.clock.Now()
		days, err := s.rollups.Days(r.Context(), usage.EarliestPeriodStart(now).Format(usage.DayFormat), now.UTC().Format(usage.DayFormat))
		if err != nil {
			return nil, front.Fail(front.ErrUnavailable, "%v", err)
		}
		budgets = usage.Budgets(p, days, now)
	}
	out := make([]TenantUsage, 0, len(p.Tenants))
	for name, t := range p.Tenants {
		tu := u.Tenants[name]
		row := TenantUsage{Tenant: name, Used: tu.Used[policy.AllGPUs], Borrowed: tu.Borrowed[policy.AllGPUs],
			Guaranteed: t.Guaranteed.Total(), Limit: t.Limit.Total(), Queued: queued[name]}
		if b, ok := budgets[name]; ok {
			row.Budget = &b
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}

// UsageReport is GET /v1/gpu/usage?from=&to=&by=: GPU-hours and cost of
// the days from From up to (not including) To.
type UsageReport struct {
	From     string            `json:"from"`
	To       string            `json:"to"`
	By       string            `json:"by"`
	Region   string            `json:"region,omitempty"` // the region reported on alone ("": every one)
	Currency string            `json:"currency"`
	Rows     []usage.ReportRow `json:"rows"`
}

// usageReport reports GPU-hours from the daily rollups. With ACLs a caller
// sees the tenants with a namespace it may read, and not the time of jobs
// the broker did not admit (they have no tenant).
func (s *API) usageReport(r *http.Request) (any, error) {
	if s.rollups == nil {
		return nil, front.Fail(front.ErrNotFound, "this broker keeps no usage history")
	}
	q := r.URL.Query()
	rep := UsageReport{From: q.Get("from"), To: q.Get("to"), By: q.Get("by"), Region: q.Get("region")}
	from, err := time.Parse(usage.DayFormat, rep.From)
	if err != nil {
		return nil, front.Fail(front.ErrBadRequest, "from=%q is not a day (YYYY-MM-DD)", rep.From)
	}
	to := s.clock.Now().UTC().AddDate(0, 0, 1) // through today
	if rep.To != "" {
		if to, err = time.Parse(usage.DayFormat, rep.To); err != nil {
			return nil, front.Fail(front.ErrBadRequest, "to=%q is not a day (YYYY-MM-DD)", rep.To)
		}
	}
	rep.To = to.Format(usage.DayFormat)
	if !to.After(from) {
		return nil, front.Fail(front.ErrBadRequest, "to (%s) must come after from (%s): the period runs from 'from' up to, not including, 'to'", rep.To, rep.From)
	}
	switch rep.By {
	case "":
		rep.By = usage.ByTenant
	case usage.ByTenant, usage.ByQueue, usage.ByClass, usage.ByRegion:
	default:
		return nil, front.Fail(front.ErrBadRequest, "by=%q: report by tenant, queue, class or region", rep.By)
	}
	inRegion, ok := s.rowsOfRegion(rep.Region)
	if !ok {
		return nil, front.Fail(front.ErrBadRequest, "region=%q is not a region this broker governs", rep.Region)
	}
	days, err := s.rollups.Days(r.Context(), rep.From, to.AddDate(0, 0, -1).Format(usage.DayFormat))
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	p := s.policies.Current()
	var readable map[string]bool // with ACLs, the tenants the caller may read
	if s.acls {
		readable = s.readableTenants(r, p)
	}
	for i := range days {
		days[i].Rows = slices.DeleteFunc(slices.Clone(days[i].Rows), func(row usage.Row) bool {
			return inRegion != nil && !inRegion(row) || readable != nil && !readable[row.Tenant]
		})
		if inRegion != nil {
			days[i].OverLimit = nil // over all regions: not one region's
		}
	}
	rep.Currency = p.Currency
	rep.Rows = usage.Report(days, rep.By, func(class string) float64 {
		if c := p.Classes[class]; c != nil {
			return c.PricePerGPUHour
		}
		return 0
	})
	if rep.By == usage.ByRegion && s.region != "" {
		for i := range rep.Rows {
			if rep.Rows[i].Group == "" {
				rep.Rows[i].Group = s.region // the broker's own
			}
		}
		sort.Slice(rep.Rows, func(i, j int) bool { return rep.Rows[i].Group < rep.Rows[j].Group })
	}
	return rep, nil
}

// readableTenants are the tenants with a namespace the caller may read.
func (s *API) readableTenants(r *http.Request, p *policy.Policy) map[string]bool {
	readable, tenants := map[string]bool{}, map[string]bool{}
	for name, t := range p.Tenants {
		for _, ns := range t.Namespaces {
			if s.access.MayRead(r, ns, readable) {
				tenants[name] = true
				break
			}
		}
	}
	return tenants
}

// rowsOfRegion tells a usage row of region (as a request names it; "":
// any) from the others; false when the broker does not govern it.
func (s *API) rowsOfRegion(region string) (func(usage.Row) bool, bool) {
	if region == "" {
		return nil, true
	}
	if s.regions == nil || !s.regions.Governs(region) {
		return nil, region == s.region
	}
	key := region // the rows' name: "" for the broker's own
	if region == s.region || region == api.GlobalRegion {
		key = ""
	}
	return func(row usage.Row) bool { return row.Region == key }, true
}

// RightSizing is one row of GET /v1/gpu/rightsizing: a job that kept under
// half of its GPUs busy.
type RightSizing struct {
	Tenant    string    `json:"tenant"`
	Namespace string    `json:"namespace"`
	Job       string    `json:"job"`
	Queue     string    `json:"queue"`
	Asked     int       `json:"asked"`
	BusyP50   int       `json:"busy_p50"`
	BusyP95   int       `json:"busy_p95"`
	Samples   int64     `json:"samples"`
	Since     time.Time `json:"since"`
	Last      time.Time `json:"last_sample"`
}

// DefaultRightSizingTop is how many jobs per tenant GET /v1/gpu/rightsizing
// lists unless ?top= says otherwise.
const DefaultRightSizingTop = 5

// rightSizing lists each tenant's worst over-asking jobs (?top=N per
// tenant, 0 all) that the caller may read.
func (s *API) rightSizing(_ http.ResponseWriter, r *http.Request) (any, error) {
	top := DefaultRightSizingTop
	if v := r.URL.Query().Get("top"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, front.Fail(front.ErrBadRequest, "top=%q is not a count of jobs per tenant", v)
		}
		top = n
	}
	all, err := s.stored.List(r.Context())
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	readable := map[string]bool{}
	mine := all[:0]
	for _, p := range all {
		if s.access.MayRead(r, p.Namespace, readable) {
			mine = append(mine, p)
		}
	}
	out := []RightSizing{}
	for _, p := range usage.Worst(mine, top) {
		out = append(out, RightSizing{Tenant: p.Tenant, Namespace: p.Namespace, Job: p.Job, Queue: p.Queue, Asked: p.Asked,
			BusyP50: p.BusyAt(0.5), BusyP95: p.BusyAt(0.95), Samples: p.Samples(), Since: p.First, Last: p.Last})
	}
	return out, nil
}
