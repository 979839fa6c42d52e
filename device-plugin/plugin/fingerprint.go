package plugin

import (
	"context"
	"sort"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
	structspb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/structs"
)

// lostReason is the health description of a GPU the backend no longer reports.
const lostReason = "GPU lost: no longer reported by the driver"

// scanner builds fingerprints: inventory and raw health from the backend, the
// ignore list, lost-GPU detection and health hysteresis.
type scanner struct {
	backend Backend
	log     hclog.Logger
	tracker *gpu.HealthTracker
	ignored map[string]bool
	known   map[string]gpu.Device // every device seen since start, so a lost one stays visible
	sharing SharingConfig
	// islandGroups: a whole GPU's group is its model's on its island.
	islandGroups bool
}

// offer is one device Nomad is offered: a whole GPU, or a time-sliced
// replica of one (its health and stats are its GPU's).
type offer struct {
	ID, Group string
	Device    gpu.Device
}

func newScanner(cfg Config, backend Backend, log hclog.Logger) *scanner {
	ignored := map[string]bool{}
	for _, id := range cfg.IgnoredGPUIDs {
		ignored[id] = true
	}
	return &scanner{backend: backend, log: log, tracker: gpu.NewHealthTracker(cfg.HealthRecoveryAfter()),
		ignored: ignored, known: map[string]gpu.Device{}, sharing: cfg.Sharing, islandGroups: cfg.IslandGroups}
}

// shared is the set of GPUs offered as replicas: the first sharing.gpus (0:
// all) by PCI bus id, MIG devices never (time-slicing does not apply to them).
func (s *scanner) shared() map[string]bool {
	out := map[string]bool{}
	if s.sharing.Replicas < 2 {
		return out
	}
	var whole []gpu.Device
	for _, d := range s.known {
		if !d.MIG {
			whole = append(whole, d)
		}
	}
	sort.Slice(whole, func(i, j int) bool { return whole[i].PCIBusID+whole[i].UUID < whole[j].PCIBusID+whole[j].UUID })
	for i, d := range whole {
		if s.sharing.GPUs == 0 || i < s.sharing.GPUs {
			out[d.UUID] = true
		}
	}
	return out
}

// scan returns the fingerprint to send and the devices it offers.
func (s *scanner) scan(ctx context.Context, now time.Time) (*devicepb.FingerprintResponse, []offer) {
	present := map[string]bool{}
	devices, err := s.backend.Devices(ctx)
	unreadable := ""
	if err != nil {
		s.log.Warn("cannot list GPUs, reporting the known ones unhealthy", "error", err)
		unreadable = "cannot read GPU: " + err.Error()
	}
	for _, d := range devices {
		if s.ignored[d.UUID] {
			continue
		}
		present[d.UUID] = true
		if k, ok := s.known[d.UUID]; ok { // the first fingerprint's readings: moving ones would change every fingerprint
			d.PowerDrawW, d.CoresClockNowMHz, d.MemoryClockNowMHz = k.PowerDrawW, k.CoresClockNowMHz, k.MemoryClockNowMHz
		}
		s.known[d.UUID] = d
	}
	health, err := s.backend.Health(ctx)
	if err != nil && unreadable == "" {
		s.log.Warn("cannot check GPU health, reporting GPUs unhealthy", "error", err)
		unreadable = "cannot check GPU health: " + err.Error()
	}

	listed := make([]offer, 0, len(s.known))
	groups := map[string]*devicepb.DeviceGroup{}
	shared := s.shared()
	for _, uuid := range sortedKeys(s.known) {
		d := s.known[uuid]
		raw, ok := health[uuid]
		switch {
		case unreadable != "":
			raw = gpu.Health{Reason: unreadable}
		case !present[uuid]:
			raw = gpu.Health{Reason: lostReason}
		case !ok:
			raw = gpu.Healthy
		}
		h := s.tracker.Observe(now, uuid, raw)
		name, ids := d.Model, []string{d.UUID}
		if s.islandGroups && !d.MIG && d.Island != gpu.Unknown {
			name = gpu.IslandGroup(d.Model, d.Island)
		}
		if shared[uuid] {
			name, ids = gpu.SharedGroup(d.Model), nil
			for i := 0; i < s.sharing.Replicas; i++ {
				ids = append(ids, gpu.ReplicaID(uuid, i))
			}
		}
		g, ok := groups[name]
		if !ok {
			g = &devicepb.DeviceGroup{Vendor: gpu.Vendor, DeviceType: gpu.Type, DeviceName: name, Attributes: attributes(d, shared[uuid], s.sharing.Replicas)}
			if name == gpu.IslandGroup(d.Model, d.Island) {
				g.Attributes["island"] = &structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: d.Island}}
				g.Attributes["model"] = &structspb.Attribute{Value: &structspb.Attribute_StringVal{StringVal: d.Model}}
			}
			groups[name] = g
		}
		for _, id := range ids {
			g.Devices = append(g.Devices, &devicepb.DetectedDevice{
				ID: id, Healthy: h.Healthy, HealthDescription: h.Reason,
				HwLocality: &devicepb.DeviceLocality{PciBusId: d.PCIBusID},
			})
			listed = append(listed, offer{ID: id, Group: name, Device: d})
		}
	}
	resp := &devicepb.FingerprintResponse{}
	for _, model := range sortedKeys(groups) {
		resp.DeviceGroup = append(resp.DeviceGroup, groups[model])
	}
	return resp, listed
}

// attributes are what a jobspec can constrain on, taken from the group's
// first device; shared says whether its devices are replicas (of replicas).
func attributes(d gpu.Device, shared bool, replicas int) map[string]*structspb.Attribute {
	attrs := map[string]*structspb.Attribute{}
	intAttr := func(key string, v int64, unit string) {
		if v >= 0 {
			attrs[key] = &structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: v}, Unit: unit}
		}
	}
	strAttr := func(key, v string) {
		if v != "" {
			attrs[key] = &structspb.Attribute{Value: &structspb.Attribute_StringVal{StringVal: v}}
		}
	}
	boolAttr := func(key, state string) {
		if state != "" {
			attrs[key] = &structspb.Attribute{Value: &structspb.Attribute_BoolVal{BoolVal: state == "Enabled"}}
		}
	}
	intAttr("memory", d.MemoryMiB, "MiB")
	intAttr("power_limit", d.PowerLimitW, "W")
	intAttr("pcie_generation", d.PCIeGeneration, "")
	intAttr("pcie_width", d.PCIeWidth, "")
	intAttr("nvlink_peers", d.NVLinkPeers, "")
	strAttr("compute_capability", d.ComputeCapability)
	strAttr("driver_version", d.DriverVersion)
	strAttr("cuda_version", d.CUDAVersion)
	intAttr("cores_clock_max", d.CoresClockMHz, "MHz")
	intAttr("memory_clock_max", d.MemoryClockMHz, "MHz")
	if d.PCIeGeneration > 0 && d.PCIeWidth > 0 {
		intAttr("pcie_bandwidth", pciLaneMBps(d.PCIeGeneration)*d.PCIeWidth, "MB/s")
		// nomad-device-nvidia's figure: a round rate per lane from gen 3 on, 0 below.
		intAttr("pci_bandwidth", ndnLaneMBps(d.PCIeGeneration)*d.PCIeWidth, "MB/s")
	}
	boolAttr("display_enabled", d.DisplayMode)
	boolAttr("persistence_enabled", d.PersistenceMode)
	// nomad-device-nvidia's attributes, under its names and units and with
	// its values (v1.1.0), so that jobspecs tuned on it place unchanged.
	intAttr("power", d.PowerDrawW, "W")
	intAttr("bar1", d.BAR1MiB, "MiB")
	intAttr("cores_clock", d.CoresClockNowMHz, "MHz")
	intAttr("memory_clock", d.MemoryClockNowMHz, "MHz")
	strAttr("display_state", ndnEnableState(d.DisplayMode))
	strAttr("persistence_mode", ndnEnableState(d.PersistenceMode))
	attrs["mig"] = &structspb.Attribute{Value: &structspb.Attribute_BoolVal{BoolVal: d.MIG}}
	attrs["shared"] = &structspb.Attribute{Value: &structspb.Attribute_BoolVal{BoolVal: shared}}
	if shared {
		intAttr("replicas", int64(replicas), "")
	}
	return attrs
}

// pciLaneMBps is one PCIe lane's throughput in MB/s at generation gen,
// after line encoding (8b/10b up to gen 2, 128b/130b from gen 3); a
// generation above the table is taken as the last one known.
func pciLaneMBps(gen int64) int64 {
	lane := []int64{0, 250, 500, 985, 1969, 3938, 7877}
	return lane[min(gen, int64(len(lane)-1))]
}

// ndnLaneMBps is one PCIe lane at generation gen as nomad-device-nvidia
// counts it: 1024 MB/s a generation from gen 3 (3072 at gen 5, not the
// 3938 the line gives), 0 before gen 3 and after gen 6.
func ndnLaneMBps(gen int64) int64 {
	if gen < 3 || gen > 6 {
		return 0
	}
	return (gen - 2) * 1024
}

// ndnEnableState is an enable state as nomad-device-nvidia v1.1.0 prints
// NVML's: the number, "1" or "0".
func ndnEnableState(state string) string {
	switch state {
	case "Enabled":
		return "1"
	case "Disabled":
		return "0"
	}
	return ""
}

func equalFingerprint(a, b *devicepb.FingerprintResponse) bool { return proto.Equal(a, b) }
