package policystore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/policystore"
)

const good = `
queue "training" { priority = 60 }
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 2
  limit      = %LIMIT%
}
`

func write(t *testing.T, path, limit string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Replace(good, "%LIMIT%", limit, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAnInvalidPolicyIsRefusedAndTheLastGoodOneStays(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	write(t, path, "4")
	if _, diags := policystore.New(filepath.Join(dir, "none"), func() int { return 0 }, hclog.NewNullLogger()); !diags.HasErrors() {
		t.Error("a directory with no policy loaded")
	}
	s, diags := policystore.New(dir, func() int { return 0 }, hclog.NewNullLogger())
	if s == nil {
		t.Fatal(diags)
	}
	var mu sync.Mutex
	var told []string
	s.Reloads = func(took bool, detail string) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, map[bool]string{true: "took: ", false: "refused: "}[took]+detail)
	}
	limit := func() float64 { return s.Current().TenantOf("vision").Limit.Total() }

	write(t, path, `"many"`)
	if s.Reload() || limit() != 4 {
		t.Fatalf("an invalid policy took effect: limit %g", limit())
	}
	write(t, path, "6")
	if !s.Reload() || limit() != 6 {
		t.Fatalf("a valid one did not: limit %g", limit())
	}
	select {
	case <-s.Reloaded():
	default:
		t.Error("no reload signalled")
	}
	mu.Lock()
	if len(told) != 2 || !strings.HasPrefix(told[0], "refused: ") || !strings.Contains(told[0], "policy.hcl:") || !strings.HasPrefix(told[1], "took: ") {
		t.Errorf("told %q", told)
	}
	mu.Unlock()

	// Watch: a change of the files is picked up at the next poll...
	polling, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Watch(polling, nil, 20*time.Millisecond); close(done) }()
	write(t, path, "7")
	waitFor(t, func() bool { return limit() == 7 })
	stop()
	<-done
	// ... and with no poll before the next hour, SIGHUP reads it at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	go s.Watch(ctx, hup, time.Hour)
	write(t, path, "8")
	hup <- nil
	waitFor(t, func() bool { return limit() == 8 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An empty file (a template rendered empty, a write caught halfway) reads as
// a valid policy with no tenants: refused on reload while the one in force
// has tenants, unless the configuration allows it.
func TestAPolicyWithNoTenantsIsRefusedUnlessAllowed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	write(t, path, "4")
	s, diags := policystore.New(dir, func() int { return 0 }, hclog.NewNullLogger())
	if s == nil {
		t.Fatal(diags)
	}
	var told string
	s.Reloads = func(_ bool, detail string) { told = detail }
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if s.Reload() || s.Current().TenantOf("vision") == nil || !strings.Contains(told, "define no tenant, while the policy in force has 1") {
		t.Fatalf("an empty file took effect, or said %q", told)
	}
	s.AllowNoTenants = true
	if !s.Reload() || s.Current().TenantOf("vision") != nil {
		t.Errorf("allowed, the empty policy did not take effect")
	}
}
