package usage

import (
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Key is what GPU time is accounted by: bounded (tenants × queues × classes).
type Key struct {
	Tenant string `json:"tenant"`
	Queue  string `json:"queue"`
	Class  string `json:"gpu_class"`
	// Region is the Nomad region the GPUs are in, when the broker governs
	// several ("": the broker's own).
	Region string `json:"region,omitempty"`
}

// Seconds are GPU-seconds: allocated = busy + idle.
type Seconds struct {
	Allocated float64 `json:"allocated"`
	Busy      float64 `json:"busy"`
	Idle      float64 `json:"idle"`
}

// Add adds o to s.
func (s *Seconds) Add(o Seconds) {
	s.Allocated += o.Allocated
	s.Busy += o.Busy
	s.Idle += o.Idle
}

// MaxInterval caps the time one observation is charged for while the
// ledger has only its own clock to go by (Nomad's is not known): a clock
// stepped forward would otherwise charge the whole step.
const MaxInterval = 10 * time.Minute

// Charge is the GPU time of one observation at now since the last one at
// prev, by UTC day (YYYY-MM-DD): every GPU that running allocations hold,
// busy or idle by its sample (no sample: busy). An allocation started since
// counts from its start (as Nomad recorded it), and one that ended since
// (EndedAt) up to its end. So after a gap (a leader failover, Consul down)
// an allocation that ran throughout is charged for all of it. An
// allocation the broker did not admit has tenant and queue "". classOf maps
// a GPU model to its class ("" when none).
func Charge(prev, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, idleBelow float64,
	classOf func(model string) string) map[string]map[Key]Seconds {
	if prev.IsZero() || !now.After(prev) {
		return nil
	}
	prev, now = prev.UTC(), now.UTC()
	out := map[string]map[Key]Seconds{}
	for from := prev; from.Before(now); {
		to := time.Date(from.Year(), from.Month(), from.Day()+1, 0, 0, 0, 0, time.UTC) // the next midnight
		if to.After(now) {
			to = now
		}
		if by := interval(from, to, allocs, gpus, idleBelow, classOf); len(by) > 0 {
			out[from.Format(DayFormat)] = by
		}
		from = to
	}
	return out
}

// DayFormat names a UTC day.
const DayFormat = "2006-01-02"

func interval(prev, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, idleBelow float64,
	classOf func(model string) string) map[Key]Seconds {
	out := map[Key]Seconds{}
	for _, a := range allocs {
		if a.Preempted || a.StartedAt.IsZero() {
			continue
		}
		// An allocation started within the interval is counted from its
		// start, one that ended in it up to its end.
		end := now
		if !a.EndedAt.IsZero() && a.EndedAt.Before(now) {
			end = a.EndedAt
		}
		span := min(end.Sub(prev), end.Sub(a.StartedAt)).Seconds()
		if span <= 0 {
			continue
		}
		for _, id := range a.GPUs {
			g, ok := gpus[id]
			k := Key{Tenant: a.Tenant, Queue: a.Queue, Class: classOf(g.Model), Region: a.Region}
			s := out[k]
			// A time-sliced replica is charged its share of the GPU.
			t := span * g.Share()
			s.Allocated += t
			if ok && g.Utilization < idleBelow {
				s.Idle += t
			} else {
				s.Busy += t
			}
			out[k] = s
		}
	}
	return out
}

// OverLimitSeconds is, by tenant, the GPU-seconds each tenant of p held
// from prev to now above its limit (raised by extra, what approvals in
// force grant it) or above a region cap (its region blocks). It reads
// Nomad's allocations, the broker's admissions or not. Within the interval
// it is the larger of two: what they held in all above the limit's worth,
// and what they held in capped regions above the caps' worth. That is the
// fewest GPU-seconds that had to go for the tenant to be within both,
// exact while holdings are steady and a pass's period at most from it when
// they change. home names the broker's own region, whose allocations name
// none.
func OverLimitSeconds(prev, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, p *policy.Policy, extra map[string]float64, home string) map[string]float64 {
	if prev.IsZero() || !now.After(prev) {
		return nil
	}
	held := map[string]float64{}
	inRegion := map[[2]string]float64{} // by tenant and capped region
	for _, a := range allocs {
		t := p.TenantOf(a.Namespace)
		if t == nil || a.Preempted || a.StartedAt.IsZero() {
			continue
		}
		end := now
		if !a.EndedAt.IsZero() && a.EndedAt.Before(now) {
			end = a.EndedAt
		}
		span := min(end.Sub(prev), end.Sub(a.StartedAt)).Seconds()
		region := a.Region
		if region == "" {
			region = home
		}
		_, capped := t.RegionLimits[region]
		for _, id := range a.GPUs {
			if span > 0 {
				held[t.Name] += span * gpus[id].Share()
				if capped {
					inRegion[[2]string{t.Name, region}] += span * gpus[id].Share()
				}
			}
		}
	}
	out := map[string]float64{}
	dt := now.Sub(prev).Seconds()
	for name, s := range held {
		over := s - (p.Tenants[name].Limit.Total()+extra[name])*dt
		regional := 0.0
		for region, limit := range p.Tenants[name].RegionLimits {
			regional += max(inRegion[[2]string{name, region}]-limit*dt, 0)
		}
		if over = max(over, regional); over > 1e-6 {
			out[name] = over
		}
	}
	return out
}
