// Package fake is a device-plugin backend of simulated GPUs, for machines without
// one. Tests and the demo drive it at run time through a JSON state file.
package fake

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// Config describes the simulated GPUs.
type Config struct {
	Count     int
	Model     string
	MemoryMiB int64
	IDPrefix  string // keeps UUIDs unique across several clients on one machine
	StateFile string // optional; see State
	Islands   int    // NVLink islands the GPUs are split into, in order (0 or 1: one)
}

// State is what the state file may set for one GPU; absent fields keep their defaults.
type State struct {
	Healthy           *bool  `json:"healthy"`
	HealthDescription string `json:"health_description"`
	UtilizationGPU    *int64 `json:"utilization_gpu"`
	// UtilizationMemory is the share of time memory was read or written
	// (default: the share of memory used); encoder and decoder: 0.
	UtilizationMemory  *int64 `json:"utilization_memory"`
	UtilizationEncoder *int64 `json:"utilization_encoder"`
	UtilizationDecoder *int64 `json:"utilization_decoder"`
	// TensorActive is the share of time tensor cores were busy, which GPUs
	// with GPM (compute capability 9.0 and later) report (default 0); the
	// others report none, whatever the file says.
	TensorActive   *int64 `json:"tensor_active"`
	MemoryUsedMiB  *int64 `json:"memory_used_mib"`
	TemperatureC   *int64 `json:"temperature_c"`
	PowerW         *int64 `json:"power_w"`
	XID            *int64 `json:"xid"`
	ECCCorrected   *int64 `json:"ecc_corrected"`
	ECCUncorrected *int64 `json:"ecc_uncorrected"`
}

// Backend serves simulated GPUs. It is safe for concurrent use.
type Backend struct {
	cfg     Config
	log     hclog.Logger
	devices []gpu.Device

	mu      sync.Mutex
	state   map[string]State
	modTime time.Time
	size    int64
}

// New returns a backend with cfg.Count GPUs whose UUIDs depend only on IDPrefix and index.
func New(cfg Config, log hclog.Logger) *Backend {
	b := &Backend{cfg: cfg, log: log, state: map[string]State{}}
	// One island: every GPU on one NVSwitch fabric, two NUMA nodes (a DGX);
	// several: islands of consecutive GPUs, a NUMA node each.
	islands := max(cfg.Islands, 1)
	islandOf := func(i int) int64 { return int64(i * islands / max(cfg.Count, 1)) }
	size := map[int64]int{}
	for i := 0; i < cfg.Count; i++ {
		size[islandOf(i)]++
	}
	sh := shapeOf(cfg.Model)
	for i := 0; i < cfg.Count; i++ {
		island, numa := islandOf(i), int64(i*2/max(cfg.Count, 1))
		if islands > 1 {
			numa = island
		}
		peers := size[island] - 1
		b.devices = append(b.devices, gpu.Device{
			UUID:              UUID(cfg.IDPrefix, i),
			Model:             cfg.Model,
			MemoryMiB:         cfg.MemoryMiB,
			ComputeCapability: sh.computeCapability,
			DriverVersion:     "550.54.15",
			CUDAVersion:       "12.4",
			PowerLimitW:       sh.powerLimitW,
			PCIeGeneration:    sh.pcieGen,
			PCIeWidth:         16,
			PCIBusID:          fmt.Sprintf("%04x:%02x:00.0", i/256, i%256),
			NUMANode:          numa,
			NVLinkPeers:       int64(peers),
			Island:            island,
			BAR1MiB:           sh.bar1MiB,
			CoresClockMHz:     sh.smMaxMHz,
			MemoryClockMHz:    sh.memMHz,
			PowerDrawW:        sh.idleW,
			CoresClockNowMHz:  sh.smIdleMHz,
			MemoryClockNowMHz: sh.memMHz,
			DisplayMode:       "Disabled",
			PersistenceMode:   "Enabled",
			Index:             int64(i),
			GPUInstance:       gpu.Unknown,
		})
	}
	return b
}

// shape is what a real card of a model reports, idle: the fake GPUs take
// their model's, so that jobspecs tuned on real cards can be tried here.
type shape struct {
	computeCapability                    string
	pcieGen, powerLimitW, idleW, bar1MiB int64
	smMaxMHz, smIdleMHz, memMHz          int64
}

// shapes by a word of the model name; an H100 SXM for any other.
var shapes = []struct {
	word  string
	shape shape
}{
	{"T4", shape{"7.5", 3, 70, 9, 256, 1590, 300, 5000}},
	{"A100", shape{"8.0", 4, 400, 52, 131072, 1410, 210, 1593}},
	{"H100", shape{"9.0", 5, 700, 72, 131072, 1980, 345, 2619}},
}

func shapeOf(model string) shape {
	for _, s := range shapes {
		if strings.Contains(model, s.word) {
			return s.shape
		}
	}
	return shapes[len(shapes)-1].shape
}

// UUID is the deterministic UUID of simulated GPU index under prefix.
func UUID(prefix string, index int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("nomad-gpu-fake/%s/%d", prefix, index)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Devices returns the simulated inventory; it never changes.
func (b *Backend) Devices(context.Context) ([]gpu.Device, error) {
	return b.devices, nil
}

// Health reports each GPU healthy unless the state file says otherwise.
func (b *Backend) Health(context.Context) (map[string]gpu.Health, error) {
	state := b.load()
	out := make(map[string]gpu.Health, len(b.devices))
	for _, d := range b.devices {
		h := gpu.Healthy
		if s, ok := state[d.UUID]; ok && s.Healthy != nil && !*s.Healthy {
			h = gpu.Health{Reason: s.HealthDescription}
			if h.Reason == "" {
				h.Reason = "marked unhealthy in the fake state file"
			}
		}
		out[d.UUID] = h
	}
	return out, nil
}

// Stats reports an idle, cool GPU unless the state file says otherwise.
func (b *Backend) Stats(context.Context) ([]gpu.Stats, error) {
	state := b.load()
	out := make([]gpu.Stats, 0, len(b.devices))
	for _, d := range b.devices {
		st := gpu.Stats{UUID: d.UUID, MemTotalMiB: d.MemoryMiB, TemperatureC: 30, PowerW: 70,
			PowerLimitW: d.PowerLimitW, SMClockMHz: 1980, MemClockMHz: d.MemoryClockMHz, TensorActivePct: gpu.Unknown}
		gpm := d.ComputeCapability >= "9.0" // Hopper and later (one digit each, so far)
		if gpm {
			st.TensorActivePct = 0
		}
		if s, ok := state[d.UUID]; ok {
			set(&st.GPUUtilPct, s.UtilizationGPU)
			set(&st.MemUsedMiB, s.MemoryUsedMiB)
			set(&st.TemperatureC, s.TemperatureC)
			set(&st.PowerW, s.PowerW)
			set(&st.LastXID, s.XID)
			set(&st.ECCCorrected, s.ECCCorrected)
			set(&st.ECCUncorrected, s.ECCUncorrected)
		}
		if st.MemTotalMiB > 0 {
			st.MemUtilPct = st.MemUsedMiB * 100 / st.MemTotalMiB
		}
		if s, ok := state[d.UUID]; ok {
			set(&st.MemUtilPct, s.UtilizationMemory)
			set(&st.EncUtilPct, s.UtilizationEncoder)
			set(&st.DecUtilPct, s.UtilizationDecoder)
			if gpm {
				set(&st.TensorActivePct, s.TensorActive)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// Close releases nothing: the backend holds no resources.
func (b *Backend) Close() error { return nil }

func set(dst *int64, v *int64) {
	if v != nil {
		*dst = *v
	}
}

// load re-reads the state file when it changed. A missing file means all defaults;
// a malformed one is logged and the last good state kept.
func (b *Backend) load() map[string]State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cfg.StateFile == "" {
		return b.state
	}
	fi, err := os.Stat(b.cfg.StateFile)
	if os.IsNotExist(err) {
		b.state, b.modTime, b.size = map[string]State{}, time.Time{}, 0
		return b.state
	}
	if err != nil {
		b.log.Error("cannot read fake state file, keeping the last good state", "path", b.cfg.StateFile, "error", err)
		return b.state
	}
	if fi.ModTime().Equal(b.modTime) && fi.Size() == b.size {
		return b.state
	}
	data, err := os.ReadFile(b.cfg.StateFile)
	if err != nil {
		b.log.Error("cannot read fake state file, keeping the last good state", "path", b.cfg.StateFile, "error", err)
		return b.state
	}
	var next map[string]State
	if err := json.Unmarshal(data, &next); err != nil {
		b.log.Error("malformed fake state file, keeping the last good state", "path", b.cfg.StateFile, "error", err)
		return b.state
	}
	b.state, b.modTime, b.size = next, fi.ModTime(), fi.Size()
	return b.state
}
