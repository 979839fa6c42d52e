package leader

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

type leading bool

func (l leading) IsLeader() bool { return bool(l) }

// visionAndTrail are a policy of tenant vision (limit 2) and an audit trail.
func visionAndTrail(t *testing.T) (*policy.Policy, *audit.Log) {
	p := testbuild.Policy(t, `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}`)
	trail, err := audit.Open(filepath.Join(t.TempDir(), "audit.log"), 1<<20, 1, "b1")
	if err != nil {
		t.Fatal(err)
	}
	return p, trail
}

// Each revert Nomad makes on its own is recorded once, by the leader: admit
// within the tenant's limit, over-limit above it.
func TestARevertNomadMadeIsARecordedDecision(t *testing.T) {
	p, trail := visionAndTrail(t)
	used := 2.0
	r := &Reverts{Leader: leading(true), Policies: testbuild.Fixed{P: p}, Audit: trail, Log: hclog.NewNullLogger(),
		Usage: func(*policy.Policy) admission.Usage {
			return admission.Usage{Tenants: map[string]admission.TenantUsage{"vision": {Used: policy.Quota{policy.AllGPUs: used}}}}
		}}
	rv := cluster.Revert{Namespace: "vision", JobID: "web", Deployment: "d1",
		Description: "Failed due to unhealthy allocations - rolling back to job version 0"}
	r.Observed(rv)
	used = 3
	r.Observed(rv)
	(&Reverts{Leader: leading(false), Policies: testbuild.Fixed{P: p}, Audit: trail, Log: hclog.NewNullLogger()}).Observed(rv)
	r.Observed(cluster.Revert{Namespace: "default", JobID: "cpu"})

	events, _, _, err := trail.Page(audit.Cursor{}, audit.MaxPage, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`admit: deployment d1: Failed due to unhealthy allocations - rolling back to job version 0; tenant "vision" holds 2 of its limit of 2 GPUs`,
		`over-limit: deployment d1: Failed due to unhealthy allocations - rolling back to job version 0; tenant "vision" holds 3 of its limit of 2 GPUs`,
	}
	if len(events) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(events), len(want), events)
	}
	for i, e := range events {
		if e.What != audit.AutoRevert || e.Job != "web" || e.Tenant != "vision" || !strings.HasPrefix(e.Result, want[i]) {
			t.Errorf("record %d: %+v\nwant result starting %q", i, e, want[i])
		}
	}
}

// Nomad's revert of a job the broker wrote is the broker's version: the
// record of its last write moves to the revert's index, and no further back.
// A job it has no record of, or is writing now, keeps what it has.
func TestARevertNomadMadeIsRecordedAsTheBrokersWrite(t *testing.T) {
	p, trail := visionAndTrail(t)
	web, west, busy := testbuild.Ref("vision", "web"), nomadjob.Ref{Region: "west", Namespace: "vision", ID: "web"}, testbuild.Ref("vision", "busy")
	writes := testbuild.Writes{web: {Index: 10}, west: {Index: 50}, busy: {Index: 10, Pending: true}}
	r := &Reverts{Leader: leading(true), Policies: testbuild.Fixed{P: p}, Audit: trail, Log: hclog.NewNullLogger(), Writes: writes,
		Clock: clock.Fixed(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		Usage: func(*policy.Policy) admission.Usage {
			return admission.Usage{Tenants: map[string]admission.TenantUsage{}}
		}}
	for _, rv := range []cluster.Revert{{Namespace: "vision", JobID: "web", Index: 30}, {Namespace: "vision", JobID: "web", Index: 20},
		{Region: "west", Namespace: "vision", JobID: "web", Index: 40}, {Namespace: "vision", JobID: "busy", Index: 30},
		{Namespace: "vision", JobID: "none", Index: 30}} {
		r.Observed(rv)
	}
	if writes[web].Index != 30 || writes[west].Index != 50 || writes[busy].Index != 10 || len(writes) != 3 {
		t.Errorf("records after Nomad's reverts: %+v; want web at 30 (not back to 20), west's and the pending one as they were, none added", writes)
	}
	// A listing tells rollbacks to every broker, leading or not.
	r.Leader = leading(false)
	r.RecordWrite(cluster.Revert{Namespace: "vision", JobID: "web", Index: 35})
	if writes[web].Index != 35 {
		t.Errorf("a rollback a listing showed, on a broker not leading: web at %d, want 35", writes[web].Index)
	}
}
