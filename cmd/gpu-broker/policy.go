package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/policystore"
)

// validatePolicy prints diagnostics as file:line:col and fails on any error.
func validatePolicy(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("policy validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	capacity := fs.Int("capacity", 0, "cluster GPUs, to warn when guarantees exceed them")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: gpu-broker policy validate [-capacity N] DIR")
		return 2
	}
	p, diags := policyhcl.LoadDir(fs.Arg(0), *capacity)
	fmt.Fprint(stderr, policyhcl.FormatDiagnostics(diags))
	if p == nil {
		return 1
	}
	fmt.Fprintf(stdout, "%s: valid: %d queues, %d tenants, %d GPU classes, %d reclaim rules\n", fs.Arg(0), len(p.Queues), len(p.Tenants), len(p.Classes), len(p.Reclaim))
	// The Nomad priorities guaranteed work runs at: not the queues' own.
	queues := slices.SortedFunc(maps.Values(p.Queues), func(a, b *policy.Queue) int { return b.Priority - a.Priority })
	bands := make([]string, len(queues))
	for i, q := range queues {
		bands[i] = fmt.Sprintf("%s %d", q.Name, q.Band)
	}
	if len(bands) > 0 {
		fmt.Fprintf(stdout, "guaranteed work runs at Nomad priority: %s", strings.Join(bands, ", "))
		if p.Borrowing.Enabled {
			fmt.Fprintf(stdout, "; borrowed work at %d", p.Borrowing.Priority)
			if room := p.SubBandRoom(); room > 0 {
				fmt.Fprintf(stdout, " to %d (sub-bands by the GPU time at stake, from %s)", p.Borrowing.Priority+room, p.Borrowing.SubBandStep)
			}
		}
		fmt.Fprintln(stdout)
	}
	return 0
}

// policyStatus prints the policy a broker has in force and how its last
// reload went; it exits 1 when that reload was refused (the policy in force
// is older than the files), so that a check can alert on it.
func policyStatus(args []string) int {
	fs := flag.NewFlagSet("policy status", flag.ContinueOnError)
	addr := fs.String("address", envOr("GPU_BROKER_ADDR", "http://127.0.0.1:4649"), "broker address")
	asJSON := fs.Bool("json", false, "print JSON")
	token := fs.String("token", os.Getenv("NOMAD_TOKEN"), "Nomad ACL token (default: NOMAD_TOKEN)")
	caCert := fs.String("ca-cert", os.Getenv("GPU_BROKER_CACERT"), "CA certificate to trust when the broker serves TLS")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	body, ok := fetch(*caCert, *addr, "GET", "/v1/gpu/policy", *token, nil, *asJSON)
	if !ok {
		return 1
	}
	var st policystore.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fail(err)
	}
	if !*asJSON {
		fmt.Printf("Policy in force  %s: %d queues, %d tenants, loaded %s\n", st.Dir, st.Queues, st.Tenants, st.LoadedAt.Format(time.RFC3339))
		if st.Stale {
			fmt.Printf("STALE            the last reload (%s) was refused, the policy above stays in force:\n%s\n",
				st.LastReloadAt.Format(time.RFC3339), strings.TrimSpace(st.LastError))
		}
	}
	return exit(!st.Stale)
}

// TenantVars is `gpu-broker policy tenants -tfvars`: the `tenants` variable of
// terraform/modules/cluster-config, read from a policy directory.
type TenantVars struct {
	Tenants map[string]TenantVar `json:"tenants"`
}

// TenantVar is one tenant's namespaces and submitters ("role:x", "policy:y").
type TenantVar struct {
	Namespaces []string `json:"namespaces"`
	Submitters []string `json:"submitters"`
}

// policyTenants prints each tenant's namespaces, or with -tfvars a JSON
// variables file for Terraform, so namespaces and ACLs follow the policy files.
func policyTenants(args []string) int {
	fs := flag.NewFlagSet("policy tenants", flag.ContinueOnError)
	tfvars := fs.Bool("tfvars", false, "print a Terraform variables file (JSON) for terraform/modules/cluster-config")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: gpu-broker policy tenants [-tfvars] DIR")
		return 2
	}
	p, diags := policyhcl.LoadDir(fs.Arg(0), 0)
	if p == nil {
		fmt.Fprint(os.Stderr, policyhcl.FormatDiagnostics(diags))
		return 1
	}
	out := TenantVars{Tenants: map[string]TenantVar{}}
	for name, t := range p.Tenants {
		v := TenantVar{Namespaces: t.Namespaces, Submitters: []string{}}
		for _, s := range t.Submitters {
			v.Submitters = append(v.Submitters, s.String())
		}
		out.Tenants[name] = v
	}
	if *tfvars {
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Println(string(b))
		return 0
	}
	names := make([]string, 0, len(out.Tenants))
	for name := range out.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	t := newTable("TENANT", "NAMESPACES", "SUBMITTERS")
	for _, name := range names {
		v := out.Tenants[name]
		t.row(name, strings.Join(v.Namespaces, ","), strings.Join(v.Submitters, ", "))
	}
	t.print(os.Stdout, outputWidth(false))
	return 0
}
