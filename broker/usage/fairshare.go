package usage

import (
	"math"
	"time"
)

// Mark is how far GPU time is counted, and the tenants' decayed GPU-hours
// up to there: both move together.
type Mark struct {
	Through time.Time `json:"through"`
	Decayed Decayed   `json:"decayed_gpu_hours"`
}

// Decayed are tenants' weighted GPU-hours as of At, each hour counting half
// after every half-life: what fair-share queue order compares.
type Decayed struct {
	At    time.Time          `json:"at"`
	Hours map[string]float64 `json:"hours"`
}

// As returns the hours decayed to now.
func (d Decayed) As(now time.Time, halfLife time.Duration) map[string]float64 {
	f := decay(now.Sub(d.At), halfLife)
	out := make(map[string]float64, len(d.Hours))
	for t, h := range d.Hours {
		out[t] = h * f
	}
	return out
}

// Add decays the hours to now and adds the charged GPU time of admitted
// jobs: busy hours count 1, idle ones idleWeight.
func (d *Decayed) Add(now time.Time, halfLife time.Duration, idleWeight float64, charged map[string]map[Key]Seconds) {
	if !d.At.IsZero() {
		d.Hours = d.As(now, halfLife)
	}
	if d.Hours == nil {
		d.Hours = map[string]float64{}
	}
	d.At = now
	for _, by := range charged {
		for k, s := range by {
			if k.Tenant != "" {
				d.Hours[k.Tenant] += (s.Busy + idleWeight*s.Idle) / 3600
			}
		}
	}
}

func decay(elapsed, halfLife time.Duration) float64 {
	if elapsed <= 0 || halfLife <= 0 {
		return 1
	}
	return math.Exp2(-elapsed.Seconds() / halfLife.Seconds())
}
