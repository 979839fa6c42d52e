package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// simulate -compare replays one workload under two policy directories,
// side by side: here the example policies, and the same with borrowing off.
func TestSimulateComparesTwoPolicies(t *testing.T) {
	noBorrowing := t.TempDir()
	for _, f := range []string{"queues.hcl", "reclaim.hcl", "tenants.hcl", "usage.hcl", "workloads.hcl"} {
		b, err := os.ReadFile(filepath.Join("../../policies", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "queues.hcl" {
			b = []byte(strings.Replace(string(b), "enabled  = true", "enabled  = false", 1))
		}
		if err := os.WriteFile(filepath.Join(noBorrowing, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if code := simulate([]string{"-compare", "../../policies", noBorrowing, "-jobs", "400", "-load", "1.2", "-nodes", "2x8:NVIDIA H100 80GB HBM3"}, &out); code != 0 {
		t.Fatalf("exit %d\n%s", code, out.String())
	}
	lines := strings.Split(out.String(), "\n")
	header := ""
	for _, l := range lines {
		if strings.Contains(l, "nomad-gpu") {
			header = l
			break
		}
	}
	if !strings.Contains(header, "../../policies nomad-gpu") || !strings.Contains(header, noBorrowing+" nomad-gpu") || strings.Contains(out.String(), "nomad-alone") {
		t.Errorf("want one nomad-gpu column per policy, got:\n%s", out.String())
	}
	preemptions := ""
	for _, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "preemptions / GPU-hours lost") {
			preemptions = l
		}
	}
	// "preemptions / GPU-hours lost  47 / 12.4  0 / 0.0"
	if f := strings.Fields(preemptions); len(f) != 10 || f[4] == "0" || f[7] != "0" {
		t.Errorf("want borrowing on to preempt and off not to: %q", preemptions)
	}
	if strings.Contains(out.String(), "goal") {
		t.Errorf("goals compare modes under one policy, not two policies:\n%s", out.String())
	}
	if code := simulate([]string{"-compare", "../../policies"}, &out); code != 2 {
		t.Errorf("-compare with one directory: exit %d, want 2", code)
	}
}
