package check_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/check"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// The check drives the real plugin binary over go-plugin as Nomad does:
// with the fake backend it prints the fingerprint, stats and a
// reservation; with no GPU it fails, saying so.
func TestCheckDrivesThePluginOverGoPlugin(t *testing.T) {
	bin := testcluster.PluginBinary(t)
	var out strings.Builder
	err := check.Run(context.Background(), &out, check.Options{Plugin: bin, StatsFor: 2 * time.Second,
		Config: map[string]any{"backend": "fake", "fake": map[string]any{"count": int64(2), "id_prefix": "chk"}}})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"plugin: nomad-device-gpu ", "group nvidia/gpu/NVIDIA H100 80GB HBM3: 2 devices",
		"    memory               81559 MiB", "healthy true", "stats, every second for 2s:", "Memory state 0/81559 MiB",
		"reserve GPU-", "env    NVIDIA_VISIBLE_DEVICES=GPU-", "\nok\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
	out.Reset()
	err = check.Run(context.Background(), &out, check.Options{Plugin: bin, StatsFor: time.Second,
		Config: map[string]any{"backend": "fake", "fake": map[string]any{"count": int64(0)}}})
	if err == nil || !strings.Contains(err.Error(), "no healthy GPU") {
		t.Errorf("no GPU: want a failure, got %v\n%s", err, out.String())
	}
}
