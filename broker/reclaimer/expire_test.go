package reclaimer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim/reclaimtest"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// approvals keeps approvals in memory, versioned as the Consul store does.
type approvals struct{ byID map[string]approval.Approval }

func (m *approvals) Current() []approval.Approval {
	var out []approval.Approval
	for _, a := range m.byID {
		out = append(out, a)
	}
	return out
}

func (m *approvals) Get(_ context.Context, id string) (approval.Approval, error) {
	a, ok := m.byID[id]
	if !ok {
		return a, approval.ErrNotFound
	}
	return a, nil
}

func (m *approvals) Update(_ context.Context, a approval.Approval) (bool, error) {
	if m.byID[a.ID].ModifyIndex != a.ModifyIndex {
		return false, nil
	}
	a.ModifyIndex++
	m.byID[a.ID] = a
	return true, nil
}

// jobs are live jobs and what vision holds.
type jobs struct {
	live map[string]bool
	used float64
}

func (j jobs) HasJob(ns, id string) bool { return j.live[ns+"/"+id] }
func (j jobs) UsageWithout(*policy.Policy, string, string) admission.Usage {
	return admission.Usage{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: j.used}}}}
}

func TestAnExpiredApprovalRequeuesOnlyAJobItAloneKeptWithinTheLimit(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 4
}`)
	granted := func(id, job string, extra, priority int) approval.Approval {
		a := approval.Approval{ID: id, Namespace: "vision", Job: job, Reason: "r", ExtraGPUs: extra, Priority: priority, For: "1h"}
		a.Grant("ops", t0)
		return a
	}
	for _, c := range []struct {
		name    string
		a       approval.Approval
		live    bool
		used    float64
		requeue bool
	}{
		{"above the limit without it", granted("a1", "big", 2, 0), true, 6, true},
		{"within the limit again", granted("a2", "big", 2, 0), true, 4, false},
		{"the job is gone", granted("a3", "big", 2, 0), false, 6, false},
		{"a band, not GPUs", granted("a4", "big", 0, 90), true, 6, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &approvals{byID: map[string]approval.Approval{c.a.ID: c.a}}
			recs := reclaimtest.NewMem()
			n := 0
			e := &reclaimer.Expirer{Store: store, Jobs: jobs{live: map[string]bool{"vision/big": c.live}, used: c.used},
				Policies: testbuild.Fixed{P: p}, Records: recs, NewID: func() string { n++; return fmt.Sprint("rec-", n) }}
			if err := e.Observed(context.Background(), t0.Add(30*time.Minute), nil, nil); err != nil {
				t.Fatal(err)
			}
			if store.byID[c.a.ID].State != approval.Granted {
				t.Fatalf("expired before its time: %s", store.byID[c.a.ID].State)
			}
			if err := e.Observed(context.Background(), t0.Add(time.Hour), nil, nil); err != nil {
				t.Fatal(err)
			}
			if s := store.byID[c.a.ID].State; s != approval.Expired {
				t.Errorf("state %s at its expiry", s)
			}
			all, _ := recs.List(context.Background())
			if c.requeue != (len(all) == 1) {
				t.Fatalf("records %+v, want a requeue: %v", all, c.requeue)
			}
			if c.requeue && (all[0].Rule != reclaimer.ExpiredRule || all[0].Action != policy.ActionRequeue || all[0].State != reclaim.Proposed || all[0].Job != "big") {
				t.Errorf("record %+v", all[0])
			}
			// Expired once: the passes after it decide nothing again.
			if err := e.Observed(context.Background(), t0.Add(2*time.Hour), nil, nil); err != nil {
				t.Fatal(err)
			}
			if again, _ := recs.List(context.Background()); len(again) != len(all) {
				t.Errorf("decided again: %+v", again)
			}
		})
	}
}
