// Package packaging_test builds releases as `make release` does, on a small
// target (the plugin for linux/amd64), and checks what an operator installs.
package packaging_test

import (
	"archive/zip"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// Two releases of one commit are the same bytes, laid out as HashiCorp's:
// a zip holding the binary and the licence, packages named as Debian and RPM
// name them installing it in Nomad's plugin_dir with the licence and the C
// library the binary needs declared, the product's SHA256SUMS and one of
// them all.
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
	pkg := strings.Replace(v, "-", "~", 1) // Debian and RPM order a pre-release before its release with a tilde
	want := []string{"nomad-device-gpu-" + pkg + "-1.x86_64.rpm", "nomad-device-gpu_" + v + "_linux_amd64.zip",
		"nomad-device-gpu_" + pkg + "-1_amd64.deb"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("SHA256SUMS lists %v, want %v", names, want)
	}
	for _, name := range names {
		if sums[name] != again[name] {
			t.Errorf("%s: two releases of one commit differ (%s, then %s)", name, sums[name], again[name])
		}
	}
	for _, sums := range []string{"SHA256SUMS", "nomad-device-gpu_" + v + "_SHA256SUMS"} {
		check := exec.Command("sha256sum", "-c", sums)
		check.Dir = first
		if out, err := check.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != len(want) {
			t.Errorf("sha256sum -c %s: %v\n%s", sums, err, out)
		}
	}

	// The zip: the binary at its top, executable, saying what it is, and
	// the licence.
	zr, err := zip.OpenReader(filepath.Join(first, want[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	if len(zr.File) != 2 || zr.File[0].Name != "nomad-device-gpu" || zr.File[0].Mode().Perm() != 0o755 || zr.File[1].Name != "LICENSE.txt" {
		t.Fatalf("the zip holds %v, want nomad-device-gpu (0755) and LICENSE.txt", zr.File)
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
	contents, err := exec.Command(dpkg, "-c", filepath.Join(first, want[2])).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb -c: %v\n%s", err, contents)
	}
	for _, path := range []string{"./opt/nomad/plugins/nomad-device-gpu", "./etc/nomad.d/nomad-device-gpu.hcl.example",
		"./usr/share/doc/nomad-device-gpu/LICENSE.txt"} {
		if !strings.Contains(string(contents), path) {
			t.Errorf("the deb lacks %s:\n%s", path, contents)
		}
	}
	if !strings.Contains(string(contents), "-rwxr-xr-x root/root") {
		t.Errorf("the deb's plugin is not root's and executable:\n%s", contents)
	}
	// The C library it declares is what the binary asks for: the newest
	// GLIBC symbol version it imports.
	fields, _ := exec.Command(dpkg, "-f", filepath.Join(first, want[2]), "Package", "Version", "Architecture", "Depends").CombinedOutput()
	if got, glibc := string(fields), newestGlibc(t, bin); got != "Package: nomad-device-gpu\nVersion: "+pkg+"-1\nArchitecture: amd64\nDepends: libc6 (>= "+glibc+")\n" {
		t.Errorf("the deb's control fields (the binary needs glibc %s):\n%s", glibc, got)
	}
	// An rpm begins with its lead's magic number (no rpm tool on Debian).
	if rpm, err := os.ReadFile(filepath.Join(first, want[0])); err != nil || !bytes.HasPrefix(rpm, []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Errorf("the rpm is no rpm: %v", err)
	}
}

// newestGlibc is the newest GLIBC_x.y symbol version the ELF binary at path
// imports ("2.34").
func newestGlibc(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	newest := []int{0}
	for _, s := range syms {
		v, ok := strings.CutPrefix(s.Version, "GLIBC_")
		if !ok {
			continue
		}
		var parts []int
		for _, p := range strings.Split(v, ".") {
			n, _ := strconv.Atoi(p)
			parts = append(parts, n)
		}
		if slices.Compare(parts, newest) > 0 {
			newest = parts
		}
	}
	out := make([]string, len(newest))
	for i, n := range newest {
		out[i] = strconv.Itoa(n)
	}
	return strings.Join(out, ".")
}
