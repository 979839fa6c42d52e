// Package packaging_test builds releases as `make release` does, on a small
// target (the plugin for linux/amd64), and checks what an operator installs.
package packaging_test

import (
	"archive/zip"
	"bytes"
	"debug/buildinfo"
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
//   - a zip holding the binary and the licence;
//   - packages named as Debian and RPM name them, installing it in Nomad's
//     own plugin_dir for HashiCorp's data_dir (with a link where earlier
//     packages put it), with the licence and the C library the binary needs
//     declared;
//   - the product's SHA256SUMS, and one of them all.
func TestAReleaseIsReproducibleAndLaidOutAsHashiCorps(t *testing.T) {
	t.Parallel()
	dpkg := tools.Binary(t, "dpkg-deb")
	first, second := t.TempDir(), t.TempDir()
	sums, said := testcluster.ReleaseWith(t, first, "linux/amd64", nil, "zip", "deb", "rpm")
	if !strings.Contains(said, "RELEASE_GPG_KEY is unset: the SHA256SUMS files are not signed") {
		t.Errorf("a release without a key does not say it made no signature:\n%s", said)
	}
	if sigs, _ := filepath.Glob(filepath.Join(first, "*.sig")); len(sigs) != 0 {
		t.Errorf("a release without a key has signatures: %v", sigs)
	}
	gnupg, key := signingKey(t)
	again, _ := testcluster.ReleaseWith(t, second, "linux/amd64", []string{"GNUPGHOME=" + gnupg, "RELEASE_GPG_KEY=" + key}, "zip", "deb", "rpm")

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

	// Each SHA256SUMS of the signed release verifies against its
	// signature, as docs/install.md says; a changed one does not.
	for _, sums := range []string{"SHA256SUMS", "nomad-device-gpu_" + v + "_SHA256SUMS"} {
		verify := exec.Command("gpg", "--verify", sums+".sig", sums)
		verify.Dir, verify.Env = second, append(os.Environ(), "GNUPGHOME="+gnupg)
		if out, err := verify.CombinedOutput(); err != nil || !strings.Contains(string(out), "Good signature") {
			t.Errorf("gpg --verify %s.sig: %v\n%s", sums, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(second, "SHA256SUMS"), []byte("0000  nomad-device-gpu.zip\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	verify := exec.Command("gpg", "--verify", "SHA256SUMS.sig", "SHA256SUMS")
	verify.Dir, verify.Env = second, append(os.Environ(), "GNUPGHOME="+gnupg)
	if out, err := verify.CombinedOutput(); err == nil {
		t.Errorf("a changed SHA256SUMS verifies:\n%s", out)
	}

	// The zip: the binary at its top, executable, saying what it is, the
	// licence and the third-party notices.
	zr, err := zip.OpenReader(filepath.Join(first, want[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	if len(zr.File) != 3 || zr.File[0].Name != "nomad-device-gpu" || zr.File[0].Mode().Perm() != 0o755 || zr.File[1].Name != "LICENSE.txt" ||
		zr.File[2].Name != "THIRD_PARTY_NOTICES.txt" {
		t.Fatalf("the zip holds %v, want nomad-device-gpu (0755), LICENSE.txt and THIRD_PARTY_NOTICES.txt", zr.File)
	}
	bin, b := unzipped(t, zr.File[0])
	_, notices := unzipped(t, zr.File[2])
	checkNotices(t, bin, string(notices))
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
	for _, path := range []string{"./opt/nomad/data/plugins/nomad-device-gpu", "./etc/nomad.d/nomad-device-gpu.hcl.example",
		"./usr/share/doc/nomad-device-gpu/LICENSE.txt", "./usr/share/doc/nomad-device-gpu/THIRD_PARTY_NOTICES.txt",
		"./opt/nomad/plugins/nomad-device-gpu -> /opt/nomad/data/plugins/nomad-device-gpu"} {
		if !strings.Contains(string(contents), path) {
			t.Errorf("the deb lacks %s:\n%s", path, contents)
		}
	}
	if !regexp.MustCompile(`-rwxr-xr-x root/root .* \./opt/nomad/data/plugins/nomad-device-gpu\n`).Match(contents) {
		t.Errorf("the deb's plugin is not root's and executable:\n%s", contents)
	}
	// The C library it declares is the floor the binary keeps
	// (TestThePluginNeedsGlibc217).
	fields, _ := exec.Command(dpkg, "-f", filepath.Join(first, want[2]), "Package", "Version", "Architecture", "Depends").CombinedOutput()
	if got := string(fields); got != "Package: nomad-device-gpu\nVersion: "+pkg+"-1\nArchitecture: amd64\nDepends: libc6 (>= "+glibcFloor+")\n" {
		t.Errorf("the deb's control fields (the binary needs glibc %s):\n%s", glibcFloor, got)
	}
	// An rpm begins with its lead's magic number (no rpm tool on Debian).
	if rpm, err := os.ReadFile(filepath.Join(first, want[0])); err != nil || !bytes.HasPrefix(rpm, []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Errorf("the rpm is no rpm: %v", err)
	}
}

// checkNotices checks that notices name every module linked into bin (its
// build information), and Go, each with its licence, and carry NVIDIA's
// notice from nvml.h, which the plugin compiles in.
func checkNotices(t *testing.T, bin, notices string) {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`(?m)^(\S+|Go \(its standard library and runtime\)) (\S+): ((?:Apache-2\.0|MPL-2\.0|MIT|ISC|BSD-[23]-Clause)(?:, )?)+$`)
	listed := map[string]bool{}
	for _, m := range named.FindAllStringSubmatch(notices, -1) {
		listed[m[1]+" "+m[2]] = true
	}
	want := []string{"Go (its standard library and runtime) " + info.GoVersion}
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		want = append(want, d.Path+" "+d.Version)
	}
	for _, w := range want {
		if !listed[w] {
			t.Errorf("THIRD_PARTY_NOTICES.txt does not name %s with its licence", w)
		}
	}
	if len(want) < 10 || !strings.Contains(notices, "NOTICE TO USER") || !strings.Contains(notices, "Copyright 2009 The Go Authors") {
		t.Errorf("THIRD_PARTY_NOTICES.txt lacks NVIDIA's notice from nvml.h or Go's licence (%d modules)", len(want))
	}
}

// signingKey makes a GPG key without a passphrase in a keyring of its own,
// and returns the keyring's directory and the key's e-mail.
func signingKey(t *testing.T) (string, string) {
	t.Helper()
	gpg := tools.Binary(t, "gpg")
	// Short: gpg-agent's socket goes there, and a socket path has a limit.
	home, err := os.MkdirTemp("", "gpg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kill := exec.Command("gpgconf", "--kill", "gpg-agent")
		kill.Env = append(os.Environ(), "GNUPGHOME="+home)
		_ = kill.Run()
		os.RemoveAll(home)
	})
	const key = "release-test@example.invalid"
	gen := exec.Command(gpg, "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
		"nomad-gpu release test <"+key+">", "ed25519", "sign", "1d")
	gen.Env = append(os.Environ(), "GNUPGHOME="+home)
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gpg --quick-gen-key: %v\n%s", err, out)
	}
	return home, key
}

// glibcFloor is the oldest glibc the plugin runs on (RHEL 7's), which its
// packages declare.
const glibcFloor = "2.17"

// TestThePluginNeedsGlibc217: each released plugin binary (amd64, arm64)
// asks glibc's own loader, no GLIBC symbol version newer than 2.17, and
// libdl and libpthread, where glibc before 2.34 keeps dlopen and
// pthread_create. The amd64 one starts on Debian 11's glibc 2.31 (`make
// tools`), which defines every versioned symbol it imports: a build against
// this machine's glibc without scripts/plugin-flags.sh stops there at once
// ("GLIBC_2.34 not found").
func TestThePluginNeedsGlibc217(t *testing.T) {
	t.Parallel()
	dist := t.TempDir()
	testcluster.ReleaseFor(t, dist, "linux/amd64 linux/arm64", "zip")
	interpreters := map[string]string{"amd64": "/lib64/ld-linux-x86-64.so.2", "arm64": "/lib/ld-linux-aarch64.so.1"}
	for arch, interp := range interpreters {
		zr, err := zip.OpenReader(filepath.Join(dist, "nomad-device-gpu_"+testcluster.ReleaseVersion+"_linux_"+arch+".zip"))
		if err != nil {
			t.Fatal(err)
		}
		bin, b := unzipped(t, zr.File[0])
		zr.Close()
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				got, _ := io.ReadAll(p.Open())
				if string(bytes.TrimRight(got, "\x00")) != interp {
					t.Errorf("%s: interpreter %q, want %q", arch, got, interp)
				}
			}
		}
		libs, _ := f.ImportedLibraries()
		for _, lib := range []string{"libdl.so.2", "libpthread.so.0", "libc.so.6"} {
			if !slices.Contains(libs, lib) {
				t.Errorf("%s: needs %v, not %s", arch, libs, lib)
			}
		}
		if v := newestGlibc(t, f); compareVersions(v, glibcFloor) > 0 {
			t.Errorf("%s: needs GLIBC_%s, newer than the floor %s", arch, v, glibcFloor)
		}
		if arch != "amd64" {
			continue
		}
		old := filepath.Join(tools.File(t, "glibc-2.31"), "lib", "x86_64-linux-gnu")
		defined := map[string]bool{}
		for _, lib := range []string{"libc.so.6", "libdl.so.2", "libpthread.so.0"} {
			lf, err := elf.Open(filepath.Join(old, lib))
			if err != nil {
				t.Fatal(err)
			}
			syms, _ := lf.DynamicSymbols()
			lf.Close()
			for _, s := range syms {
				if s.Section != elf.SHN_UNDEF {
					defined[s.Name+"@"+s.Version] = true
				}
			}
		}
		imported, _ := f.ImportedSymbols()
		for _, s := range imported {
			if strings.HasPrefix(s.Version, "GLIBC_") && !defined[s.Name+"@"+s.Version] {
				t.Errorf("%s: imports %s@%s, which glibc 2.31 does not define", arch, s.Name, s.Version)
			}
		}
		run := exec.Command(filepath.Join(old, "ld-2.31.so"), "--library-path", old, bin, "-version")
		if out, err := run.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "nomad-device-gpu v"+testcluster.ReleaseVersion) {
			t.Errorf("on glibc 2.31: %v\n%s", err, out)
		}
	}
}

// unzipped writes a zip's file out, executable, and returns its path and bytes.
func unzipped(t *testing.T, zf *zip.File) (string, []byte) {
	t.Helper()
	rc, err := zf.Open()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), zf.Name)
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return path, b
}

// compareVersions compares dotted version numbers ("2.3.3" < "2.17").
func compareVersions(a, b string) int {
	parse := func(v string) []int {
		var out []int
		for _, p := range strings.Split(v, ".") {
			n, _ := strconv.Atoi(p)
			out = append(out, n)
		}
		return out
	}
	return slices.Compare(parse(a), parse(b))
}

// newestGlibc is the newest GLIBC_x.y symbol version the ELF binary f
// imports ("2.34").
func newestGlibc(t *testing.T, f *elf.File) string {
	t.Helper()
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	newest := "0"
	for _, s := range syms {
		if v, ok := strings.CutPrefix(s.Version, "GLIBC_"); ok && compareVersions(v, newest) > 0 {
			newest = v
		}
	}
	return newest
}
