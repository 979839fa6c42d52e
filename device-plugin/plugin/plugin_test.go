package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
	basepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/base"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
	structspb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/structs"
)

// testBackend is a Backend whose devices and health a test changes at will.
type testBackend struct {
	mu      sync.Mutex
	devices []gpu.Device
	health  map[string]gpu.Health
	stats   []gpu.Stats
	// listErr and healthErr fail Devices and Health, as a failing NVML would.
	listErr, healthErr error
}

var _ Backend = (*testBackend)(nil)

func (b *testBackend) Devices(context.Context) ([]gpu.Device, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listErr != nil {
		return nil, b.listErr
	}
	return append([]gpu.Device(nil), b.devices...), nil
}
func (b *testBackend) Health(context.Context) (map[string]gpu.Health, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.healthErr != nil {
		return nil, b.healthErr
	}
	out := map[string]gpu.Health{}
	for k, v := range b.health {
		out[k] = v
	}
	return out, nil
}
func (b *testBackend) Stats(context.Context) ([]gpu.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats, nil
}
func (b *testBackend) Close() error { return nil }

func (b *testBackend) set(f func(b *testBackend)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b)
}

func device(uuid, model string, nodes ...string) gpu.Device {
	return gpu.Device{UUID: uuid, Model: model, MemoryMiB: 81559, PowerLimitW: 700, PCIeGeneration: 5,
		PCIeWidth: 16, NUMANode: 0, NVLinkPeers: 7, ComputeCapability: "9.0", PCIBusID: "0000:3b:00.0", DeviceNodes: nodes}
}

type client struct {
	base   basepb.BasePluginClient
	device devicepb.DevicePluginClient
	plugin *Plugin
}

// serve runs the plugin on an in-memory gRPC connection, configured by config.
func serve(t *testing.T, backend Backend, config map[string]any) client {
	t.Helper()
	p := New(hclog.NewNullLogger(), "0.1.0", func(Config) (Backend, error) { return backend, nil })
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	basepb.RegisterBasePluginServer(srv, p)
	devicepb.RegisterDevicePluginServer(srv, p)
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); srv.Stop() })
	c := client{base: basepb.NewBasePluginClient(conn), device: devicepb.NewDevicePluginClient(conn), plugin: p}
	b, _ := msgpack.Marshal(config)
	if _, err := c.base.SetConfig(context.Background(), &basepb.SetConfigRequest{MsgpackConfig: b, PluginApiVersion: APIVersion}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPluginInfo(t *testing.T) {
	c := serve(t, &testBackend{}, nil)
	info, err := c.base.PluginInfo(context.Background(), &basepb.PluginInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != basepb.PluginType_DEVICE || info.Name != "nomad-device-gpu" ||
		len(info.PluginApiVersions) != 1 || info.PluginApiVersions[0] != "v0.1.0" {
		t.Errorf("unexpected plugin info %v", info)
	}
}

func TestSetConfigRejectsBadOptionAndIsIdempotent(t *testing.T) {
	c := serve(t, &testBackend{}, map[string]any{"backend": "fake"})
	b, _ := msgpack.Marshal(map[string]any{"backend": "tpu"})
	_, err := c.base.SetConfig(context.Background(), &basepb.SetConfigRequest{MsgpackConfig: b})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "option backend") {
		t.Fatalf("want InvalidArgument naming backend, got %v", err)
	}
	if c.plugin.config().Backend != "fake" {
		t.Errorf("a refused config replaced the good one")
	}
	for i := 0; i < 2; i++ {
		b, _ = msgpack.Marshal(map[string]any{"ignored_gpu_ids": []string{"GPU-x"}})
		if _, err := c.base.SetConfig(context.Background(), &basepb.SetConfigRequest{MsgpackConfig: b}); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.plugin.config().IgnoredGPUIDs; len(got) != 1 {
		t.Errorf("SetConfig accumulated instead of replacing: %v", got)
	}
}

func fingerprints(t *testing.T, c client) (func() *devicepb.FingerprintResponse, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return func() *devicepb.FingerprintResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("fingerprint stream: %v", err)
		}
		return resp
	}, cancel
}

func TestFingerprintHealthLostAndIgnored(t *testing.T) {
	backend := &testBackend{devices: []gpu.Device{device("GPU-a", "H100"), device("GPU-b", "H100"),
		device("GPU-c", "A100"), device("GPU-ignored", "H100")}}
	c := serve(t, backend, map[string]any{"fingerprint_period": "10ms", "health_recovery": "1h",
		"ignored_gpu_ids": []string{"GPU-ignored"}})
	next, _ := fingerprints(t, c)

	first := next()
	if len(first.DeviceGroup) != 2 || first.DeviceGroup[0].DeviceName != "A100" || len(first.DeviceGroup[1].Devices) != 2 {
		t.Fatalf("want groups A100 (1) and H100 (2, ignored one left out), got %v", first)
	}
	g := first.DeviceGroup[1]
	if g.Vendor != "nvidia" || g.DeviceType != "gpu" || g.Attributes["memory"].GetIntVal() != 81559 ||
		g.Attributes["memory"].Unit != "MiB" || g.Devices[0].HwLocality.GetPciBusId() != "0000:3b:00.0" {
		t.Errorf("group fields wrong: %v", g)
	}

	backend.set(func(b *testBackend) { b.health = map[string]gpu.Health{"GPU-a": {Reason: "XID 48"}} })
	resp := next()
	if d := find(resp, "GPU-a"); d.Healthy || d.HealthDescription != "XID 48" {
		t.Errorf("fault not reported: %v", d)
	}

	backend.set(func(b *testBackend) { b.health = nil; b.devices = b.devices[1:] })
	resp = next()
	if d := find(resp, "GPU-a"); d == nil || d.Healthy || !strings.Contains(d.HealthDescription, "lost") {
		t.Errorf("a vanished GPU must stay listed as lost, got %v", d)
	}
	if d := find(resp, "GPU-b"); !d.Healthy {
		t.Errorf("GPU-b affected: %v", d)
	}

	// NVML failing: every known GPU stays listed, unhealthy with the reason.
	for _, c := range []struct {
		fail func(b *testBackend)
		want string
	}{
		{func(b *testBackend) { b.listErr = errors.New("nvml: Driver Not Loaded") }, "cannot read GPU: nvml: Driver Not Loaded"},
		{func(b *testBackend) { b.listErr, b.healthErr = nil, errors.New("nvml: Unknown Error") }, "cannot check GPU health: nvml: Unknown Error"},
	} {
		backend.set(c.fail)
		resp = next()
		for _, uuid := range []string{"GPU-a", "GPU-b", "GPU-c"} {
			if d := find(resp, uuid); d == nil || d.Healthy || d.HealthDescription != c.want {
				t.Errorf("%s with NVML failing: %v, want unhealthy with %q", uuid, d, c.want)
			}
		}
	}
}

func TestFingerprintWhenDisabledReportsNothingAndStaysOpen(t *testing.T) {
	c := serve(t, &testBackend{devices: []gpu.Device{device("GPU-a", "H100")}}, map[string]any{"enabled": false})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stream, err := c.device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.DeviceGroup) != 0 {
		t.Fatalf("want one empty fingerprint, got %v %v", resp, err)
	}
	// It ends at the deadline: the client's own error, or the end of stream
	// from the server, which got the same deadline and may close first.
	deadline, _ := ctx.Deadline()
	if _, err := stream.Recv(); time.Now().Before(deadline) || (status.Code(err) != codes.DeadlineExceeded && err != io.EOF) {
		t.Fatalf("the stream must stay open until Nomad cancels it, got %v %s before the deadline", err, time.Until(deadline))
	}
}

func find(resp *devicepb.FingerprintResponse, id string) *devicepb.DetectedDevice {
	for _, g := range resp.DeviceGroup {
		for _, d := range g.Devices {
			if d.ID == id {
				return d
			}
		}
	}
	return nil
}

func TestReserve(t *testing.T) {
	dir := t.TempDir()
	node0 := dir + "/nvidia0"
	os.WriteFile(node0, nil, 0o600)
	backend := &testBackend{devices: []gpu.Device{device("GPU-a", "H100", node0), device("GPU-b", "H100", dir+"/nvidia1")}}
	c := serve(t, backend, map[string]any{"fingerprint_period": "1h"})
	next, _ := fingerprints(t, c)
	next()
	ctx := context.Background()

	resp, err := c.device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: []string{"GPU-a", "GPU-b"}})
	if err != nil {
		t.Fatal(err)
	}
	envs := resp.ContainerRes.Envs
	if envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-a,GPU-b" || envs["CUDA_VISIBLE_DEVICES"] != "GPU-a,GPU-b" {
		t.Errorf("envs = %v", envs)
	}
	if len(resp.ContainerRes.Devices) != 1 || resp.ContainerRes.Devices[0].HostPath != node0 ||
		resp.ContainerRes.Devices[0].Permissions != "rwm" {
		t.Errorf("want only the device node that exists on the host, got %v", resp.ContainerRes.Devices)
	}

	_, err = c.device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: []string{"GPU-a", "GPU-zzz"}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "GPU-zzz") {
		t.Errorf("unknown id: want NotFound naming it, got %v", err)
	}

	resp, err = c.device.Reserve(ctx, &devicepb.ReserveRequest{})
	if err != nil || resp.ContainerRes == nil {
		t.Errorf("an empty request must still get a container reservation: %v %v", resp, err)
	}
}

func TestStatsStreamHasTimestampsAndUnknowns(t *testing.T) {
	s := gpu.UnknownStats("GPU-a")
	s.GPUUtilPct, s.MemUsedMiB, s.MemTotalMiB = 42, 1024, 81559
	backend := &testBackend{devices: []gpu.Device{device("GPU-a", "H100")},
		stats: []gpu.Stats{s, {UUID: "GPU-not-fingerprinted"}}}
	c := serve(t, backend, map[string]any{"fingerprint_period": "1h"})
	next, _ := fingerprints(t, c)
	next()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.device.Stats(ctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Groups) != 1 || len(resp.Groups[0].InstanceStats) != 1 {
			t.Fatalf("want stats of the fingerprinted GPU only, got %v", resp)
		}
		st := resp.Groups[0].InstanceStats["GPU-a"]
		if st.Timestamp == nil || st.Summary.IntNumeratorVal.GetValue() != 42 {
			t.Errorf("summary/timestamp wrong: %v", st)
		}
		mem := st.Stats.Attributes[StatMemory]
		if mem.IntNumeratorVal.GetValue() != 1024 || mem.IntDenominatorVal.GetValue() != 81559 {
			t.Errorf("memory state wrong: %v", mem)
		}
		if temp := st.Stats.Attributes[StatTemperature]; temp.StringVal.GetValue() != "N/A" || temp.Unit != "" {
			t.Errorf("an unreadable value must be N/A with no unit, got %v", temp)
		}
	}
}

// Each device's stats say which GPU it is, the way DCGM labels telemetry:
// its index, its physical GPU's UUID, and a MIG instance's GPU instance id
// and profile.
func TestStatsSayWhichGPUADeviceIs(t *testing.T) {
	whole := device("GPU-a", "NVIDIA H100 80GB HBM3")
	whole.Index = 3
	mig := device("MIG-b", "NVIDIA H100 80GB HBM3 MIG 3g.40gb")
	mig.Index, mig.ParentUUID, mig.MIG, mig.GPUInstance = 5, "GPU-p", true, 2
	resp := statsResponse(map[string]offer{"GPU-a": {ID: "GPU-a", Group: whole.Model, Device: whole},
		"MIG-b": {ID: "MIG-b", Group: mig.Model, Device: mig}},
		[]gpu.Stats{gpu.UnknownStats("GPU-a"), gpu.UnknownStats("MIG-b")}, time.Now())
	got := map[string]string{}
	for _, g := range resp.Groups {
		for id, st := range g.InstanceStats {
			for _, k := range []string{StatGPUIndex, StatGPUUUID, StatMIGInstance, StatMIGProfile} {
				if v := st.Stats.Attributes[k]; v != nil {
					got[id+" "+k] = fmt.Sprintf("%d %s", v.IntNumeratorVal.GetValue(), v.StringVal.GetValue())
				}
			}
		}
	}
	want := map[string]string{"GPU-a GPU index": "3 ", "GPU-a GPU UUID": "0 GPU-a",
		"MIG-b GPU index": "5 ", "MIG-b GPU UUID": "0 GPU-p", "MIG-b MIG instance": "2 ", "MIG-b MIG profile": "0 3g.40gb"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

func TestBackendThatFailsToOpenIsRetried(t *testing.T) {
	backend := &testBackend{devices: []gpu.Device{device("GPU-a", "H100")}}
	var mu sync.Mutex
	failures := 2
	p := New(hclog.NewNullLogger(), "0.1.0", func(Config) (Backend, error) {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return nil, status.Error(codes.Unavailable, "driver not loaded yet")
		}
		return backend, nil
	})
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	basepb.RegisterBasePluginServer(srv, p)
	devicepb.RegisterDevicePluginServer(srv, p)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, _ := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	b, _ := msgpack.Marshal(map[string]any{"fingerprint_period": "10ms"})
	if _, err := basepb.NewBasePluginClient(conn).SetConfig(context.Background(), &basepb.SetConfigRequest{MsgpackConfig: b}); err != nil {
		t.Fatal(err)
	}
	c := client{device: devicepb.NewDevicePluginClient(conn), plugin: p}
	next, _ := fingerprints(t, c)
	if first := next(); len(first.DeviceGroup) != 0 {
		t.Fatalf("want an empty list while the backend cannot open, got %v", first)
	}
	if second := next(); find(second, "GPU-a") == nil {
		t.Fatalf("the backend was not retried: %v", second)
	}
}

// sharing { replicas = 4  gpus = 2 }: the first two GPUs (by PCI bus id) are
// offered as four replicas each in a "(shared)" group. A task given replicas
// sees their GPU, once; replicas report their GPU's health and stats.
func TestSharedGPUsAreOfferedAsReplicas(t *testing.T) {
	a, b, c := device("GPU-a", "H100"), device("GPU-b", "H100"), device("GPU-c", "H100")
	a.PCIBusID, b.PCIBusID, c.PCIBusID = "0000:02:00.0", "0000:01:00.0", "0000:03:00.0"
	st := gpu.UnknownStats("GPU-a")
	st.GPUUtilPct = 37
	backend := &testBackend{devices: []gpu.Device{a, b, c}, health: map[string]gpu.Health{"GPU-a": {Reason: "XID 79"}, "GPU-b": gpu.Healthy, "GPU-c": gpu.Healthy},
		stats: []gpu.Stats{st}}
	cl := serve(t, backend, map[string]any{"fingerprint_period": "1h", "sharing": map[string]any{"replicas": 4, "gpus": 2}})
	next, _ := fingerprints(t, cl)
	fp := next()
	groups := map[string][]string{}
	for _, g := range fp.DeviceGroup {
		for _, d := range g.Devices {
			groups[g.DeviceName] = append(groups[g.DeviceName], fmt.Sprintf("%s:%t", d.ID, d.Healthy))
		}
		if shared := g.Attributes["shared"].GetBoolVal(); shared != strings.HasSuffix(g.DeviceName, "(shared)") {
			t.Errorf("group %s: shared = %t", g.DeviceName, shared)
		}
	}
	want := map[string][]string{
		"H100":          {"GPU-c:true"},
		"H100 (shared)": {"GPU-a-0:false", "GPU-a-1:false", "GPU-a-2:false", "GPU-a-3:false", "GPU-b-0:true", "GPU-b-1:true", "GPU-b-2:true", "GPU-b-3:true"},
	}
	if fmt.Sprint(groups) != fmt.Sprint(want) {
		t.Fatalf("groups:\n got %v\nwant %v", groups, want)
	}
	resp, err := cl.device.Reserve(context.Background(), &devicepb.ReserveRequest{DeviceIds: []string{"GPU-b-1", "GPU-b-3", "GPU-c"}})
	if err != nil || resp.ContainerRes.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-b,GPU-c" {
		t.Fatalf("reserve two replicas of GPU-b and GPU-c: %v %v", resp, err)
	}
	stats := cl.plugin.collectStats(context.Background(), backend)
	if len(stats.Groups) != 1 || stats.Groups[0].Name != "H100 (shared)" || len(stats.Groups[0].InstanceStats) != 4 ||
		stats.Groups[0].InstanceStats["GPU-a-2"].Summary.IntNumeratorVal.GetValue() != 37 {
		t.Errorf("replica stats: %v", stats)
	}
}

// nomad-device-nvidia's attributes, under its names and units and with the
// values v1.1.0 reports, beside ours under our own names: a jobspec written
// for it constrains on the same keys and values.
func TestFingerprintOffersNomadDeviceNvidiasAttributes(t *testing.T) {
	d := device("GPU-a", "H100")
	d.BAR1MiB, d.CoresClockMHz, d.MemoryClockMHz, d.DisplayMode, d.PersistenceMode = 131072, 1980, 2619, "Disabled", "Enabled"
	d.PowerDrawW, d.CoresClockNowMHz, d.MemoryClockNowMHz = 72, 345, 2619
	attrs := attributes(d, false, 0)
	for name, want := range map[string]string{
		"memory": "81559 MiB", "power": "72 W", "bar1": "131072 MiB", "driver_version": "", "cores_clock": "345 MHz",
		"memory_clock": "2619 MHz", "pci_bandwidth": "49152 MB/s", "display_state": "0", "persistence_mode": "1",
		// ours
		"power_limit": "700 W", "cores_clock_max": "1980 MHz", "memory_clock_max": "2619 MHz", "pcie_bandwidth": "63008 MB/s",
		"display_enabled": "false", "persistence_enabled": "true",
	} {
		a, ok := attrs[name]
		got := ""
		switch v := a.GetValue().(type) {
		case *structspb.Attribute_IntVal:
			got = fmt.Sprintf("%d %s", v.IntVal, a.Unit)
		case *structspb.Attribute_StringVal:
			got = v.StringVal
		case *structspb.Attribute_BoolVal:
			got = fmt.Sprint(v.BoolVal)
		}
		if name == "driver_version" { // the test device has none: left out, not ""
			if ok {
				t.Errorf("driver_version offered as %q for a device without one", got)
			}
			continue
		}
		if got != want {
			t.Errorf("%s = %q (offered %t), want %q", name, got, ok, want)
		}
	}
	// nomad-device-nvidia's lane rates: gen 3 1024 MB/s, gen 4 2048, gen 6 4096, none before gen 3.
	for gen, want := range map[int64]int64{2: 0, 3: 16384, 4: 32768, 6: 65536} {
		d.PCIeGeneration = gen
		if got := attributes(d, false, 0)["pci_bandwidth"].GetIntVal(); got != want {
			t.Errorf("gen %d x16: pci_bandwidth %d MB/s, want %d", gen, got, want)
		}
	}
	d.PCIeGeneration, d.CoresClockNowMHz = gpu.Unknown, gpu.Unknown
	if attrs := attributes(d, false, 0); attrs["pci_bandwidth"] != nil || attrs["cores_clock"] != nil {
		t.Errorf("unknown readings offered: %v %v", attrs["pci_bandwidth"], attrs["cores_clock"])
	}
}

// nomad-device-nvidia's readings are those of a GPU's first fingerprint: a
// power draw or clock that moves since changes no fingerprint (Nomad would
// update the node every period).
func TestReadingsAtFirstFingerprintAreKept(t *testing.T) {
	d := device("GPU-a", "H100")
	d.PowerDrawW, d.CoresClockNowMHz, d.MemoryClockNowMHz = 72, 345, 2619
	backend := &testBackend{devices: []gpu.Device{d}}
	s := newScanner(DefaultConfig(), backend, hclog.NewNullLogger())
	first, _ := s.scan(context.Background(), time.Now())
	backend.set(func(b *testBackend) { b.devices[0].PowerDrawW, b.devices[0].CoresClockNowMHz = 410, 1980 })
	second, _ := s.scan(context.Background(), time.Now())
	if !equalFingerprint(first, second) || first.DeviceGroup[0].Attributes["power"].GetIntVal() != 72 {
		t.Errorf("the fingerprint moved with the readings:\n%v\n%v", first, second)
	}
}

// With island_groups, each NVLink island is a device group of its own (a
// request's GPUs all come from one group in Nomad), named after its model
// and island, with island and model attributes; time-sliced GPUs stay in
// their shared group. Without it, one group per model.
func TestIslandGroups(t *testing.T) {
	backend := fake.New(fake.Config{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, IDPrefix: "isl", Islands: 2},
		hclog.NewNullLogger())
	groups := func(config map[string]any) map[string][]string {
		c := serve(t, backend, config)
		next, _ := fingerprints(t, c)
		out := map[string][]string{}
		for _, g := range next().DeviceGroup {
			key := fmt.Sprintf("%s island=%d model=%s", g.DeviceName, g.Attributes["island"].GetIntVal(), g.Attributes["model"].GetStringVal())
			for _, d := range g.Devices {
				out[key] = append(out[key], d.ID)
			}
		}
		return out
	}
	ids := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fake.UUID("isl", i))
		}
		sort.Strings(out)
		return out
	}
	sorted := func(m map[string][]string) map[string][]string {
		for _, v := range m {
			sort.Strings(v)
		}
		return m
	}
	got := sorted(groups(map[string]any{"backend": "fake", "island_groups": true}))
	want := map[string][]string{
		"NVIDIA H100 80GB HBM3 (island 0) island=0 model=NVIDIA H100 80GB HBM3": ids(0, 4),
		"NVIDIA H100 80GB HBM3 (island 1) island=1 model=NVIDIA H100 80GB HBM3": ids(4, 8),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("island groups\n got %v\nwant %v", got, want)
	}
	if got := groups(map[string]any{"backend": "fake"}); len(got) != 1 || len(got["NVIDIA H100 80GB HBM3 island=0 model="]) != 8 {
		t.Errorf("without island_groups: %v", got)
	}
	got = groups(map[string]any{"backend": "fake", "island_groups": true, "sharing": map[string]any{"replicas": 2, "gpus": 2}})
	if len(got["NVIDIA H100 80GB HBM3 (shared) island=0 model="]) != 4 || len(got["NVIDIA H100 80GB HBM3 (island 0) island=0 model=NVIDIA H100 80GB HBM3"]) != 2 {
		t.Errorf("shared GPUs with island groups: %v", got)
	}
}
