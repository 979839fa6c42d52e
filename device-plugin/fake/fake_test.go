package fake_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

func TestUUIDsAreStableAndUniqueAcrossPrefixes(t *testing.T) {
	seen := map[string]bool{}
	for _, prefix := range []string{"", "client-1", "client-2"} {
		b := fake.New(fake.Config{Count: 64, Model: "H100", MemoryMiB: 81559, IDPrefix: prefix}, hclog.NewNullLogger())
		devs, _ := b.Devices(context.Background())
		for i, d := range devs {
			if seen[d.UUID] {
				t.Fatalf("UUID %s repeated", d.UUID)
			}
			seen[d.UUID] = true
			if d.UUID != fake.UUID(prefix, i) {
				t.Fatalf("UUID of %s/%d changed: %s vs %s", prefix, i, d.UUID, fake.UUID(prefix, i))
			}
		}
	}
}

func TestStateFileDrivesHealthAndStats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	b := fake.New(fake.Config{Count: 2, Model: "H100", MemoryMiB: 1000, StateFile: path}, hclog.NewNullLogger())
	ctx := context.Background()
	id0, id1 := fake.UUID("", 0), fake.UUID("", 1)

	h, _ := b.Health(ctx)
	if !h[id0].Healthy || !h[id1].Healthy {
		t.Fatalf("without a state file every GPU must be healthy: %+v", h)
	}

	write(t, path, `{"`+id0+`": {"healthy": false, "health_description": "XID 79", "xid": 79}, "`+id1+`": {"utilization_gpu": 93, "memory_used_mib": 500}}`)
	h, _ = b.Health(ctx)
	if h[id0].Healthy || h[id0].Reason != "XID 79" || !h[id1].Healthy {
		t.Fatalf("state file not applied: %+v", h)
	}
	st, _ := b.Stats(ctx)
	if st[1].GPUUtilPct != 93 || st[1].MemUsedMiB != 500 || st[1].MemUtilPct != 50 || st[0].GPUUtilPct != 0 ||
		st[0].LastXID != 79 || st[1].LastXID != 0 {
		t.Fatalf("stats not applied: %+v", st)
	}

	write(t, path, `{not json`)
	h, _ = b.Health(ctx)
	if h[id0].Healthy {
		t.Fatalf("a malformed state file must keep the last good state, got %+v", h[id0])
	}

	os.Remove(path)
	h, _ = b.Health(ctx)
	if !h[id0].Healthy {
		t.Fatalf("removing the state file must restore the defaults, got %+v", h[id0])
	}
}

// Tensor-core activity is a Hopper GPU's (GPM): an H100 fake reports it, 0
// or the state file's; an A100 fake reports none, whatever the file says.
func TestOnlyHopperFakesReportTensorActivity(t *testing.T) {
	ctx := context.Background()
	for model, want := range map[string][2]int64{"H100": {0, 37}, "A100": {gpu.Unknown, gpu.Unknown}} {
		path := filepath.Join(t.TempDir(), "state.json")
		b := fake.New(fake.Config{Count: 1, Model: "NVIDIA " + model, MemoryMiB: 1000, StateFile: path}, hclog.NewNullLogger())
		st, _ := b.Stats(ctx)
		write(t, path, `{"`+fake.UUID("", 0)+`": {"tensor_active": 37}}`)
		again, _ := b.Stats(ctx)
		if got := [2]int64{st[0].TensorActivePct, again[0].TensorActivePct}; got != want {
			t.Errorf("%s: tensor activity %v (idle, then the file's 37), want %v", model, got, want)
		}
	}
}

// write replaces the file with a new modification time, as an operator's edit would.
func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Duration(len(content)) * time.Second)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
}

// FuzzStateFile: any state file content is applied or refused, never a panic,
// and a refused one keeps the last good state.
func FuzzStateFile(f *testing.F) {
	f.Add(`{"` + fake.UUID("", 0) + `": {"healthy": false, "health_description": "XID 79"}}`)
	f.Add(`{"` + fake.UUID("", 1) + `": {"utilization_gpu": 93, "memory_used_mib": 99999999999}}`)
	f.Add(`{"x": {"utilization_gpu": -5}}`)
	f.Add(`{not json`)
	f.Add(`[]`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(t.TempDir(), "state.json")
		b := fake.New(fake.Config{Count: 2, Model: "H100", MemoryMiB: 1000, StateFile: path}, hclog.NewNullLogger())
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Health(context.Background()); err != nil {
			t.Fatal(err)
		}
		st, err := b.Stats(context.Background())
		if err != nil || len(st) != 2 {
			t.Fatalf("stats %v %v", st, err)
		}
	})
}
