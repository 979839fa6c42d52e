package nvml

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// Stats samples every device. NVML has no activity counters for a MIG instance,
// so only its memory is reported.
func (b *Backend) Stats(context.Context) ([]gpu.Stats, error) {
	b.mu.Lock()
	handles := b.handles
	b.mu.Unlock()
	out := make([]gpu.Stats, 0, len(handles))
	for uuid, h := range handles {
		s := gpu.UnknownStats(uuid)
		if mem, ret := h.dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.MemUsedMiB, s.MemTotalMiB = int64(mem.Used>>20), int64(mem.Total>>20)
		}
		if h.parentUUID == "" {
			sample(h.dev, &s)
		}
		out = append(out, s)
	}
	return out, nil
}

func sample(dev nvml.Device, s *gpu.Stats) {
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.GPUUtilPct, s.MemUtilPct = int64(u.Gpu), int64(u.Memory)
	}
	if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TemperatureC = int64(t)
	}
	if mw, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		s.PowerW = int64(mw / 1000)
	}
	if mw, ret := dev.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		s.PowerLimitW = int64(mw / 1000)
	}
	if mhz, ret := dev.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		s.SMClockMHz = int64(mhz)
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		s.ECCCorrected = int64(n)
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		s.ECCUncorrected = int64(n)
	}
}
