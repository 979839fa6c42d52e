package usage_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

var t0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// running is an admitted, started allocation of vision/job holding gpus.
func running(id, job string, gpus ...string) reclaim.Alloc {
	return reclaim.Alloc{ID: id, Namespace: "vision", JobID: job, Admitted: true, Tenant: "vision", Queue: "training",
		StartedAt: t0, GPUs: gpus}
}

func util(pairs map[string]float64) map[string]reclaim.GPU {
	out := map[string]reclaim.GPU{}
	for id, u := range pairs {
		out[id] = reclaim.GPU{Utilization: u, Healthy: true}
	}
	return out
}

func TestProfilesCountBusyGPUsPerSample(t *testing.T) {
	tab := usage.NewProfiles()
	allocs := []reclaim.Alloc{
		running("a1", "big", "g0", "g1", "g2", "g3"),
		running("a2", "big", "g4", "g5", "g6", "g7"),
		running("a3", "fit", "h0"),
		{ID: "x", Namespace: "vision", JobID: "direct", StartedAt: t0, GPUs: []string{"h1"}},                 // not admitted
		{ID: "p", Namespace: "vision", JobID: "gone", Admitted: true, Preempted: true, GPUs: []string{"h2"}}, // preempted
	}
	// 20 samples: big keeps one GPU busy 19 times, three once; fit is busy throughout.
	for i := 0; i < 20; i++ {
		u := map[string]float64{"g0": 90, "h0": 80, "g5": 4.9} // g5 below the threshold: idle, as the others at 0
		for _, id := range []string{"g1", "g2", "g3", "g4", "g6", "g7"} {
			u[id] = 0
		}
		if i == 7 {
			u["g1"], u["g2"] = 50, 5 // 5 is not below 5: busy
		}
		tab.Sample(t0.Add(time.Duration(i)*30*time.Second), allocs, util(u), 5)
	}
	big, ok := tab.Get("vision", "big")
	if !ok || big.Asked != 8 || big.Samples() != 20 || big.BusyAt(0.5) != 1 || big.BusyAt(0.95) != 1 || big.BusyAt(1) != 3 ||
		!big.First.Equal(t0) || !big.Last.Equal(t0.Add(19*30*time.Second)) || big.Tenant != "vision" {
		t.Fatalf("big: %+v p50 %d p95 %d max %d", big, big.BusyAt(0.5), big.BusyAt(0.95), big.BusyAt(1))
	}
	if _, ok := tab.Get("vision", "direct"); ok {
		t.Error("an unadmitted job has a profile")
	}
	if _, ok := tab.Get("vision", "gone"); ok {
		t.Error("a preempted allocation was sampled")
	}
	if w := big.Warning(8); !strings.Contains(w, "asks for 8 GPUs") || !strings.Contains(w, "kept at most 1 busy in 95% of 20 samples") {
		t.Errorf("warning: %q", w)
	}
	if w := big.Warning(2); w != "" {
		t.Errorf("asking for 2 (right-sized) still warns: %q", w)
	}
	fit, _ := tab.Get("vision", "fit")
	if fit.Oversized(fit.Asked) || fit.Warning(1) != "" {
		t.Errorf("fit: %+v", fit)
	}
	if got := usage.Worst([]usage.Profile{fit, big}, 5); len(got) != 1 || got[0].Job != "big" {
		t.Errorf("worst: %+v", got)
	}
	if dirty := tab.TakeDirty(); len(dirty) != 2 || len(tab.TakeDirty()) != 0 {
		t.Errorf("dirty: %d", len(dirty))
	}
	if gone := tab.Expire(t0.Add(time.Hour), usage.MaxProfiles); len(gone) != 2 {
		t.Errorf("expired %d", len(gone))
	}
}

func TestTooFewSamplesAreNotJudged(t *testing.T) {
	tab := usage.NewProfiles()
	for i := 0; i < usage.MinSamples-1; i++ {
		tab.Sample(t0, []reclaim.Alloc{running("a", "j", "g0", "g1", "g2", "g3")}, util(nil), 5)
	}
	// No utilisation sample at all counts as busy.
	p, _ := tab.Get("vision", "j")
	if p.BusyAt(0.95) != 4 || p.Warning(4) != "" {
		t.Errorf("%+v", p)
	}
	tab.Sample(t0, []reclaim.Alloc{running("a", "j", "g0", "g1", "g2", "g3")}, util(map[string]float64{"g0": 0, "g1": 0, "g2": 0, "g3": 0}), 5)
	if p, _ := tab.Get("vision", "j"); p.Warning(4) != "" {
		t.Errorf("one idle sample in ten warns: %+v", p)
	}
}

func TestWorstListsEachTenantsBiggestWasteFirst(t *testing.T) {
	mk := func(tenant, job string, asked, busy int) usage.Profile {
		p := usage.Profile{Namespace: tenant, Job: job, Tenant: tenant, Asked: asked, Busy: make([]int64, busy+1)}
		p.Busy[busy] = usage.MinSamples
		return p
	}
	got := usage.Worst([]usage.Profile{mk("b", "x", 8, 1), mk("a", "small", 4, 1), mk("a", "large", 8, 0), mk("a", "third", 8, 3), mk("a", "ok", 2, 1)}, 2)
	var names []string
	for _, p := range got {
		names = append(names, p.Tenant+"/"+p.Job)
	}
	if strings.Join(names, " ") != "a/large a/third b/x" {
		t.Errorf("worst: %v", names)
	}
}
