package reclaimer_test

import (
	"context"
	"fmt"
	"strings"
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

func (m *approvals) Delete(_ context.Context, a approval.Approval) (bool, error) {
	if m.byID[a.ID].ModifyIndex != a.ModifyIndex {
		return false, nil
	}
	delete(m.byID, a.ID)
	return true, nil
}

func (m *approvals) Update(_ context.Context, a approval.Approval) (bool, error) {
	if m.byID[a.ID].ModifyIndex != a.ModifyIndex {
		return false, nil
	}
	a.ModifyIndex++
	m.byID[a.ID] = a
	return true, nil
}

// jobs are live jobs, by the region that holds each, and what vision holds.
type jobs struct {
	live map[string]string
	used float64
}

func (j jobs) JobRegion(ns, id string) (string, bool) {
	region, ok := j.live[ns+"/"+id]
	return region, ok
}
func (j jobs) UsageWithout(*policy.Policy, string, string) admission.Usage {
	return admission.Usage{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: j.used}}}}
}

// expirePolicy gives vision a guarantee of 2 and a limit of 4.
const expirePolicy = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 4
}`

func TestAnExpiredApprovalRequeuesOnlyAJobItAloneKeptWithinTheLimit(t *testing.T) {
	p := testbuild.Policy(t, expirePolicy)
	granted := func(id, job string, extra, priority int) approval.Approval {
		a := approval.Approval{ID: id, Namespace: "vision", Job: job, Reason: "r", ExtraGPUs: extra, Priority: priority, For: "1h"}
		a.Grant("ops", t0)
		return a
	}
	for _, c := range []struct {
		name    string
		a       approval.Approval
		live    map[string]string // region by job
		used    float64
		requeue bool
	}{
		{"above the limit without it", granted("a1", "big", 2, 0), map[string]string{"vision/big": ""}, 6, true},
		{"above the limit, in another region", granted("a1", "big", 2, 0), map[string]string{"vision/big": "west"}, 6, true},
		{"within the limit again", granted("a2", "big", 2, 0), map[string]string{"vision/big": ""}, 4, false},
		{"the job is gone", granted("a3", "big", 2, 0), nil, 6, false},
		{"a band, not GPUs", granted("a4", "big", 0, 90), map[string]string{"vision/big": ""}, 6, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &approvals{byID: map[string]approval.Approval{c.a.ID: c.a}}
			recs := reclaimtest.NewMem()
			n := 0
			e := &reclaimer.Expirer{Store: store, Jobs: jobs{live: c.live, used: c.used},
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
			if c.requeue && (all[0].Rule != reclaimer.ExpiredRule || all[0].Action != policy.ActionRequeue || all[0].State != reclaim.Proposed || all[0].Job != "big" ||
				all[0].Region != c.live["vision/big"]) {
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

// A request nobody decides expires after approval.PendingFor; denied and
// expired requests are deleted after the reclaim retention, so requests
// never pile up (D4: 600 requests of 48 KiB were all kept).
func TestUndecidedRequestsExpireAndEndedOnesAreDeleted(t *testing.T) {
	p := testbuild.Policy(t, expirePolicy)
	ask := func(id, state string, at time.Time) approval.Approval {
		return approval.Approval{ID: id, Namespace: "vision", Job: "big", Reason: "r", ExtraGPUs: 1, For: "1h", State: state,
			RequestedAt: at, DecidedAt: at}
	}
	store := &approvals{byID: map[string]approval.Approval{
		"waits":  ask("waits", approval.Pending, t0),
		"denied": ask("denied", approval.Denied, t0),
	}}
	e := &reclaimer.Expirer{Store: store, Jobs: jobs{}, Policies: testbuild.Fixed{P: p}, Records: reclaimtest.NewMem(),
		NewID: func() string { return "rec" }}
	if err := e.Observed(context.Background(), t0.Add(approval.PendingFor-time.Minute), nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(store.byID) != 2 || store.byID["waits"].State != approval.Pending {
		t.Fatalf("before its time: %+v", store.byID)
	}
	if err := e.Observed(context.Background(), t0.Add(approval.PendingFor), nil, nil); err != nil {
		t.Fatal(err)
	}
	if a := store.byID["waits"]; a.State != approval.Expired {
		t.Errorf("a request undecided for %s: %s", approval.PendingFor, a.State)
	}
	end := t0.Add(approval.PendingFor + p.ReclaimSettings.Retention)
	if err := e.Observed(context.Background(), end, nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(store.byID) != 0 {
		t.Errorf("kept past the retention: %+v", store.byID)
	}
}

func TestPendingRequestsAreBounded(t *testing.T) {
	var pending []approval.Approval
	for i := 0; i < approval.MaxPendingPerRequester; i++ {
		pending = append(pending, approval.Approval{ID: fmt.Sprint(i), Namespace: "vision", State: approval.Pending, RequestedIdentity: "ana"})
	}
	if err := approval.CheckPending(pending, "ana", "vision"); err == nil {
		t.Errorf("ana's request beyond %d pending: accepted", approval.MaxPendingPerRequester)
	}
	if err := approval.CheckPending(pending, "bob", "vision"); err != nil {
		t.Errorf("bob's first: %v", err)
	}
	for i := len(pending); i < approval.MaxPendingPerNamespace; i++ {
		pending = append(pending, approval.Approval{ID: fmt.Sprint(i), Namespace: "vision", State: approval.Pending, RequestedIdentity: fmt.Sprint("u", i)})
	}
	if err := approval.CheckPending(pending, "bob", "vision"); err == nil {
		t.Errorf("a request in a namespace with %d pending: accepted", approval.MaxPendingPerNamespace)
	}
	long := approval.Approval{Namespace: "vision", Job: "big", Reason: strings.Repeat("x", approval.MaxReason+1), ExtraGPUs: 1, For: "1h"}
	if err := long.Check(); err == nil {
		t.Errorf("a reason of %d bytes: accepted", len(long.Reason))
	}
}
