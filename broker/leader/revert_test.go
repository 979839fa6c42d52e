package leader

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

type leading bool

func (l leading) IsLeader() bool { return bool(l) }

// Each revert Nomad makes on its own is recorded once, by the leader: admit
// within the tenant's limit, over-limit above it.
func TestARevertNomadMadeIsARecordedDecision(t *testing.T) {
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
