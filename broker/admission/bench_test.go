package admission_test

import (
	"fmt"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// BenchmarkDecide is one admission decision, snapshot given, for policies of
// 10 and 1,000 tenants.
func BenchmarkDecide(b *testing.B) {
	for _, tenants := range []int{10, 1000} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			src := "queue \"training\" { priority = 60 }\nborrowing {\n enabled = true\n priority = 20\n}\n"
			for i := 0; i < tenants; i++ {
				src += fmt.Sprintf("tenant \"t%d\" {\n namespaces = [\"ns%d\"]\n queues = [\"training\"]\n guaranteed = 8\n limit = 16\n}\n", i, i)
			}
			p, diags := policyhcl.Parse(map[string][]byte{"p.hcl": []byte(src)}, 0)
			if diags.HasErrors() {
				b.Fatal(diags)
			}
			u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Idle: policy.Quota{"": 64}, MaxAlloc: policy.Quota{"": 8}}
			for i := 0; i < tenants; i++ {
				u.Tenants[fmt.Sprintf("t%d", i)] = admission.TenantUsage{Used: policy.Quota{"": 10}}
			}
			job := admission.Job{ID: "j", Namespace: fmt.Sprintf("ns%d", tenants-1),
				Groups: []admission.Group{{Name: "g", Count: 2, GPUsPerAlloc: 2}}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if d := admission.Decide(p, job, u); d.Outcome != admission.AdmitBorrowed {
					b.Fatal(d)
				}
			}
		})
	}
}
