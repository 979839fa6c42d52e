package plugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
)

var benchSizes = []int{8, 64, 1024}

func benchBackend(n int) *fake.Backend {
	return fake.New(fake.Config{Count: n, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, IDPrefix: "bench"}, hclog.NewNullLogger())
}

// BenchmarkFingerprint is the cost of one fingerprint period: scan, health
// tracking, building the message and comparing it with the last one sent.
func BenchmarkFingerprint(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			if err := cfg.Validate(); err != nil {
				b.Fatal(err)
			}
			s := newScanner(cfg, benchBackend(n), hclog.NewNullLogger())
			ctx, now := context.Background(), time.Now()
			last, _ := s.scan(ctx, now)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, _ := s.scan(ctx, now)
				if !equalFingerprint(last, resp) {
					b.Fatal("fingerprint changed")
				}
			}
		})
	}
}

// BenchmarkStats is the cost of one stats period: sampling and building the message.
func BenchmarkStats(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			backend := benchBackend(n)
			devices, _ := backend.Devices(context.Background())
			inventory := map[string]offer{}
			for _, d := range devices {
				inventory[d.UUID] = offer{ID: d.UUID, Group: d.Model, Device: d}
			}
			ctx, now := context.Background(), time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				samples, _ := backend.Stats(ctx)
				if resp := statsResponse(inventory, samples, now); len(resp.Groups[0].InstanceStats) != n {
					b.Fatal("stats incomplete")
				}
			}
		})
	}
}
