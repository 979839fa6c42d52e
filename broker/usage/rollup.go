package usage

import (
	"sort"
)

// Rollup is one UTC day's GPU time by tenant, queue, class and region:
// bounded by tenants × queues × classes × regions, whatever the number of
// jobs.
type Rollup struct {
	Day  string `json:"day"` // YYYY-MM-DD
	Rows []Row  `json:"rows"`
	// OverLimit is, by tenant, the GPU-seconds held above its limit that day
	// (OverLimitSeconds).
	OverLimit map[string]float64 `json:"over_limit_gpu_seconds,omitempty"`
}

// AddOverLimit adds GPU-seconds held above their tenants' limits to the day.
func (r *Rollup) AddOverLimit(by map[string]float64) {
	for t, s := range by {
		if s <= 0 {
			continue
		}
		if r.OverLimit == nil {
			r.OverLimit = map[string]float64{}
		}
		r.OverLimit[t] += s
	}
}

// Row is the GPU time of one tenant, queue, class and region.
type Row struct {
	Key
	Seconds
}

// Add adds GPU time to the day.
func (r *Rollup) Add(by map[Key]Seconds) {
	at := map[Key]int{}
	for i, row := range r.Rows {
		at[row.Key] = i
	}
	for k, s := range by {
		i, ok := at[k]
		if !ok {
			r.Rows = append(r.Rows, Row{Key: k})
			i = len(r.Rows) - 1
			at[k] = i
		}
		r.Rows[i].Seconds.Add(s)
	}
	sort.Slice(r.Rows, func(i, j int) bool { return r.Rows[i].Key.less(r.Rows[j].Key) })
}

func (k Key) less(o Key) bool {
	if k.Tenant != o.Tenant {
		return k.Tenant < o.Tenant
	}
	if k.Queue != o.Queue {
		return k.Queue < o.Queue
	}
	if k.Class != o.Class {
		return k.Class < o.Class
	}
	return k.Region < o.Region
}

// Groupings of a report.
const (
	ByTenant = "tenant"
	ByQueue  = "queue"
	ByClass  = "class"
	// ByRegion groups by Nomad region, "" being the broker's own.
	ByRegion = "region"
)

// ReportRow is GPU-hours and cost of one group over a period.
type ReportRow struct {
	Group          string  `json:"group"`
	AllocatedHours float64 `json:"allocated_gpu_hours"`
	BusyHours      float64 `json:"busy_gpu_hours"`
	IdleHours      float64 `json:"idle_gpu_hours"`
	// IdleShare is idle over allocated (0 when nothing was allocated).
	IdleShare float64 `json:"idle_share"`
	// Cost is the allocated hours at their class's price.
	Cost float64 `json:"cost"`
	// OverLimitSeconds are the GPU-seconds the tenant held above its limit
	// (by tenant only).
	OverLimitSeconds float64 `json:"over_limit_gpu_seconds"`
}

// Report sums days by group (ByTenant, ByQueue or ByClass), pricing
// allocated GPU-hours with price (per GPU-hour of a class).
func Report(days []Rollup, by string, price func(class string) float64) []ReportRow {
	groups := map[string]*ReportRow{}
	for _, d := range days {
		for _, row := range d.Rows {
			g := row.Tenant
			switch by {
			case ByQueue:
				g = row.Queue
			case ByClass:
				g = row.Class
			case ByRegion:
				g = row.Region
			}
			r := groups[g]
			if r == nil {
				r = &ReportRow{Group: g}
				groups[g] = r
			}
			r.AllocatedHours += row.Allocated / 3600
			r.BusyHours += row.Busy / 3600
			r.IdleHours += row.Idle / 3600
			r.Cost += row.Allocated / 3600 * price(row.Class)
		}
		if by != ByTenant {
			continue
		}
		for t, sec := range d.OverLimit {
			r := groups[t]
			if r == nil {
				r = &ReportRow{Group: t}
				groups[t] = r
			}
			r.OverLimitSeconds += sec
		}
	}
	out := make([]ReportRow, 0, len(groups))
	for _, r := range groups {
		if r.AllocatedHours > 0 {
			r.IdleShare = r.IdleHours / r.AllocatedHours
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}
