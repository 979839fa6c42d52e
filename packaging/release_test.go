// Package packaging_test builds releases as `make release` does, on a small
// target (the plugin for linux/amd64), and checks what an operator installs.
package packaging_test

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// Two releases of one commit are the same bytes, laid out as HashiCorp's:
// a zip holding the binary alone, packages installing it in Nomad's
// plugin_dir, and SHA256SUMS of them all.
func TestAReleaseIsReproducibleAndLaidOutAsHashiCorps(t *testing.T) {
	t.Parallel()
	dpkg := tools.Binary(t, "dpkg-deb")
	first, second := t.TempDir(), t.TempDir()
	sums := testcluster.Release(t, first, "zip", "deb", "rpm")
	again := testcluster.Release(t, second, "zip", "deb", "rpm")

	v := testcluster.ReleaseVersion
	var names []string
	for name := range sums {
		names = append(names, name)
	}
	sort.Strings(names)
	want := []string{"nomad-device-gpu_" + v + "_linux_amd64.deb", "nomad-device-gpu_" + v + "_linux_amd64.rpm",
		"nomad-device-gpu_" + v + "_linux_amd64.zip"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("SHA256SUMS lists %v, want %v", names, want)
	}
	for _, name := range names {
		if sums[name] != again[name] {
			t.Errorf("%s: two releases of one commit differ (%s, then %s)", name, sums[name], again[name])
		}
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = first
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}

	// The zip: the binary alone at its top, executable, saying what it is.
	zr, err := zip.OpenReader(filepath.Join(first, want[2]))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	if len(zr.File) != 1 || zr.File[0].Name != "nomad-device-gpu" || zr.File[0].Mode().Perm() != 0o755 {
		t.Fatalf("the zip holds %v, want nomad-device-gpu (0755) alone", zr.File)
	}
	rc, err := zr.File[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nomad-device-gpu")
	b, _ := io.ReadAll(rc)
	rc.Close()
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-version").CombinedOutput()
	wantVersion := regexp.MustCompile(`^nomad-device-gpu v` + regexp.QuoteMeta(v) + ` \(commit [0-9a-f]{40}, ` +
		regexp.QuoteMeta(runtime.Version()) + `\)\n$`)
	if err != nil || !wantVersion.Match(out) {
		t.Errorf("nomad-device-gpu -version: %v: %q, want %s", err, out, wantVersion)
	}
	if bytes.Contains(b, []byte(first)) || bytes.Contains(b, []byte(os.Getenv("HOME")+"/")) {
		t.Errorf("the binary names a build path (not -trimpath)")
	}

	// The deb installs the plugin into the plugin_dir of the example
	// client configuration and terraform/modules/gpu-node.
	contents, err := exec.Command(dpkg, "-c", filepath.Join(first, want[0])).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb -c: %v\n%s", err, contents)
	}
	for _, path := range []string{"./opt/nomad/plugins/nomad-device-gpu", "./etc/nomad.d/nomad-device-gpu.hcl.example"} {
		if !strings.Contains(string(contents), path) {
			t.Errorf("the deb lacks %s:\n%s", path, contents)
		}
	}
	if !strings.Contains(string(contents), "-rwxr-xr-x root/root") {
		t.Errorf("the deb's plugin is not root's and executable:\n%s", contents)
	}
	fields, _ := exec.Command(dpkg, "-f", filepath.Join(first, want[0]), "Package", "Version", "Architecture").CombinedOutput()
	// Debian orders a pre-release before its release with a tilde.
	if got := string(fields); got != "Package: nomad-device-gpu\nVersion: "+strings.Replace(v, "-", "~", 1)+"\nArchitecture: amd64\n" {
		t.Errorf("the deb's control fields:\n%s", got)
	}
	// An rpm begins with its lead's magic number (no rpm tool on Debian).
	if rpm, err := os.ReadFile(filepath.Join(first, want[1])); err != nil || !bytes.HasPrefix(rpm, []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Errorf("the rpm is no rpm: %v", err)
	}
}
