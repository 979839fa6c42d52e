package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
	gpunvml "github.com/nomad-gpu/nomad-gpu/device-plugin/nvml"
)

// machine is a DGX H100 from go-nvml's mock server, completed with the readings
// the mock leaves out, and an event queue tests push XID/ECC events into.
type machine struct {
	*server.Server
	events  chan nvml.EventData
	retired map[int]bool // pending retired pages per index
	lost    map[int]bool
}

func newMachine(t *testing.T) *machine {
	m := &machine{Server: dgxh100.New(), events: make(chan nvml.EventData, 8), retired: map[int]bool{}, lost: map[int]bool{}}
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				select {
				case ev := <-m.events:
					return ev, nvml.SUCCESS
				case <-time.After(5 * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for i, d := range m.Devices {
		complete(m, i, d.(*server.Device))
	}
	return m
}

func complete(m *machine, i int, d *server.Device) {
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10) {
			p.BusId[j] = int8(c)
		}
		return p, nvml.SUCCESS
	}
	d.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return 700000, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 312000, nvml.SUCCESS }
	d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return 5, nvml.SUCCESS }
	d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return 16, nvml.SUCCESS }
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
	d.GetBAR1MemoryInfoFunc = func() (nvml.BAR1Memory, nvml.Return) { return nvml.BAR1Memory{Bar1Total: 128 << 30}, nvml.SUCCESS }
	d.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		if c == nvml.CLOCK_MEM {
			return 2619, nvml.SUCCESS
		}
		return 1980, nvml.SUCCESS
	}
	d.GetDisplayModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if link < 18 {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
	}
	// A DGX H100: every GPU's links go to the NVSwitch fabric.
	d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		if m.lost[i] {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		if m.retired[i] {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
	// GPM off unless a test turns it on (TestTensorActivityFromGPM).
	d.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{}, nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
	d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 4, 167000, nvml.SUCCESS }
	d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 9, 167000, nvml.SUCCESS }
	d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		switch c {
		case nvml.CLOCK_MEM:
			return 2619, nvml.SUCCESS
		case nvml.CLOCK_GRAPHICS: // below the SM clock's most, as when idle
			return 1755, nvml.SUCCESS
		}
		return 1980, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		if t == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return 3, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
}

func open(t *testing.T, m *machine) *gpunvml.Backend {
	t.Helper()
	b, err := gpunvml.Open(gpunvml.Options{Library: m, IgnoredXIDs: []int{13, 43}}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestOpenWithoutDriver(t *testing.T) {
	m := newMachine(t)
	m.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	_, err := gpunvml.Open(gpunvml.Options{Library: m}, hclog.NewNullLogger())
	if !errors.Is(err, gpunvml.ErrLibraryNotFound) {
		t.Fatalf("want ErrLibraryNotFound, got %v", err)
	}
	m.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	if _, err := gpunvml.Open(gpunvml.Options{Library: m}, hclog.NewNullLogger()); err == nil ||
		!strings.Contains(err.Error(), "initialise NVML") {
		t.Fatalf("want an initialisation error, got %v", err)
	}
}

func TestDevicesOfADGXH100(t *testing.T) {
	m := newMachine(t)
	devs, err := open(t, m).Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 8 {
		t.Fatalf("want 8 GPUs, got %d", len(devs))
	}
	d := devs[1]
	uuid, _ := m.Devices[1].GetUUID()
	name, _ := m.Devices[1].GetName()
	want := gpu.Device{UUID: uuid, Model: name, MemoryMiB: 81920, ComputeCapability: "9.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4", PowerLimitW: 700, PCIeGeneration: 5, PCIeWidth: 16,
		PCIBusID: "0000:28:00.0", NUMANode: 0, NVLinkPeers: 18, BAR1MiB: 131072, CoresClockMHz: 1980, MemoryClockMHz: 2619,
		PowerDrawW: 312, CoresClockNowMHz: 1755, MemoryClockNowMHz: 2619, DisplayMode: "Disabled", PersistenceMode: "Enabled", Index: 1, GPUInstance: gpu.Unknown, Island: 0, DeviceNodes: []string{"/dev/nvidia1"}}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Errorf("device 1:\n got %+v\nwant %+v", d, want)
	}
}

func TestHealthFromEventsAndPolledConditions(t *testing.T) {
	m := newMachine(t)
	b := open(t, m)
	ctx := context.Background()
	uuid := func(i int) string { u, _ := m.Devices[i].GetUUID(); return u }

	m.events <- nvml.EventData{Device: m.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	m.events <- nvml.EventData{Device: m.Devices[3], EventType: nvml.EventTypeXidCriticalError, EventData: 13}
	m.events <- nvml.EventData{Device: m.Devices[4], EventType: nvml.EventTypeDoubleBitEccError}
	m.retired[5] = true
	m.lost[6] = true

	var h map[string]gpu.Health
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := b.Health(ctx)
		for k, v := range got {
			if h == nil {
				h = map[string]gpu.Health{}
			}
			if !v.Healthy || h[k].Reason == "" {
				h[k] = v
			}
		}
		if !h[uuid(2)].Healthy && !h[uuid(4)].Healthy || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := map[int]string{2: "XID 79", 4: "uncorrectable (double-bit) ECC", 5: "retired memory pages pending", 6: "GPU is lost"}
	for i := 0; i < 8; i++ {
		got := h[uuid(i)]
		if reason, bad := want[i]; bad {
			if got.Healthy || !strings.Contains(got.Reason, reason) {
				t.Errorf("GPU %d: want unhealthy %q, got %+v", i, reason, got)
			}
		} else if !got.Healthy {
			t.Errorf("GPU %d: want healthy (XID 13 is an application error), got %+v", i, got)
		}
	}

	// Every XID is the GPU's last, an application's too (as DCGM reports it).
	stats, _ := b.Stats(ctx)
	for _, st := range stats {
		want := map[string]int64{uuid(2): 79, uuid(3): 13}[st.UUID]
		if st.LastXID != want {
			t.Errorf("%s: last XID %d, want %d", st.UUID, st.LastXID, want)
		}
	}

	// An event is reported once; hysteresis is the plugin's job, not the backend's.
	m.retired[5], m.lost[6] = false, false
	h, _ = b.Health(ctx)
	for i := 0; i < 8; i++ {
		if !h[uuid(i)].Healthy {
			t.Errorf("GPU %d still unhealthy after its fault cleared: %+v", i, h[uuid(i)])
		}
	}
}

// withMIG puts the first GPU of m in MIG mode with two 3g.40gb instances,
// MIG-0 and MIG-1, GPU instances 1 and 2, and GPM as gpmSupported says.
func withMIG(m *machine, gpmSupported bool) *server.Device {
	parent := m.Devices[0].(*server.Device)
	parent.MigMode = nvml.DEVICE_MIG_ENABLE
	var migs []nvml.Device
	for j := 0; j < 2; j++ {
		migs = append(migs, &mock.Device{
			GetUUIDFunc:          func() (string, nvml.Return) { return fmt.Sprintf("MIG-%d", j), nvml.SUCCESS },
			GetNameFunc:          func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 3g.40gb", nvml.SUCCESS },
			GetMemoryInfoFunc:    func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 40 << 30, Used: 1 << 30}, nvml.SUCCESS },
			GetGpuInstanceIdFunc: func() (int, nvml.Return) { return j + 1, nvml.SUCCESS },
		})
	}
	parent.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	parent.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < len(migs) {
			return migs[j], nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	supported := uint32(0)
	if gpmSupported {
		supported = 1
	}
	parent.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
		return nvml.GpmSupport{IsSupportedDevice: supported}, nvml.SUCCESS
	}
	return parent
}

func TestMIGInstancesAreDevicesSharingParentHealth(t *testing.T) {
	m := newMachine(t)
	parent := withMIG(m, false)
	b := open(t, m)
	devs, _ := b.Devices(context.Background())
	if len(devs) != 9 {
		t.Fatalf("want 7 GPUs + 2 MIG instances, got %d", len(devs))
	}
	parentUUID, _ := parent.GetUUID()
	var found int
	for _, d := range devs {
		if d.UUID == parentUUID {
			t.Errorf("a GPU in MIG mode must not be offered whole")
		}
		if strings.HasPrefix(d.UUID, "MIG-") {
			found++
			if d.Model != "NVIDIA H100 80GB HBM3 MIG 3g.40gb" || d.MemoryMiB != 40960 || d.ParentUUID != parentUUID || !d.MIG ||
				d.Index != 0 || d.GPUInstance != int64(d.UUID[len("MIG-")]-'0')+1 || d.MIGProfile() != "3g.40gb" || d.GPUUUID() != parentUUID {
				t.Errorf("MIG instance wrong: %+v", d)
			}
		}
	}
	if found != 2 {
		t.Fatalf("want 2 MIG instances, got %d", found)
	}
	m.retired[0] = true
	h, _ := b.Health(context.Background())
	if h["MIG-0"].Healthy || h["MIG-1"].Healthy {
		t.Errorf("MIG instances must share their GPU's fault: %+v", h)
	}
	stats, _ := b.Stats(context.Background())
	for _, s := range stats {
		if s.UUID == "MIG-1" && (s.MemUsedMiB != 1024 || s.MemTotalMiB != 40960 || s.GPUUtilPct != gpu.Unknown) {
			t.Errorf("MIG stats without GPM: want memory only, got %+v", s)
		}
	}
}

// gpmSample is a GPM sample of the mock: which GPU instance, taken when.
type gpmSample struct {
	instance, at int
	freed        *int
}

func (g *gpmSample) Free() nvml.Return                   { *g.freed++; return nvml.SUCCESS }
func (g *gpmSample) Get(nvml.Device) nvml.Return         { return nvml.ERROR_NOT_SUPPORTED }
func (g *gpmSample) MigGet(nvml.Device, int) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }

// With GPM (Hopper), a MIG instance's utilisation is its SMs' between two
// samples, and its tensor activity its tensor cores': N/A at the first
// Stats, then each instance's own; every sample but the last of each
// instance is freed.
func TestMIGInstancesGetTheirOwnUtilisationFromGPM(t *testing.T) {
	m := newMachine(t)
	parent := withMIG(m, true)
	allocated, freed, clock := 0, 0, 0
	m.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) {
		allocated++
		return &gpmSample{instance: -1, freed: &freed}, nvml.SUCCESS
	}
	m.GpmMigSampleGetFunc = func(dev nvml.Device, instance int, s nvml.GpmSample) nvml.Return {
		if dev != parent {
			t.Errorf("GPM sampled instance %d on another device than its GPU", instance)
		}
		clock++
		s.(*gpmSample).instance, s.(*gpmSample).at = instance, clock
		return nvml.SUCCESS
	}
	// GPU instance 1 keeps 37.4 % of its SMs busy, instance 2 81.6 %; their
	// tensor cores 20.2 % and 70.5 %.
	m.GpmMetricsGetFunc = func(get *nvml.GpmMetricsGetType) nvml.Return {
		a, z := get.Sample1.(*gpmSample), get.Sample2.(*gpmSample)
		if get.NumMetrics != 2 || nvml.GpmMetricId(get.Metrics[0].MetricId) != nvml.GPM_METRIC_SM_UTIL ||
			nvml.GpmMetricId(get.Metrics[1].MetricId) != nvml.GPM_METRIC_ANY_TENSOR_UTIL || a.instance != z.instance || a.at >= z.at {
			t.Errorf("GPM asked %d metrics (%d, %d) between %+v and %+v", get.NumMetrics, get.Metrics[0].MetricId, get.Metrics[1].MetricId, a, z)
		}
		get.Metrics[0].Value = map[int]float64{1: 37.4, 2: 81.6}[a.instance]
		get.Metrics[1].Value = map[int]float64{1: 20.2, 2: 70.5}[a.instance]
		return nvml.SUCCESS
	}
	b, err := gpunvml.Open(gpunvml.Options{Library: m}, hclog.NewNullLogger()) // closed below
	if err != nil {
		t.Fatal(err)
	}
	utils := func() map[string]int64 {
		stats, err := b.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, s := range stats {
			if strings.HasPrefix(s.UUID, "MIG-") {
				out[s.UUID], out[s.UUID+" tensor"] = s.GPUUtilPct, s.TensorActivePct
			}
		}
		return out
	}
	if got := utils(); got["MIG-0"] != gpu.Unknown || got["MIG-1"] != gpu.Unknown || got["MIG-0 tensor"] != gpu.Unknown {
		t.Errorf("first stats: %v, want N/A (nothing to measure against)", got)
	}
	for range 2 {
		if got := utils(); got["MIG-0"] != 37 || got["MIG-1"] != 82 || got["MIG-0 tensor"] != 20 || got["MIG-1 tensor"] != 71 {
			t.Errorf("stats: %v, want MIG-0 37 (tensor 20) and MIG-1 82 (tensor 71)", got)
		}
	}
	if live := allocated - freed; live != 2 {
		t.Errorf("%d GPM samples allocated, %d freed: %d live, want the last of each instance", allocated, freed, live)
	}
	b.Close()
	if freed != allocated {
		t.Errorf("after Close, %d of %d GPM samples freed", freed, allocated)
	}
}

// A whole GPU's tensor-core activity comes from GPM where the GPU has it
// (Hopper and later): N/A at the first Stats, then the share between two
// samples of that GPU. It is N/A on GPUs without GPM, as dcgm-exporter
// leaves the field out without profiling.
func TestTensorActivityFromGPM(t *testing.T) {
	m := newMachine(t)
	withGPM := m.Devices[1].(*server.Device)
	withGPM.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
		return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS
	}
	freed, clock := 0, 0
	m.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) { return &gpmSample{freed: &freed}, nvml.SUCCESS }
	m.GpmSampleGetFunc = func(dev nvml.Device, s nvml.GpmSample) nvml.Return {
		if dev != withGPM {
			t.Errorf("GPM sampled a GPU without GPM")
		}
		clock++
		s.(*gpmSample).at = clock
		return nvml.SUCCESS
	}
	m.GpmMetricsGetFunc = func(get *nvml.GpmMetricsGetType) nvml.Return {
		if get.NumMetrics != 1 || nvml.GpmMetricId(get.Metrics[0].MetricId) != nvml.GPM_METRIC_ANY_TENSOR_UTIL ||
			get.Sample1.(*gpmSample).at >= get.Sample2.(*gpmSample).at {
			t.Errorf("GPM asked %d metrics (%d)", get.NumMetrics, get.Metrics[0].MetricId)
		}
		get.Metrics[0].Value = 62.5
		return nvml.SUCCESS
	}
	b := open(t, m)
	uuid, _ := withGPM.GetUUID()
	tensor := func() map[string]int64 {
		stats, err := b.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, s := range stats {
			out[s.UUID] = s.TensorActivePct
		}
		return out
	}
	if got := tensor(); got[uuid] != gpu.Unknown {
		t.Errorf("first stats: %d, want N/A", got[uuid])
	}
	got := tensor()
	other, _ := m.Devices[2].GetUUID()
	if got[uuid] != 63 || got[other] != gpu.Unknown {
		t.Errorf("tensor activity %d on the GPU with GPM (want 63), %d without (want N/A)", got[uuid], got[other])
	}
}

func TestStats(t *testing.T) {
	m := newMachine(t)
	stats, err := open(t, m).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	uuid, _ := m.Devices[3].GetUUID()
	for _, s := range stats {
		if s.UUID != uuid {
			continue
		}
		want := gpu.Stats{UUID: uuid, GPUUtilPct: 30, MemUtilPct: 5, EncUtilPct: 4, DecUtilPct: 9, TensorActivePct: gpu.Unknown, MemUsedMiB: 0, MemTotalMiB: 81920,
			TemperatureC: 41, PowerW: 312, PowerLimitW: 700, SMClockMHz: 1980, MemClockMHz: 2619, ECCCorrected: 3, ECCUncorrected: 0}
		if s != want {
			t.Errorf("got %+v\nwant %+v", s, want)
		}
		return
	}
	t.Fatalf("no stats for %s", uuid)
}

func TestSysfsBusID(t *testing.T) {
	var raw [32]int8
	for i, c := range "00000000:3B:00.0" {
		raw[i] = int8(c)
	}
	if got := gpunvml.SysfsBusID(raw); got != "0000:3b:00.0" {
		t.Errorf("got %q", got)
	}
}

// Islands from NVLink: GPUs on the NVSwitch fabric are one island; GPUs
// linked to each other directly are one; a GPU without NVLink is in its
// NUMA node's. Numbered in PCI order.
func TestIslandsFollowNVLinkThenNUMA(t *testing.T) {
	island := func(m *machine) []int64 {
		devs, err := open(t, m).Devices(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, d := range devs {
			out = append(out, d.Island)
		}
		return out
	}
	if got := island(newMachine(t)); fmt.Sprint(got) != "[0 0 0 0 0 0 0 0]" {
		t.Errorf("NVSwitch: islands %v, want one", got)
	}
	// GPUs 0-1 and 2-3 linked in pairs (bus ids 0x18 + 0x10 i), 4-7 without
	// NVLink on NUMA node 1 (newMachine puts GPU i on node i/4).
	m := newMachine(t)
	for i, d := range m.Devices {
		d := d.(*server.Device)
		peer := i ^ 1
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 2 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if i >= 4 {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) { return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS }
		d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x18+peer*0x10) {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
	}
	if got := island(m); fmt.Sprint(got) != "[0 0 1 1 2 2 2 2]" {
		t.Errorf("pairs, then a NUMA node: islands %v, want [0 0 1 1 2 2 2 2]", got)
	}
}
