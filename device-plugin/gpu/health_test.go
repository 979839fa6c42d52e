package gpu_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

func TestHealthTrackerRecoversOnlyAfterCleanPeriod(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := gpu.NewHealthTracker(time.Minute)
	bad := gpu.Health{Reason: "XID 79"}

	steps := []struct {
		at          time.Duration
		raw         gpu.Health
		wantHealthy bool
		wantReason  string
	}{
		{0, gpu.Healthy, true, ""},
		{10 * time.Second, bad, false, "XID 79"},
		{20 * time.Second, gpu.Healthy, false, `recovering from "XID 79"`}, // clean from here on
		{79 * time.Second, gpu.Healthy, false, `recovering from "XID 79"`},
		{80 * time.Second, gpu.Healthy, true, ""},
		{90 * time.Second, bad, false, "XID 79"},
		{110 * time.Second, gpu.Healthy, false, "recovering"},
		{120 * time.Second, bad, false, "XID 79"}, // a fault during recovery restarts the clock
		{150 * time.Second, gpu.Healthy, false, "recovering"},
		{209 * time.Second, gpu.Healthy, false, "recovering"},
		{210 * time.Second, gpu.Healthy, true, ""},
	}
	for _, s := range steps {
		got := tr.Observe(t0.Add(s.at), "GPU-1", s.raw)
		if got.Healthy != s.wantHealthy || !strings.Contains(got.Reason, s.wantReason) {
			t.Errorf("at %s: got %+v, want healthy=%t reason containing %q", s.at, got, s.wantHealthy, s.wantReason)
		}
	}
}

func TestHealthTrackerReasonIsStableWhileRecovering(t *testing.T) {
	t0 := time.Now()
	tr := gpu.NewHealthTracker(time.Hour)
	tr.Observe(t0, "GPU-1", gpu.Health{Reason: "ECC"})
	a := tr.Observe(t0.Add(time.Second), "GPU-1", gpu.Healthy)
	b := tr.Observe(t0.Add(time.Minute), "GPU-1", gpu.Healthy)
	if a != b {
		t.Errorf("reason changed between scans: %q then %q", a.Reason, b.Reason)
	}
}

func TestHealthTrackerKeepsDevicesApart(t *testing.T) {
	t0 := time.Now()
	tr := gpu.NewHealthTracker(time.Minute)
	tr.Observe(t0, "GPU-1", gpu.Health{Reason: "XID 48"})
	if h := tr.Observe(t0, "GPU-2", gpu.Healthy); !h.Healthy {
		t.Errorf("GPU-2 is reported %+v because GPU-1 failed", h)
	}
}
