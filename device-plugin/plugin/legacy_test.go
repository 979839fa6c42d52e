package plugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeFiles writes name → content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A client config directory written for nomad-device-nvidia: its plugin
// block's options apply unless our own block sets them, and the warnings say
// what was applied, what was not, and what to rename.
func TestANomadDeviceNvidiaBlockIsApplied(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"client.hcl": `client {
  enabled = true
}
plugin "nomad-device-nvidia" {
  config {
    enabled            = true
    ignored_gpu_ids    = ["GPU-aaaa", "GPU-bbbb"]
    fingerprint_period = "30s"
    mig_mode           = true
  }
}
`,
		"gpu.json":  `{"plugin": {"nomad-device-gpu": {"config": {"fingerprint_period": "10s"}}}}`,
		"notes.txt": `plugin "nomad-device-nvidia" { config { enabled = false } }`,
		// HCL 1, which HCL 2 does not read: Nomad's agent config is HCL 1.
		"hcl1.hcl": "client {\n  options {\n    \"driver.raw_exec.enable\" = \"1\"\n  }\n}\n",
	})
	blocks, errs := agentPlugins([]string{"/usr/bin/nomad", "agent", "-config", dir}, "/")
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	cfg := DefaultConfig()
	cfg.FingerprintPeriod = "10s" // as Nomad decodes our own block
	got, notes, err := adoptNDN(cfg, blocks, Name, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.IgnoredGPUIDs, []string{"GPU-aaaa", "GPU-bbbb"}) || got.FingerprintPeriod != "10s" || !got.Enabled {
		t.Errorf("config: ignored %v, fingerprint_period %q, enabled %v; want the two ids, 10s (ours), true", got.IgnoredGPUIDs, got.FingerprintPeriod, got.Enabled)
	}
	all := strings.Join(notes, "\n")
	for _, want := range []string{
		`plugin "nomad-device-nvidia" block (` + filepath.Join(dir, "client.hcl") + `:4) is applied to nomad-device-gpu, which replaces it: rename it to plugin "nomad-device-gpu"`,
		`option fingerprint_period (` + filepath.Join(dir, "client.hcl") + `:8) is ignored: plugin "nomad-device-gpu" sets it`,
		`option mig_mode (` + filepath.Join(dir, "client.hcl") + `:9) is not one of nomad-device-nvidia's, and is ignored`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("notes lack %q:\n%s", want, all)
		}
	}
}

func TestANomadDeviceNvidiaBlockIsReadAsNomadReadsConfigs(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"agent.hcl": `plugin "nomad-device-nvidia" {
  config {
    ignored_gpu_ids = ["GPU-cccc"]
  }
}
`,
		"bad.hcl": "client {\n  enabled = \nplugin \"nomad-device-nvidia\" {}\n",
		"wrong.hcl": `plugin "nomad-device-nvidia" {
  config {
    ignored_gpu_ids = 3
  }
}
`,
	})
	t.Run("a relative -config= file", func(t *testing.T) {
		blocks, errs := agentPlugins([]string{"nomad", "agent", "-config=agent.hcl"}, dir)
		got, _, err := adoptNDN(DefaultConfig(), blocks, Name, false)
		if len(errs) != 0 || err != nil || !slices.Equal(got.IgnoredGPUIDs, []string{"GPU-cccc"}) {
			t.Errorf("ignored %v, errors %v %v", got.IgnoredGPUIDs, errs, err)
		}
	})
	t.Run("a file that does not parse is an error naming it", func(t *testing.T) {
		_, errs := agentPlugins([]string{"nomad", "agent", "--config", filepath.Join(dir, "bad.hcl")}, "/")
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "bad.hcl") {
			t.Errorf("errors %v, want one naming bad.hcl", errs)
		}
	})
	t.Run("a value of the wrong type is refused with its place", func(t *testing.T) {
		blocks, _ := agentPlugins([]string{"nomad", "agent", "-config", filepath.Join(dir, "wrong.hcl")}, "/")
		_, _, err := adoptNDN(DefaultConfig(), blocks, Name, false)
		if err == nil || !strings.Contains(err.Error(), `option ignored_gpu_ids (`+filepath.Join(dir, "wrong.hcl")+`:3)`) {
			t.Errorf("error %v, want one naming ignored_gpu_ids at wrong.hcl:3", err)
		}
	})
	t.Run("beside nomad-device-nvidia's binary the block is its own", func(t *testing.T) {
		blocks, _ := agentPlugins([]string{"nomad", "agent", "-config", filepath.Join(dir, "agent.hcl")}, "/")
		got, notes, err := adoptNDN(DefaultConfig(), blocks, Name, true)
		if err != nil || len(got.IgnoredGPUIDs) != 0 || len(notes) != 1 || !strings.Contains(notes[0], "both report the same NVIDIA GPUs") {
			t.Errorf("ignored %v, notes %q, error %v", got.IgnoredGPUIDs, notes, err)
		}
	})
	t.Run("installed under nomad-device-nvidia's name the block is its own, from Nomad", func(t *testing.T) {
		blocks, _ := agentPlugins([]string{"nomad", "agent", "-config", filepath.Join(dir, "agent.hcl")}, "/")
		got, notes, err := adoptNDN(DefaultConfig(), blocks, NDNName, false)
		if err != nil || len(got.IgnoredGPUIDs) != 0 || len(notes) != 0 {
			t.Errorf("ignored %v, notes %q, error %v; want the config untouched and nothing said", got.IgnoredGPUIDs, notes, err)
		}
	})
	t.Run("not an agent", func(t *testing.T) {
		if blocks, errs := agentPlugins([]string{"go", "test", "-config", dir}, "/"); len(blocks) != 0 || len(errs) != 0 {
			t.Errorf("blocks %v, errors %v", blocks, errs)
		}
	})
}

// nomad-device-nvidia's binary is beside this one only when a file of its
// name is another file: installed under that name, the plugin finds itself.
func TestNDNBesideIsAnotherFileOfItsName(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{Name, NDNName} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !ndnBeside(filepath.Join(dir, Name), os.Stat) {
		t.Errorf("nomad-device-gpu beside nomad-device-nvidia: not seen")
	}
	if ndnBeside(filepath.Join(dir, NDNName), os.Stat) {
		t.Errorf("the plugin installed as nomad-device-nvidia finds itself beside itself")
	}
	alone := t.TempDir()
	if err := os.Link(filepath.Join(dir, Name), filepath.Join(alone, NDNName)); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, Name), filepath.Join(alone, Name)); err != nil {
		t.Fatal(err)
	}
	if ndnBeside(filepath.Join(alone, Name), os.Stat) {
		t.Errorf("one binary under both names (hard links) counts as two")
	}
}
