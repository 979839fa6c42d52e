// Package nvml is the device-plugin backend for real NVIDIA GPUs, through NVML
// (libnvidia-ml, loaded at run time by github.com/NVIDIA/go-nvml).
package nvml

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
)

// ErrLibraryNotFound means libnvidia-ml could not be loaded: no NVIDIA driver here.
var ErrLibraryNotFound = errors.New("libnvidia-ml is not installed (no NVIDIA driver on this host)")

// Options configures the backend.
type Options struct {
	IgnoredXIDs []int
	// Library is the NVML to use; nil means the host's libnvidia-ml. Tests pass
	// go-nvml's mock servers.
	Library nvml.Interface
}

// Backend reads GPUs through NVML. It is safe for concurrent use.
type Backend struct {
	lib     nvml.Interface
	log     hclog.Logger
	ignored map[uint64]bool

	mu      sync.Mutex
	handles map[string]handle         // by UUID, as of the last Devices call
	gpm     map[string]nvml.GpmSample // a device's last GPM sample, by its UUID
	faults  map[string]string         // GPU UUID → fault seen by the event loop since the last Health call
	lastXID map[string]uint64         // GPU UUID → the last XID an event reported

	events nvml.EventSet
	stop   chan struct{}
	done   chan struct{}
}

// handle is a device's NVML handle; a MIG instance also keeps its parent
// GPU's, and its GPU instance id there (GPM samples an instance by it).
type handle struct {
	dev        nvml.Device
	parentUUID string
	parent     nvml.Device
	instance   int
}

// Open initialises NVML and starts listening for XID and ECC events.
func Open(opts Options, log hclog.Logger) (*Backend, error) {
	lib := opts.Library
	if lib == nil {
		lib = nvml.New()
	}
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, ErrLibraryNotFound
	default:
		return nil, fmt.Errorf("initialise NVML: %w", ret)
	}
	b := &Backend{lib: lib, log: log, ignored: map[uint64]bool{},
		handles: map[string]handle{}, faults: map[string]string{}, lastXID: map[string]uint64{}}
	for _, x := range opts.IgnoredXIDs {
		b.ignored[uint64(x)] = true
	}
	if _, err := b.Devices(context.Background()); err != nil {
		lib.Shutdown()
		return nil, err
	}
	b.startEvents()
	return b, nil
}

// Devices lists every GPU, or the MIG instances of a GPU in MIG mode.
func (b *Backend) Devices(context.Context) ([]gpu.Device, error) {
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", ret)
	}
	driver, _ := b.lib.SystemGetDriverVersion()
	cuda := ""
	if v, ret := b.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		cuda = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	type found struct {
		dev nvml.Device
		gpu.Device
	}
	var gpus []found
	for i := 0; i < count; i++ {
		dev, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			// A lost GPU has no handle; the plugin reports it lost by its absence.
			b.log.Warn("cannot open GPU", "index", i, "error", ret)
			continue
		}
		d, err := describe(dev)
		if err != nil {
			b.log.Warn("cannot read GPU", "index", i, "error", err)
			continue
		}
		d.DriverVersion, d.CUDAVersion, d.Index = driver, cuda, int64(i)
		if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS {
			d.DeviceNodes = []string{fmt.Sprintf("/dev/nvidia%d", minor)}
		}
		gpus = append(gpus, found{dev, d})
	}
	links := make([]nvml.Device, len(gpus))
	described := make([]gpu.Device, len(gpus))
	for i, g := range gpus {
		links[i], described[i] = g.dev, g.Device
	}
	for i, island := range islands(links, described) {
		gpus[i].Island = island
	}
	var out []gpu.Device
	handles := map[string]handle{}
	for _, g := range gpus {
		dev, d := g.dev, g.Device
		if !d.MIG {
			out = append(out, d)
			handles[d.UUID] = handle{dev: dev}
			continue
		}
		for _, m := range migInstances(dev, d) {
			out = append(out, m.Device)
			handles[m.UUID] = handle{dev: m.dev, parentUUID: d.UUID, parent: dev, instance: int(m.GPUInstance)}
		}
	}
	b.mu.Lock()
	b.handles = handles
	b.mu.Unlock()
	return out, nil
}

// describe reads what a jobspec can constrain on; unsupported readings stay Unknown.
func describe(dev nvml.Device) (gpu.Device, error) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return gpu.Device{}, fmt.Errorf("read UUID: %w", ret)
	}
	d := gpu.Device{UUID: uuid, Model: "N/A", MemoryMiB: gpu.Unknown, PowerLimitW: gpu.Unknown,
		PCIeGeneration: gpu.Unknown, PCIeWidth: gpu.Unknown, NUMANode: gpu.Unknown, NVLinkPeers: gpu.Unknown,
		BAR1MiB: gpu.Unknown, CoresClockMHz: gpu.Unknown, MemoryClockMHz: gpu.Unknown, Index: gpu.Unknown, GPUInstance: gpu.Unknown,
		Island: gpu.Unknown, PowerDrawW: gpu.Unknown, CoresClockNowMHz: gpu.Unknown, MemoryClockNowMHz: gpu.Unknown}
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		d.Model = name
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.MemoryMiB = int64(mem.Total >> 20)
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if mw, ret := dev.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		d.PowerLimitW = int64(mw / 1000)
	}
	if g, ret := dev.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS {
		d.PCIeGeneration = int64(g)
	}
	if w, ret := dev.GetMaxPcieLinkWidth(); ret == nvml.SUCCESS {
		d.PCIeWidth = int64(w)
	}
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		d.PCIBusID = SysfsBusID(pci.BusId)
	}
	if n, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS {
		d.NUMANode = int64(n)
	}
	d.NVLinkPeers = activeNVLinks(dev)
	if bar1, ret := dev.GetBAR1MemoryInfo(); ret == nvml.SUCCESS {
		d.BAR1MiB = int64(bar1.Bar1Total >> 20)
	}
	if mhz, ret := dev.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		d.CoresClockMHz = int64(mhz)
	}
	if mhz, ret := dev.GetMaxClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		d.MemoryClockMHz = int64(mhz)
	}
	if mw, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		d.PowerDrawW = int64(mw / 1000)
	}
	if mhz, ret := dev.GetClockInfo(nvml.CLOCK_GRAPHICS); ret == nvml.SUCCESS {
		d.CoresClockNowMHz = int64(mhz)
	}
	if mhz, ret := dev.GetClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		d.MemoryClockNowMHz = int64(mhz)
	}
	if m, ret := dev.GetDisplayMode(); ret == nvml.SUCCESS {
		d.DisplayMode = enabled(m)
	}
	if m, ret := dev.GetPersistenceMode(); ret == nvml.SUCCESS {
		d.PersistenceMode = enabled(m)
	}
	if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
		d.MIG = true
	}
	return d, nil
}

// enabled is an NVML enable state in words.
func enabled(s nvml.EnableState) string {
	if s == nvml.FEATURE_ENABLED {
		return "Enabled"
	}
	return "Disabled"
}

func activeNVLinks(dev nvml.Device) int64 {
	var n int64
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := dev.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if link == 0 {
				return gpu.Unknown
			}
			break
		}
		if state == nvml.FEATURE_ENABLED {
			n++
		}
	}
	return n
}

type migInstance struct {
	gpu.Device
	dev nvml.Device
}

// migInstances lists a MIG-mode GPU's instances as devices of their own; what
// NVML does not report per instance is taken from the parent.
func migInstances(parent nvml.Device, p gpu.Device) []migInstance {
	max, ret := parent.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []migInstance
	for j := 0; j < max; j++ {
		mdev, ret := parent.GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS {
			continue // unused slot
		}
		uuid, ret := mdev.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		m := p
		m.UUID, m.ParentUUID, m.MIG = uuid, p.UUID, true
		if name, ret := mdev.GetName(); ret == nvml.SUCCESS {
			m.Model = name
		}
		if mem, ret := mdev.GetMemoryInfo(); ret == nvml.SUCCESS {
			m.MemoryMiB = int64(mem.Total >> 20)
		}
		if id, ret := mdev.GetGpuInstanceId(); ret == nvml.SUCCESS {
			m.GPUInstance = int64(id)
		}
		out = append(out, migInstance{Device: m, dev: mdev})
	}
	return out
}

// SysfsBusID turns NVML's bus id ("00000000:3B:00.0", NUL-padded) into the form of
// /sys/bus/pci/devices ("0000:3b:00.0"), which Nomad matches for NUMA placement.
func SysfsBusID(raw [32]int8) string {
	var sb strings.Builder
	for _, c := range raw {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	id := strings.ToLower(sb.String())
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) > 4 {
		id = domain[len(domain)-4:] + ":" + rest
	}
	return id
}

// Close stops the event loop and releases NVML.
func (b *Backend) Close() error {
	if b.stop != nil {
		close(b.stop)
		<-b.done
		b.events.Free()
	}
	b.mu.Lock()
	for _, sample := range b.gpm {
		sample.Free()
	}
	b.gpm = nil
	b.mu.Unlock()
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut NVML down: %w", ret)
	}
	return nil
}
