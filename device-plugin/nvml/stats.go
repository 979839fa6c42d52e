package nvml

import (
	"context"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// Stats samples every device. A MIG instance has its own memory; NVML's
// utilisation counters are the whole GPU's, so an instance's utilisation
// comes from GPM (Hopper and later), which measures its SMs between two
// samples: each Stats takes one, and reports the share between it and the
// previous. The first, and any where GPM is unsupported, report N/A, never 0.
func (b *Backend) Stats(context.Context) ([]gpu.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]gpu.Stats, 0, len(b.handles))
	for uuid, h := range b.handles {
		s := gpu.UnknownStats(uuid)
		if mem, ret := h.dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.MemUsedMiB, s.MemTotalMiB = int64(mem.Used>>20), int64(mem.Total>>20)
		}
		if h.parentUUID == "" {
			sample(h.dev, &s)
			s.LastXID = int64(b.lastXID[uuid])
		} else {
			s.GPUUtilPct = b.instanceUtil(uuid, h)
			s.LastXID = int64(b.lastXID[h.parentUUID]) // XIDs are the GPU's
		}
		out = append(out, s)
	}
	for uuid, old := range b.gpm { // instances gone (MIG reconfigured)
		if _, ok := b.handles[uuid]; !ok {
			old.Free()
			delete(b.gpm, uuid)
		}
	}
	return out, nil
}

// instanceUtil is a MIG instance's SM utilisation (percent) since the last
// call, by GPM; gpu.Unknown where GPM cannot tell. b.mu is held.
func (b *Backend) instanceUtil(uuid string, h handle) int64 {
	if h.instance < 0 {
		return gpu.Unknown
	}
	if support, ret := h.parent.GpmQueryDeviceSupport(); ret != nvml.SUCCESS || support.IsSupportedDevice == 0 {
		return gpu.Unknown
	}
	now, ret := b.lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		return gpu.Unknown
	}
	if ret := b.lib.GpmMigSampleGet(h.parent, h.instance, now); ret != nvml.SUCCESS {
		now.Free()
		return gpu.Unknown
	}
	if b.gpm == nil {
		b.gpm = map[string]nvml.GpmSample{}
	}
	before, ok := b.gpm[uuid]
	b.gpm[uuid] = now
	if !ok {
		return gpu.Unknown // the first sample: nothing to measure against yet
	}
	defer before.Free()
	get := &nvml.GpmMetricsGetType{NumMetrics: 1, Sample1: before, Sample2: now}
	get.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	if ret := b.lib.GpmMetricsGet(get); ret != nvml.SUCCESS || nvml.Return(get.Metrics[0].NvmlReturn) != nvml.SUCCESS {
		return gpu.Unknown
	}
	return int64(math.Round(get.Metrics[0].Value))
}

func sample(dev nvml.Device, s *gpu.Stats) {
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.GPUUtilPct, s.MemUtilPct = int64(u.Gpu), int64(u.Memory)
	}
	if u, _, ret := dev.GetEncoderUtilization(); ret == nvml.SUCCESS {
		s.EncUtilPct = int64(u)
	}
	if u, _, ret := dev.GetDecoderUtilization(); ret == nvml.SUCCESS {
		s.DecUtilPct = int64(u)
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
	if mhz, ret := dev.GetClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		s.MemClockMHz = int64(mhz)
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		s.ECCCorrected = int64(n)
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		s.ECCUncorrected = int64(n)
	}
}
