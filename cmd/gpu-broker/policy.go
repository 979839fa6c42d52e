package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// validatePolicy prints diagnostics as file:line:col and fails on any error.
func validatePolicy(args []string) int {
	fs := flag.NewFlagSet("policy validate", flag.ContinueOnError)
	capacity := fs.Int("capacity", 0, "cluster GPUs, to warn when guarantees exceed them")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: gpu-broker policy validate [-capacity N] DIR")
		return 2
	}
	p, diags := policy.LoadDir(fs.Arg(0), *capacity)
	fmt.Fprint(os.Stderr, policy.FormatDiagnostics(diags))
	if p == nil {
		return 1
	}
	fmt.Printf("%s: valid: %d queues, %d tenants, %d GPU classes, %d reclaim rules\n", fs.Arg(0), len(p.Queues), len(p.Tenants), len(p.Classes), len(p.Reclaim))
	return 0
}
