package plugin

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
	structspb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/structs"
)

// Stat names as `nomad node status -stats` and `nomad alloc status -stats` show them.
const (
	StatGPUUtil        = "GPU utilization"
	StatMemUtil        = "Memory utilization"
	StatEncUtil        = "Encoder utilization"
	StatDecUtil        = "Decoder utilization"
	StatTensorActive   = "Tensor core activity"
	StatMemory         = "Memory state"
	StatTemperature    = "Temperature"
	StatPower          = "Power usage"
	StatSMClock        = "SM clock"
	StatMemClock       = "Memory clock"
	StatLastXID        = "Last XID"
	StatECCCorrected   = "ECC corrected errors"
	StatECCUncorrected = "ECC uncorrected errors"
	// Which GPU a device is, for telemetry named the way DCGM names it
	// (gpu, UUID, GPU_I_ID, GPU_I_PROFILE): Nomad's fingerprint has no
	// per-device attributes, its stats do.
	StatGPUIndex    = "GPU index"
	StatGPUUUID     = "GPU UUID"
	StatDriver      = "Driver version"
	StatMIGInstance = "MIG instance"
	StatMIGProfile  = "MIG profile"
)

// statsResponse groups samples like the fingerprint, for fingerprinted devices only.
// A replica reports its GPU's samples.
func statsResponse(inventory map[string]offer, samples []gpu.Stats, now time.Time) *devicepb.StatsResponse {
	ts := timestamppb.New(now)
	groups := map[string]*devicepb.DeviceGroupStats{}
	offers := map[string][]offer{}
	for _, o := range inventory {
		offers[o.Device.UUID] = append(offers[o.Device.UUID], o)
	}
	for _, s := range samples {
		for _, o := range offers[s.UUID] {
			g, ok := groups[o.Group]
			if !ok {
				g = &devicepb.DeviceGroupStats{Vendor: gpu.Vendor, Type: gpu.Type, Name: o.Group,
					InstanceStats: map[string]*devicepb.DeviceStats{}}
				groups[o.Group] = g
			}
			g.InstanceStats[o.ID] = deviceStats(s, o.Device, ts)
		}
	}
	resp := &devicepb.StatsResponse{}
	for _, name := range sortedKeys(groups) {
		resp.Groups = append(resp.Groups, groups[name])
	}
	return resp
}

func deviceStats(s gpu.Stats, d gpu.Device, ts *timestamppb.Timestamp) *devicepb.DeviceStats {
	util := intStat(s.GPUUtilPct, "%", "share of time kernels were running")
	st := &devicepb.DeviceStats{
		Summary:   util,
		Timestamp: ts,
		Stats: &structspb.StatObject{Attributes: map[string]*structspb.StatValue{
			StatGPUUtil:        util,
			StatMemUtil:        intStat(s.MemUtilPct, "%", "share of time device memory was read or written"),
			StatEncUtil:        intStat(s.EncUtilPct, "%", "video encoder utilization"),
			StatDecUtil:        intStat(s.DecUtilPct, "%", "video decoder utilization"),
			StatTensorActive:   intStat(s.TensorActivePct, "%", "share of time any tensor core was busy (GPM, Hopper and later)"),
			StatMemory:         fraction(s.MemUsedMiB, s.MemTotalMiB, "MiB", "frame-buffer memory used / total"),
			StatTemperature:    intStat(s.TemperatureC, "C", "GPU temperature"),
			StatPower:          fraction(s.PowerW, s.PowerLimitW, "W", "power drawn / power limit"),
			StatSMClock:        intStat(s.SMClockMHz, "MHz", "streaming multiprocessor clock"),
			StatMemClock:       intStat(s.MemClockMHz, "MHz", "memory clock"),
			StatLastXID:        intStat(s.LastXID, "", "the last XID error the driver reported since the plugin started (0: none)"),
			StatECCCorrected:   intStat(s.ECCCorrected, "#", "corrected ECC errors since the driver loaded"),
			StatECCUncorrected: intStat(s.ECCUncorrected, "#", "uncorrected ECC errors since the driver loaded"),
			StatGPUIndex:       intStat(d.Index, "", "the GPU's index on its host, as nvidia-smi numbers it"),
			StatGPUUUID:        {StringVal: wrapperspb.String(d.GPUUUID()), Desc: "the physical GPU's UUID"},
		}},
	}
	if d.DriverVersion != "" {
		st.Stats.Attributes[StatDriver] = &structspb.StatValue{StringVal: wrapperspb.String(d.DriverVersion), Desc: "the NVIDIA driver's version"}
	}
	if d.ParentUUID != "" {
		st.Stats.Attributes[StatMIGInstance] = intStat(d.GPUInstance, "", "the MIG instance's GPU instance id")
		st.Stats.Attributes[StatMIGProfile] = &structspb.StatValue{StringVal: wrapperspb.String(d.MIGProfile()), Desc: "the MIG instance's profile"}
	}
	return st
}

func intStat(v int64, unit, desc string) *structspb.StatValue {
	if v == gpu.Unknown {
		// No unit: "N/A %" reads as a reading in nomad node status.
		return &structspb.StatValue{StringVal: wrapperspb.String("N/A"), Desc: desc}
	}
	return &structspb.StatValue{IntNumeratorVal: wrapperspb.Int64(v), Unit: unit, Desc: desc}
}

func fraction(num, den int64, unit, desc string) *structspb.StatValue {
	v := intStat(num, unit, desc)
	if num != gpu.Unknown && den > 0 {
		v.IntDenominatorVal = wrapperspb.Int64(den)
	}
	return v
}
