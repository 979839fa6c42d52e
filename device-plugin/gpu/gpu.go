// Package gpu holds the domain types of the device plugin: what a GPU is, how
// healthy it is and what it is doing, independent of NVML, gRPC and Nomad.
package gpu

import (
	"fmt"
	"strings"
)

// Vendor and Type are the first two parts of the device group name: jobs ask for
// devices as "nvidia/gpu" or "nvidia/gpu/<model>".
const (
	Vendor = "nvidia"
	Type   = "gpu"
)

// Unknown marks a numeric reading the hardware could not give.
const Unknown = -1

// Device is one schedulable GPU, or one MIG instance of a GPU.
type Device struct {
	UUID              string
	Model             string // the device group name
	MemoryMiB         int64
	ComputeCapability string // "9.0"
	DriverVersion     string
	CUDAVersion       string // highest CUDA version the driver supports, "12.4"
	PowerLimitW       int64
	PCIeGeneration    int64
	PCIeWidth         int64
	PCIBusID          string // sysfs form, lower case: "0000:3b:00.0"
	NUMANode          int64
	NVLinkPeers       int64 // active NVLink connections
	BAR1MiB           int64 // BAR1 memory
	CoresClockMHz     int64 // highest SM clock
	MemoryClockMHz    int64 // highest memory clock
	// The readings nomad-device-nvidia reports under its names: the power
	// drawn and the graphics and memory clocks when the GPU was first
	// fingerprinted (kept after, or every fingerprint would differ).
	PowerDrawW        int64
	CoresClockNowMHz  int64
	MemoryClockNowMHz int64
	DisplayMode       string // "Enabled" or "Disabled" ("": unknown)
	PersistenceMode   string // "Enabled" or "Disabled" ("": unknown)
	MIG               bool   // a MIG instance, or a GPU with MIG mode on
	ParentUUID        string // for a MIG instance: the GPU it is carved from
	// Index is the GPU's index on its host as NVML and nvidia-smi number
	// it (a MIG instance: its GPU's); Unknown when not known.
	Index int64
	// GPUInstance is a MIG instance's GPU instance id (Unknown otherwise).
	GPUInstance int64
	// Island numbers the host's NVLink islands (GPUs linked to each other
	// or to one NVSwitch fabric; a GPU without NVLink: its NUMA node's),
	// from 0 in PCI order; a MIG instance: its GPU's. Unknown when NVML
	// cannot tell.
	Island      int64
	DeviceNodes []string // host device files the device needs, e.g. /dev/nvidia3
}

// GPUUUID is the UUID of the physical GPU: a MIG instance's parent.
func (d Device) GPUUUID() string {
	if d.ParentUUID != "" {
		return d.ParentUUID
	}
	return d.UUID
}

// MIGProfile is a MIG instance's profile, as NVML ends its name
// ("NVIDIA H100 80GB HBM3 MIG 3g.40gb": "3g.40gb"); "" for a whole GPU.
func (d Device) MIGProfile() string {
	if d.ParentUUID == "" {
		return ""
	}
	if i := strings.LastIndex(d.Model, " MIG "); i >= 0 {
		return d.Model[i+len(" MIG "):]
	}
	return ""
}

// Health is a device's condition: Reason says why it is not healthy.
type Health struct {
	Healthy bool
	Reason  string
}

// Healthy is the condition of a device with nothing wrong.
var Healthy = Health{Healthy: true}

// Stats is one sample of a device's activity; fields are Unknown when unreadable.
type Stats struct {
	UUID       string
	GPUUtilPct int64
	// MemUtilPct is the share of time device memory was read or written
	// (NVML's memory utilisation, DCGM's memory copy utilisation).
	MemUtilPct int64
	EncUtilPct int64 // video encoder
	DecUtilPct int64 // video decoder
	// TensorActivePct is the share of time any tensor core was busy, from
	// GPM (Hopper and later; Unknown elsewhere): DCGM's profiling field
	// PIPE_TENSOR_ACTIVE.
	TensorActivePct int64
	MemUsedMiB      int64
	MemTotalMiB     int64
	TemperatureC    int64
	PowerW          int64
	PowerLimitW     int64
	SMClockMHz      int64
	MemClockMHz     int64
	// LastXID is the last XID error the driver reported for the GPU since
	// the plugin started, application XIDs included; 0: none.
	LastXID        int64
	ECCCorrected   int64
	ECCUncorrected int64
}

// UnknownStats is a sample in which nothing could be read.
func UnknownStats(uuid string) Stats {
	return Stats{UUID: uuid, GPUUtilPct: Unknown, MemUtilPct: Unknown, EncUtilPct: Unknown, DecUtilPct: Unknown, TensorActivePct: Unknown, MemUsedMiB: Unknown,
		MemTotalMiB: Unknown, TemperatureC: Unknown, PowerW: Unknown, PowerLimitW: Unknown,
		SMClockMHz: Unknown, MemClockMHz: Unknown, LastXID: Unknown, ECCCorrected: Unknown, ECCUncorrected: Unknown}
}

// ReplicaID is the id of replica i of a shared GPU: Nomad takes any string
// as a device id, and this one names its GPU.
func ReplicaID(uuid string, i int) string { return fmt.Sprintf("%s-%d", uuid, i) }

// SharedGroup is the device group name of a model's time-sliced replicas:
// a job asks for them as nvidia/gpu/<model> (shared), or by the shared
// attribute.
func SharedGroup(model string) string { return model + " (shared)" }

// IslandGroup is the device group name of a model's GPUs on NVLink island
// island, when the plugin groups by island.
func IslandGroup(model string, island int64) string {
	return fmt.Sprintf("%s (island %d)", model, island)
}
