package policyhcl_test

import (
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// FuzzParse: any policy text gives a policy or diagnostics, never a panic,
// and a policy only without errors.
func FuzzParse(f *testing.F) {
	f.Add(`queue "q" { priority = 60 }
tenant "t" {
  namespaces = ["a"]
  queues     = ["q"]
  guaranteed = { h100 = 2 }
  limit      = 4
}
gpu_class "h100" { models = ["NVIDIA H100*"] }
borrowing {
  enabled  = true
  priority = 20
}`)
	f.Add(`tenant "t" { namespaces = [] }`)
	f.Add(`queue "q" { priority = 1e400 }`)
	f.Add(`queue "q" { priority = -1 }` + "\n" + `queue "q" { priority = 2 }`)
	f.Add("\xff\xfe{")
	// Deep nesting, plain and hidden in strings and heredoc templates.
	f.Add("a = " + strings.Repeat("[", 5000))
	f.Add("a = " + strings.Repeat(`[")",`, 5000))
	f.Add("a = <<EOT\n${" + strings.Repeat("(", 5000) + "}\nEOT\n")
	f.Fuzz(func(t *testing.T, src string) {
		p, diags := policyhcl.Parse(map[string][]byte{"fuzz.hcl": []byte(src)}, 8)
		if diags.HasErrors() != (p == nil) {
			t.Fatalf("policy %v with diagnostics %v", p != nil, diags)
		}
	})
}
