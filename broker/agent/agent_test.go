package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/config"
)

// The policy step refuses a broker whose policy is invalid, naming the file
// and line, before anything listens or leads.
func TestSetupPolicyRefusesAnInvalidPolicy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.hcl"), []byte("queue \"training\" {\n  priority = \"high\"\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := New(&config.Config{PolicyDir: dir}, hclog.NewNullLogger(), nil)
	err := a.setupPolicy(context.Background())
	if err == nil || !strings.Contains(err.Error(), "p.hcl:2") {
		t.Fatalf("got %v, want the file and line of the bad value", err)
	}
	if a.policies != nil {
		t.Errorf("a policy store was kept")
	}
}

// The policy step keeps a valid policy and the view it sizes quotas by.
func TestSetupPolicyLoadsAValidPolicy(t *testing.T) {
	dir := t.TempDir()
	src := "queue \"training\" { priority = 60 }\ntenant \"vision\" {\n  namespaces = [\"vision\"]\n  queues = [\"training\"]\n  guaranteed = 1\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.hcl"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	a := New(&config.Config{PolicyDir: dir}, hclog.NewNullLogger(), nil)
	if err := a.setupPolicy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a.view == nil || a.policies.Current().Tenants["vision"] == nil {
		t.Fatalf("view %v, policy %+v", a.view, a.policies.Current())
	}
}
