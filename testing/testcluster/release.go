package testcluster

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// ReleaseVersion is the version the tests' releases carry.
const ReleaseVersion = "0.0.0-test"

// Release runs scripts/release.sh, as `make release` does, into dist for
// the plugin on linux/amd64 in the given formats, and returns the SHA-256
// of each file by name, from its SHA256SUMS. The target is small: the
// plugin's packages share the compile cache with PluginBinary.
func Release(t testing.TB, dist string, formats ...string) map[string]string {
	t.Helper()
	return ReleaseFor(t, dist, "linux/amd64", formats...)
}

// ReleaseFor is Release for platforms ("linux/amd64 linux/arm64").
func ReleaseFor(t testing.TB, dist, platforms string, formats ...string) map[string]string {
	t.Helper()
	sums, _ := ReleaseWith(t, dist, platforms, nil, formats...)
	return sums
}

// ReleaseWith is ReleaseFor with more of release.sh's environment (such as
// RELEASE_GPG_KEY), and what the script printed.
func ReleaseWith(t testing.TB, dist, platforms string, env []string, formats ...string) (map[string]string, string) {
	t.Helper()
	for _, tool := range []string{"zip", "sha256sum", "git"} {
		tools.Binary(t, tool)
	}
	root, err := filepath.Abs(moduleRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "release.sh"))
	// A test runs on a tree with changes; a release refuses one.
	cmd.Env = append(append(os.Environ(), "VERSION="+ReleaseVersion, "DIST="+dist, "PLATFORMS="+platforms,
		"PRODUCTS=nomad-device-gpu", "FORMATS="+strings.Join(formats, " "), "RELEASE_DIRTY=1", "RELEASE_GPG_KEY="), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, out)
	}
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	for sc := bufio.NewScanner(f); sc.Scan(); {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: not `<hash>  <file>`: %q", sc.Text())
		}
		sums[name] = sum
	}
	return sums, string(out)
}

// moduleRoot is the directory of this module's go.mod, above the test's.
func moduleRoot(t testing.TB) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
