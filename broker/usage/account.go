package usage

import (
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Key is what GPU time is accounted by: bounded (tenants × queues × classes).
type Key struct {
	Tenant string `json:"tenant"`
	Queue  string `json:"queue"`
	Class  string `json:"gpu_class"`
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

// MaxInterval caps the time one observation is counted for: after a gap
// (a new leader, a stalled pass) GPUs are not charged for time nobody saw.
const MaxInterval = 2 * time.Minute

// Interval is the GPU time of one observation, counted from the previous
// one (at most MaxInterval before): every GPU that admitted, running
// allocations hold, busy or idle by its sample (no sample: busy). An
// allocation the broker did not admit has tenant and queue "". classOf
// maps a GPU model to its class ("" when none).
func Interval(prev, now time.Time, allocs []reclaim.Alloc, gpus map[string]reclaim.GPU, idleBelow float64,
	classOf func(model string) string) map[Key]Seconds {
	d := now.Sub(prev)
	if prev.IsZero() || d <= 0 {
		return nil
	}
	d = min(d, MaxInterval)
	out := map[Key]Seconds{}
	for _, a := range allocs {
		if a.Preempted || a.StartedAt.IsZero() {
			continue
		}
		// An allocation started within the interval is counted from its start.
		span := min(d, now.Sub(a.StartedAt)).Seconds()
		if span <= 0 {
			continue
		}
		for _, id := range a.GPUs {
			g, ok := gpus[id]
			k := Key{Tenant: a.Tenant, Queue: a.Queue, Class: classOf(g.Model)}
			s := out[k]
			s.Allocated += span
			if ok && g.Utilization < idleBelow {
				s.Idle += span
			} else {
				s.Busy += span
			}
			out[k] = s
		}
	}
	return out
}
