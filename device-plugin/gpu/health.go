package gpu

import (
	"fmt"
	"time"
)

// HealthTracker turns raw observations into the health reported to Nomad. A
// fault makes a device unhealthy at once. It is healthy again only after it
// has been seen clean for the whole recovery period, counted from the first
// clean observation (when between two scans it turned clean is unknown), so
// a flapping GPU does not take new work.
type HealthTracker struct {
	recovery time.Duration
	faults   map[string]fault
}

type fault struct {
	reason     string
	cleanSince time.Time // zero while the fault is still seen
}

// NewHealthTracker returns a tracker whose devices recover after recovery clean time.
func NewHealthTracker(recovery time.Duration) *HealthTracker {
	return &HealthTracker{recovery: recovery, faults: map[string]fault{}}
}

// Observe records the raw condition of a device at now and returns its reported health.
func (t *HealthTracker) Observe(now time.Time, uuid string, raw Health) Health {
	if !raw.Healthy {
		t.faults[uuid] = fault{reason: raw.Reason}
		return raw
	}
	f, ok := t.faults[uuid]
	if !ok {
		return Healthy
	}
	if f.cleanSince.IsZero() {
		f.cleanSince = now
		t.faults[uuid] = f
	}
	if now.Sub(f.cleanSince) >= t.recovery {
		delete(t.faults, uuid)
		return Healthy
	}
	// The text must not change from one observation to the next, or every scan
	// would look like a new fingerprint to Nomad.
	return Health{Reason: fmt.Sprintf("recovering from %q: clean since %s, healthy after %s",
		f.reason, f.cleanSince.UTC().Format(time.RFC3339), t.recovery)}
}
