package reclaimer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// mem is a profile store in memory; fail makes its writes fail.
type mem struct {
	byJob map[string]usage.Profile
	fail  bool
	puts  int
}

func (m *mem) List(context.Context) ([]usage.Profile, error) {
	var out []usage.Profile
	for _, p := range m.byJob {
		out = append(out, p)
	}
	return out, nil
}

func (m *mem) Put(_ context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	if m.fail {
		return ps, errors.New("consul down")
	}
	for _, p := range ps {
		m.byJob[p.Namespace+"/"+p.Job] = p
		m.puts++
	}
	return nil, nil
}

func (m *mem) Delete(_ context.Context, ps []usage.Profile) ([]usage.Profile, error) {
	for _, p := range ps {
		delete(m.byJob, p.Namespace+"/"+p.Job)
	}
	return nil, nil
}

const src = `
queue "dev" { priority = 40 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["dev"]
}
reclaim_settings {
  period    = "30s"
  retention = "1h"
}
`

func TestTheLeaderLoadsSamplesAndWritesProfilesEveryTenPeriods(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	store := &mem{byJob: map[string]usage.Profile{
		"vision/nb": {Namespace: "vision", Job: "nb", Tenant: "vision", Asked: 1, Busy: []int64{5}, First: t0.Add(-time.Hour), Last: t0},
		"vision/old": {Namespace: "vision", Job: "old", Tenant: "vision", Asked: 1, Busy: []int64{5}, First: t0.Add(-3 * time.Hour),
			Last: t0.Add(-2 * time.Hour)},
	}}
	table := usage.NewProfiles()
	rec := &reclaimer.Recorder{Store: store, Table: table, Policies: testbuild.Fixed{P: testbuild.Policy(t, src)}}
	allocs := []reclaim.Alloc{{ID: "a", Namespace: "vision", JobID: "nb", Admitted: true, Tenant: "vision", StartedAt: t0, GPUs: []string{"g0"}}}
	gpus := map[string]reclaim.GPU{"g0": {Utilization: 0, Healthy: true}}
	observe := func(i int) {
		t.Helper()
		if err := rec.Observed(context.Background(), t0.Add(time.Duration(i)*30*time.Second), allocs, gpus); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < reclaimer.FlushEvery; i++ {
		observe(i)
	}
	if p, _ := table.Get("vision", "nb"); p.Samples() != 5+reclaimer.FlushEvery-1 || store.puts != 0 {
		t.Fatalf("before the flush: %+v, %d writes", p, store.puts)
	}
	store.fail = true
	if err := rec.Observed(context.Background(), t0.Add((reclaimer.FlushEvery+1)*30*time.Second), allocs, gpus); err == nil {
		t.Fatal("a failed write was not reported")
	}
	store.fail = false
	observe(2*reclaimer.FlushEvery + 1) // ten periods later: written again, with every sample
	if p := store.byJob["vision/nb"]; p.Samples() != 5+reclaimer.FlushEvery+1 {
		t.Errorf("stored: %+v", p)
	}
	if _, ok := store.byJob["vision/old"]; ok {
		t.Error("a profile past retention was kept")
	}
}
