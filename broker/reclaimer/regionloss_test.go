package reclaimer_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/queue/queuetest"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// lossRegions are east and west as the region-loss watcher reads them.
type lossRegions struct {
	unreachable map[string]time.Time
	jobs        map[string][]*api.Job // dispatched, by region
	lost        []string              // region/namespace/id, as LoseIn was told
}

func (r *lossRegions) Names() []string { return []string{"east", "west"} }
func (r *lossRegions) Unreachable(region string) (time.Time, string) {
	return r.unreachable[region], "connection refused"
}
func (r *lossRegions) Reached(region string) bool            { return r.unreachable[region].IsZero() }
func (r *lossRegions) DispatchedIn(region string) []*api.Job { return r.jobs[region] }
func (r *lossRegions) DispatchedElsewhere(region, ns, id string) *api.Job {
	for name, jobs := range r.jobs {
		for _, j := range jobs {
			if name != region && *j.ID == id && *j.Namespace == ns {
				return j
			}
		}
	}
	return nil
}
func (r *lossRegions) LoseIn(region, ns, id string) {
	r.lost = append(r.lost, region+"/"+ns+"/"+id)
	r.jobs[region] = slices.DeleteFunc(r.jobs[region], func(j *api.Job) bool { return *j.ID == id })
}

// A lost region's jobs stay charged for region_lost_timeout; then a batch job
// is requeued (once) and a service held. Back, a region's copy dispatched
// before the requeued one is stopped; a requeued copy still queued is
// withdrawn instead.
func TestALostRegionsBatchJobIsRequeuedAndItsStaleCopyStoppedWhenBack(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
}
region_lost_timeout = "5m"
`)
	dispatched := func(id, typ, dispatch string) *api.Job {
		j := testbuild.Job("vision", id).Type(typ).Group("g", 1, 2, "gpu").Meta("nomad-gpu.dispatched-region", "west").
			Meta("nomad-gpu.dispatch-id", dispatch).Build()
		j.Region = ptr("west")
		j.TaskGroups[0].Constraints = []*api.Constraint{{LTarget: "${node.unique.id}", Operand: "set_contains_any", RTarget: "w1"}}
		return j
	}
	train, serve := dispatched("train", "batch", "01"), dispatched("serve", "service", "02")
	down := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	regions := &lossRegions{unreachable: map[string]time.Time{"west": down}, jobs: map[string][]*api.Job{"west": {serve, train}}}
	q := queuetest.NewMem()
	var stopped []string
	l := &reclaimer.RegionLoss{Log: hclog.NewNullLogger(), Policies: testbuild.Fixed{P: p}, Regions: regions, Queue: q,
		Stop: func(_ context.Context, region, ns, id string) (string, error) {
			stopped = append(stopped, region+"/"+ns+"/"+id)
			return "job stopped", nil
		}}
	ctx := context.Background()
	if err := l.Observed(ctx, down.Add(5*time.Minute-time.Second), nil, nil); err != nil || len(regions.lost) > 0 {
		t.Fatalf("within the timeout: lost %v, %v; want nothing done", regions.lost, err)
	}
	if err := l.Observed(ctx, down.Add(5*time.Minute), nil, nil); err != nil {
		t.Fatal(err)
	}
	entries, _ := q.List(ctx)
	if len(entries) != 1 || entries[0].ID != "region-lost-west-01" || entries[0].JobID != "train" || entries[0].Demand != 2 ||
		!strings.Contains(entries[0].Reason, "region west unreachable since 2026-12-04T09:00:00Z (connection refused), past region_lost_timeout 5m0s") {
		t.Fatalf("queued %+v; want train alone, requeued from west", entries)
	}
	if body := string(entries[0].Request); strings.Contains(body, `"Region":"west"`) || strings.Contains(body, "${node.unique.id}") {
		t.Errorf("the requeued job keeps west's region or node pins: %s", body)
	}
	if !slices.Equal(regions.lost, []string{"west/vision/train"}) {
		t.Errorf("lost %v; want train alone no longer charged in west (serve is held)", regions.lost)
	}

	// West is back with train: the requeued copy, still queued, is withdrawn.
	regions.unreachable["west"] = time.Time{}
	regions.jobs["west"] = append(regions.jobs["west"], train)
	if err := l.Observed(ctx, down.Add(6*time.Minute), nil, nil); err != nil {
		t.Fatal(err)
	}
	if entries, _ := q.List(ctx); len(entries) != 0 || len(stopped) != 0 {
		t.Errorf("queued %+v, stopped %v; want the requeued copy withdrawn, nothing stopped", entries, stopped)
	}

	// Train dispatched again to east (a later id) while west was away: west's copy is stale.
	again := testbuild.Job("vision", "train").Type("batch").Group("g", 1, 2, "gpu").Meta("nomad-gpu.dispatch-id", "03").Build()
	again.Region = ptr("east")
	regions.jobs["east"] = []*api.Job{again}
	if err := l.Observed(ctx, down.Add(7*time.Minute), nil, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stopped, []string{"west/vision/train"}) {
		t.Errorf("stopped %v; want west's copy of train, dispatched before east's", stopped)
	}
}
