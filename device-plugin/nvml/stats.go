package nvml

import (
	"context"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// Stats samples every device. A MIG instance has its own memory, but NVML's
// utilisation counters are the whole GPU's. So an instance's utilisation
// comes from GPM (Hopper and later), which measures between two samples:
// each Stats takes one per device, and reports the share between it and the
// previous. GPM gives tensor-core activity too, of a GPU and of an instance.
// The first sample, and any where GPM is unsupported, report N/A, never 0.
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
			s.TensorActivePct = b.gpmMetrics(uuid, h.dev, wholeGPU, nvml.GPM_METRIC_ANY_TENSOR_UTIL)[0]
		} else {
			if h.instance >= 0 { // its GPU instance id known
				m := b.gpmMetrics(uuid, h.parent, h.instance, nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_ANY_TENSOR_UTIL)
				s.GPUUtilPct, s.TensorActivePct = m[0], m[1]
			}
			s.LastXID = int64(b.lastXID[h.parentUUID]) // XIDs are the GPU's
		}
		out = append(out, s)
	}
	for uuid, old := range b.gpm { // devices gone (MIG reconfigured)
		if _, ok := b.handles[uuid]; !ok {
			old.Free()
			delete(b.gpm, uuid)
		}
	}
	return out, nil
}

// wholeGPU is gpmMetrics' instance for the GPU itself.
const wholeGPU = -1

// gpmMetrics are GPM's metrics (percent) of a GPU (instance wholeGPU) or of
// one of its MIG instances (by its GPU instance id) since the last call for
// the device uuid; gpu.Unknown where GPM cannot tell. b.mu is held.
func (b *Backend) gpmMetrics(uuid string, dev nvml.Device, instance int, metrics ...nvml.GpmMetricId) []int64 {
	out := make([]int64, len(metrics))
	for i := range out {
		out[i] = gpu.Unknown
	}
	if support, ret := dev.GpmQueryDeviceSupport(); ret != nvml.SUCCESS || support.IsSupportedDevice == 0 {
		return out
	}
	now, ret := b.lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		return out
	}
	if instance == wholeGPU {
		ret = b.lib.GpmSampleGet(dev, now)
	} else {
		ret = b.lib.GpmMigSampleGet(dev, instance, now)
	}
	if ret != nvml.SUCCESS {
		now.Free()
		return out
	}
	if b.gpm == nil {
		b.gpm = map[string]nvml.GpmSample{}
	}
	before, ok := b.gpm[uuid]
	b.gpm[uuid] = now
	if !ok {
		return out // the first sample: nothing to measure against yet
	}
	defer before.Free()
	get := &nvml.GpmMetricsGetType{NumMetrics: uint32(len(metrics)), Sample1: before, Sample2: now}
	for i, m := range metrics {
		get.Metrics[i].MetricId = uint32(m)
	}
	if ret := b.lib.GpmMetricsGet(get); ret != nvml.SUCCESS {
		return out
	}
	for i := range metrics {
		if nvml.Return(get.Metrics[i].NvmlReturn) == nvml.SUCCESS {
			out[i] = int64(math.Round(get.Metrics[i].Value))
		}
	}
	return out
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
