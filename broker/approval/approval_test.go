package approval_test

import (
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/internal/testbuild"
)

func TestCheck(t *testing.T) {
	ok := approval.Approval{Namespace: "vision", Job: "big", Reason: "deadline", ExtraGPUs: 2, For: "4h"}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]approval.Approval{
		"no reason":   {Namespace: "vision", Job: "big", ExtraGPUs: 2, For: "4h"},
		"both":        {Namespace: "vision", Job: "big", Reason: "r", ExtraGPUs: 2, Priority: 80, For: "4h"},
		"neither":     {Namespace: "vision", Job: "big", Reason: "r", For: "4h"},
		"too long":    {Namespace: "vision", Job: "big", Reason: "r", Priority: 80, For: "200h"},
		"bad prio":    {Namespace: "vision", Job: "big", Reason: "r", Priority: 101, For: "1h"},
		"no duration": {Namespace: "vision", Job: "big", Reason: "r", Priority: 80},
	} {
		if err := a.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestApplyOnlyWhileGrantedAndOnlyForItsJob(t *testing.T) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 2
}
`)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	extra := approval.Approval{Namespace: "vision", Job: "big", Reason: "r", ExtraGPUs: 3, For: "1h", State: approval.Pending}
	prio := approval.Approval{Namespace: "vision", Job: "big", Reason: "r", Priority: 90, For: "30m", State: approval.Pending}
	if q, pr := approval.Apply(p, []approval.Approval{extra, prio}, "vision", "big", now); q != p || pr != 0 {
		t.Fatal("pending approvals applied")
	}
	extra.Grant("ops", now)
	prio.Grant("ops", now)
	q, pr := approval.Apply(p, []approval.Approval{extra, prio}, "vision", "big", now.Add(10*time.Minute))
	if q.TenantOf("vision").Limit.Total() != 5 || pr != 90 {
		t.Errorf("granted: limit %g, priority %d", q.TenantOf("vision").Limit.Total(), pr)
	}
	if q, pr := approval.Apply(p, []approval.Approval{extra, prio}, "vision", "other", now); q != p || pr != 0 {
		t.Error("applied to another job")
	}
	if q, pr := approval.Apply(p, []approval.Approval{extra, prio}, "vision", "big", now.Add(45*time.Minute)); q.TenantOf("vision").Limit.Total() != 5 || pr != 0 {
		t.Errorf("after the priority expired: limit %g, priority %d", q.TenantOf("vision").Limit.Total(), pr)
	}
	if q, _ := approval.Apply(p, []approval.Approval{extra}, "vision", "big", now.Add(time.Hour)); q != p {
		t.Error("applied at its expiry")
	}
}
