// Package tools finds what `make tools` builds and keeps for tests (the
// agents, OpenTofu, parts of Nomad's source) or what the machine has on its
// PATH. A test that lacks one is skipped locally and fails in CI (CI=true),
// where a skip would hide it.
package tools

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Dir is where `make tools` puts what it builds and keeps.
func Dir() string {
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "nomad-gpu", "tools")
}

// Binary returns the path of a tool built by `make tools`. Without it the test
// is skipped locally, but fails in CI (CI=true), where a skip would hide it.
func Binary(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skip("integration test: needs real agents, skipped with -short (never in CI)")
	}
	path := filepath.Join(Dir(), "bin", name)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found in %s or PATH: run `make tools`", name, filepath.Dir(path))
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// File returns the path of a file `make tools` keeps under Dir
// (rel, slash-separated). Without it the test is skipped locally, but fails
// in CI (CI=true).
func File(t testing.TB, rel string) string {
	t.Helper()
	path := filepath.Join(Dir(), filepath.FromSlash(rel))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found: run `make tools`", path)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
