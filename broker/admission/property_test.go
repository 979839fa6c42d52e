package admission_test

import (
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

func genJob(t *rapid.T) admission.Job {
	job := admission.Job{
		ID:        "j",
		Namespace: rapid.SampledFrom([]string{"vision", "search", "search-canary", "research", "default"}).Draw(t, "namespace"),
		Queue:     rapid.SampledFrom([]string{"", "training", "dev", "inference"}).Draw(t, "queue"),
	}
	for i, n := 0, rapid.IntRange(1, 3).Draw(t, "groups"); i < n; i++ {
		job.Groups = append(job.Groups, admission.Group{
			Name:         "g",
			Count:        rapid.IntRange(0, 4).Draw(t, "count"),
			GPUsPerAlloc: rapid.IntRange(0, 8).Draw(t, "perAlloc"),
			Model:        rapid.SampledFrom([]string{"", h100}).Draw(t, "model"),
		})
	}
	return job
}

func genUsage(t *rapid.T) admission.Usage {
	u := cluster(float64(rapid.IntRange(0, 16).Draw(t, "idle")), nil)
	for _, tenant := range []string{"vision", "search", "research"} {
		n := float64(rapid.IntRange(0, 16).Draw(t, "used-"+tenant))
		tu := admission.TenantUsage{Used: policy.Quota{"": n, "h100": n}}
		if lost := float64(rapid.IntRange(0, 4).Draw(t, "unsettled-"+tenant)); lost > 0 { // of jobs in a lost region
			tu.Unsettled = policy.Quota{"": lost, "h100": lost}
		}
		u.Tenants[tenant] = tu
	}
	return u
}

// TestNeverAboveLimit: whatever is admitted keeps its tenant within every
// limit, counting its jobs in lost regions that may run there still.
func TestNeverAboveLimit(t *testing.T) {
	p := testPolicy(t, true)
	rapid.Check(t, func(t *rapid.T) {
		job, u := genJob(t), genUsage(t)
		d := admission.Decide(p, job, u)
		if (d.Outcome != admission.Admit && d.Outcome != admission.AdmitBorrowed) || d.Demand[policy.AllGPUs] == 0 {
			return
		}
		tenant := p.Tenants[d.Tenant]
		for class, limit := range tenant.Limit {
			if got := u.Tenants[d.Tenant].Used[class] + u.Tenants[d.Tenant].Unsettled[class] + d.Demand[class]; got > limit {
				t.Fatalf("%s admitted: tenant %s would hold %g %q GPUs, limit %g", d.Outcome, d.Tenant, got, class, limit)
			}
		}
		if d.Outcome == admission.AdmitBorrowed && d.Demand[policy.AllGPUs] > u.Idle[policy.AllGPUs] {
			t.Fatalf("borrowed %g GPUs with only %g idle", d.Demand[policy.AllGPUs], u.Idle[policy.AllGPUs])
		}
	})
}

// TestGuaranteeNeverQueued: a tenant that stays within its guarantee is admitted
// at its queue's band, even when every GPU is held (Nomad preempts borrowed
// work), unless its jobs in lost regions would take it above its limit.
func TestGuaranteeNeverQueued(t *testing.T) {
	p := testPolicy(t, true)
	rapid.Check(t, func(t *rapid.T) {
		job, u := genJob(t), genUsage(t)
		d := admission.Decide(p, job, u)
		tenant := p.TenantOf(job.Namespace)
		if tenant == nil || d.Outcome == admission.Reject || d.Demand[policy.AllGPUs] == 0 {
			return
		}
		used, lost := u.Tenants[tenant.Name].Used, u.Tenants[tenant.Name].Unsettled
		for class, g := range tenant.Guaranteed {
			if used[class]+d.Demand[class] > g {
				return
			}
		}
		for class, limit := range tenant.Limit {
			if used[class]+lost[class]+d.Demand[class] > limit {
				return
			}
		}
		if _, all := tenant.Guaranteed[policy.AllGPUs]; !all && d.Demand[policy.AllGPUs] > d.Demand["h100"] {
			return // GPUs outside the classes it is guaranteed
		}
		if d.Outcome != admission.Admit || d.Priority != p.Queues[d.Queue].Band {
			t.Fatalf("within guarantee but %s at %d: %s", d.Outcome, d.Priority, d.Reason)
		}
	})
}

// TestDeterministic: the same inputs give the same decision.
func TestDeterministic(t *testing.T) {
	p := testPolicy(t, true)
	rapid.Check(t, func(t *rapid.T) {
		job, u := genJob(t), genUsage(t)
		if a, b := admission.Decide(p, job, u), admission.Decide(p, job, u); !reflect.DeepEqual(a, b) {
			t.Fatalf("two decisions for the same input:\n%+v\n%+v", a, b)
		}
	})
}
