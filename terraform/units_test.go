package terraform_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// Stand-ins for the units HashiCorp's nomad and consul packages install:
// only the directives a unit of the module's own used to lose by replacing
// theirs. NOMAD_GPU_PACKAGE_UNITS names a directory holding the packages'
// own nomad.service and consul.service to check against instead.
const (
	packagedNomad = `[Unit]
Description=stand-in for HashiCorp's nomad package's unit
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile=-/etc/nomad.d/nomad.env
ExecStart=/usr/bin/nomad agent -config /etc/nomad.d
KillSignal=SIGINT
OOMScoreAdjust=-1000
LimitNPROC=infinity

[Install]
WantedBy=multi-user.target
`
	packagedConsul = `[Unit]
Description=stand-in for HashiCorp's consul package's unit
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
EnvironmentFile=-/etc/consul.d/consul.env
User=consul
Group=consul
ExecStart=/usr/bin/consul agent -config-dir=/etc/consul.d/

[Install]
WantedBy=multi-user.target
`
)

// checkUnits checks the gpu-node module's systemd files (its outputs, out)
// as systemd reads them: each drop-in on the package's unit and on the
// module's own, accepted by systemd-analyze verify, and setting nothing but
// what the clients need, so that the rest of the package's unit stays.
func checkUnits(t *testing.T, out map[string]json.RawMessage) {
	analyze := tools.Binary(t, "systemd-analyze")
	packaged := map[string]string{"nomad": packagedNomad, "consul": packagedConsul}
	if dir := os.Getenv("NOMAD_GPU_PACKAGE_UNITS"); dir != "" {
		for name := range packaged {
			b, err := os.ReadFile(filepath.Join(dir, name+".service"))
			if err != nil {
				t.Fatal(err)
			}
			packaged[name] = string(b)
		}
	}
	allowed := map[string]bool{"[Unit]": true, "[Service]": true, "After": true, "ExecStart": true}
	for name, pkg := range packaged {
		dropin := str(t, out[name+"_dropin"])
		for _, line := range strings.Split(dropin, "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if key, _, _ := strings.Cut(line, "="); !allowed[key] {
				t.Errorf("%s's drop-in sets %q: it would change what the package's unit says", name, line)
			}
		}
		for what, unit := range map[string]string{"the package's unit": pkg, "the module's own unit": str(t, out[name+"_service"])} {
			if msg, err := verifyUnit(t, analyze, name, unit, dropin); err != nil {
				t.Errorf("%s's drop-in on %s: systemd-analyze verify: %v\n%s", name, what, err, msg)
			}
		}
		// The check can fail: without the emptying ExecStart= line the
		// service would have two, which systemd refuses.
		if _, err := verifyUnit(t, analyze, name, pkg, strings.Replace(dropin, "ExecStart=\n", "", 1)); err == nil {
			t.Errorf("%s: systemd-analyze verify accepted a drop-in that adds a second ExecStart", name)
		}
	}
}

// verifyUnit runs systemd-analyze verify on unit name, as a vendor's unit in
// /usr/lib/systemd/system with dropin under /etc/systemd/system, in a root
// of its own that has the targets and commands they name.
func verifyUnit(t *testing.T, analyze, name, unit, dropin string) (string, error) {
	t.Helper()
	root := t.TempDir()
	vendor := filepath.Join(root, "usr", "lib", "systemd", "system")
	dropins := filepath.Join(root, "etc", "systemd", "system", name+".service.d")
	for _, d := range []string{vendor, dropins, filepath.Join(root, "usr", "bin"), filepath.Join(root, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range []string{"sysinit", "basic", "shutdown", "multi-user", "network-online"} {
		write(t, filepath.Join(vendor, target+".target"), "[Unit]\nDescription="+target+"\n")
	}
	for _, command := range []string{"usr/bin/nomad", "usr/bin/consul", "bin/kill"} {
		if err := os.WriteFile(filepath.Join(root, command), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(vendor, name+".service"), unit)
	write(t, filepath.Join(dropins, "nomad-gpu.conf"), dropin)
	b, err := exec.Command(analyze, "verify", "--root="+root, "--man=no", name+".service").CombinedOutput()
	return string(b), err
}
