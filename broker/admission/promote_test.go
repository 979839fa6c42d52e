package admission_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestPromotionsRunBorrowedWorkOnWithinTheGuaranteeOldestFirst(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
queue "dev" { priority = 40 }
gpu_class "h100" { models = ["NVIDIA H100*"] }
borrowing {
  enabled       = true
  promote_below = 0.5
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training", "dev"]
  guaranteed = 8
  limit      = 16
}
tenant "research" {
  namespaces = ["research"]
  queues     = ["dev"]
  guaranteed = { h100 = 2 }
  limit      = { h100 = 4 }
}
`)
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	run := func(id, tenant, queue string, gpus float64, at time.Duration) admission.Running {
		return admission.Running{Namespace: tenant, ID: id, Tenant: tenant, Queue: queue, GPUs: gpus, Since: t0.Add(at)}
	}
	running := []admission.Running{
		run("newer", "vision", "dev", 1, time.Hour),
		run("big", "vision", "training", 4, 0),
		run("old", "vision", "training", 2, -time.Hour),
		run("small", "vision", "dev", 1, 2*time.Hour),
		run("class", "research", "dev", 1, 0), // a guarantee by class: not weighed
		run("gone", "vision", "no-such-queue", 1, 0),
	}
	got := admission.Promotions(p, map[string]float64{"vision": 1}, running)
	var ids []string
	for _, g := range got {
		ids = append(ids, g.ID)
		if g.Priority != p.Queues[g.Queue].Band {
			t.Errorf("%s promoted to %d, not its queue's band %d", g.ID, g.Priority, p.Queues[g.Queue].Band)
		}
	}
	// Within half of 8 with 1 held: old (2), then big (4) would pass 4,
	// newer (1) fits, small would pass it.
	if want := []string{"old", "newer"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("promoted %v, want %v", ids, want)
	}
	p.Borrowing.PromoteBelow = 0
	if got := admission.Promotions(p, nil, running); got != nil {
		t.Errorf("promote_below 0 promoted %v", got)
	}
}

// A workload's own promote_below (work that keeps no checkpoint) promotes
// its borrowed jobs up to its share, while the others follow the borrowing
// block's (here: never).
func TestAWorkloadsOwnPromoteBelowPromotesOnlyItsWork(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
queue "inference" { priority = 80 }
workload "training" {}
workload "inference" { promote_below = 1 }
borrowing { enabled = true }
tenant "search" {
  namespaces = ["search"]
  queues     = ["training", "inference"]
  guaranteed = 8
  limit      = 16
}
`)
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	running := []admission.Running{
		{Namespace: "search", ID: "train", Tenant: "search", Queue: "training", GPUs: 1, Since: t0},
		{Namespace: "search", ID: "serve", Tenant: "search", Queue: "inference", GPUs: 2, Since: t0.Add(time.Hour)},
		{Namespace: "search", ID: "serve-more", Tenant: "search", Queue: "inference", GPUs: 2, Since: t0.Add(2 * time.Hour)},
	}
	// 5 held within the guarantee: serve (2) fits 8, serve-more would pass it.
	got := admission.Promotions(p, map[string]float64{"search": 5}, running)
	if len(got) != 1 || got[0].ID != "serve" || got[0].Priority != p.Queues["inference"].Band {
		t.Errorf("promoted %+v, want serve alone at the inference band %d", got, p.Queues["inference"].Band)
	}
	if b := p.PromoteBelow("training"); b != 0 {
		t.Errorf("training's promote_below = %g, want the borrowing block's 0", b)
	}
}
