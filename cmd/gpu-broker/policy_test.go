package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What an operator's CI sees from `gpu-broker policy validate` on a policy repo.
func TestPolicyValidate(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := validatePolicy([]string{"../../policies"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "valid: 3 queues, 3 tenants, 1 GPU classes, 5 reclaim rules") ||
		!strings.Contains(stdout.String(), "guaranteed work runs at Nomad priority: inference 49, training 45, dev 40; borrowed work at 20") {
		t.Errorf("policies/ must validate: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "q.hcl"), []byte("queue \"a\" { priority = 40 }\nborrowing {\n  enabled = true\n  sub_bands = true\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := validatePolicy([]string{dir}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "guaranteed work runs at Nomad priority: a 40; borrowed work at 20 to 29 (sub-bands by the GPU time at stake, from 15m0s)") {
		t.Errorf("sub-bands: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.hcl"), []byte("queue \"a\" {\n  priority = 60\n  colour = \"red\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	code := validatePolicy([]string{dir}, &stdout, &stderr)
	want := filepath.Join(dir, "bad.hcl") + ":3:3: error: Unsupported argument"
	if code == 0 || !strings.Contains(stderr.String(), want) {
		t.Errorf("want a non-zero exit and %q, got %d:\n%s%s", want, code, stdout.String(), stderr.String())
	}
}
