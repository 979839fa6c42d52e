// Package plugin serves Nomad's device-plugin protocol over the project's own
// gRPC definitions: configuration, fingerprinting with health tracking, device
// statistics and reservation, on top of a GPU backend.
package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/gpu"
	basepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/base"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
)

// Name is both the binary's file name and the plugin's identity in Nomad, so that
// `plugin "nomad-device-gpu" { ... }` in the agent config always reaches it.
const Name = "nomad-device-gpu"

// APIVersion is the only device-plugin API version Nomad speaks.
const APIVersion = "v0.1.0"

// Backend is where devices, their health and their statistics come from.
type Backend interface {
	Devices(ctx context.Context) ([]gpu.Device, error)
	// Health returns the raw condition of each device now; faults seen since the
	// last call (such as XID events) count as present.
	Health(ctx context.Context) (map[string]gpu.Health, error)
	Stats(ctx context.Context) ([]gpu.Stats, error)
	Close() error
}

// OpenBackend builds the backend a validated config asks for. It is called when
// Nomad starts fingerprinting, never on the validation launches.
type OpenBackend func(cfg Config) (Backend, error)

// Plugin implements the BasePlugin and DevicePlugin gRPC services.
type Plugin struct {
	basepb.UnimplementedBasePluginServer
	devicepb.UnimplementedDevicePluginServer

	log     hclog.Logger
	version string
	open    OpenBackend
	now     func() time.Time
	stat    func(string) (os.FileInfo, error)
	// agent and self (this binary's path) find a `plugin "nomad-device-nvidia"`
	// block in the launching agent's config (FollowAgentConfig); nil: none.
	agent AgentArgs
	self  string

	mu        sync.Mutex
	cfg       Config
	backend   Backend
	opened    chan struct{}    // closed once the backend is open
	inventory map[string]offer // last fingerprinted devices, by the id Nomad knows
}

var (
	_ basepb.BasePluginServer     = (*Plugin)(nil)
	_ devicepb.DevicePluginServer = (*Plugin)(nil)
)

// New returns a plugin that opens its backend with open.
func New(log hclog.Logger, version string, open OpenBackend) *Plugin {
	return &Plugin{
		log: log, version: version, open: open, now: time.Now, stat: os.Stat,
		cfg: DefaultConfig(), opened: make(chan struct{}), inventory: map[string]offer{},
	}
}

// FollowAgentConfig makes SetConfig apply a `plugin "nomad-device-nvidia"`
// block of the config of the agent that agent describes (adoptNDN); self is
// this binary's path, in the agent's plugin_dir.
func (p *Plugin) FollowAgentConfig(agent AgentArgs, self string) {
	p.agent, p.self = agent, self
}

// PluginInfo identifies the plugin; it must not depend on SetConfig.
func (p *Plugin) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	return &basepb.PluginInfoResponse{
		Type:              basepb.PluginType_DEVICE,
		PluginApiVersions: []string{APIVersion},
		PluginVersion:     p.version,
		Name:              Name,
	}, nil
}

// ConfigSchema returns the schema of the `config` block.
func (p *Plugin) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	return &basepb.ConfigSchemaResponse{Spec: ConfigSpec()}, nil
}

// SetConfig validates and stores the config; Nomad may call it several times.
func (p *Plugin) SetConfig(_ context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	cfg, err := DecodeConfig(req.GetMsgpackConfig())
	if err == nil && p.agent != nil {
		cfg, err = p.adoptAgentConfig(cfg)
	}
	if err != nil {
		p.log.Error("rejected plugin config", "error", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = cfg
	p.log.Debug("plugin configured", "backend", cfg.Backend, "enabled", cfg.Enabled,
		"fingerprint_period", cfg.FingerprintEvery().String(), "health_recovery", cfg.HealthRecoveryAfter().String())
	return &basepb.SetConfigResponse{}, nil
}

// adoptAgentConfig applies to cfg what a `plugin "nomad-device-nvidia"` block
// of the launching agent's config sets and ours does not (adoptNDN).
func (p *Plugin) adoptAgentConfig(cfg Config) (Config, error) {
	args, cwd, err := p.agent()
	if err != nil {
		p.log.Debug("the agent's command line was not read: its config is not searched for a nomad-device-nvidia block", "error", err)
		return cfg, nil
	}
	blocks, errs := agentPlugins(args, cwd)
	for _, err := range errs {
		p.log.Warn("a client config file naming nomad-device-nvidia was not read", "error", err)
	}
	cfg, notes, err := adoptNDN(cfg, blocks, filepath.Base(p.self), ndnBeside(p.self, p.stat))
	for _, n := range notes {
		p.log.Warn(n)
	}
	return cfg, err
}

func (p *Plugin) config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// openBackend opens the backend once; Stats waits for it through p.opened.
func (p *Plugin) openBackend(cfg Config) (Backend, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backend != nil {
		return p.backend, nil
	}
	b, err := p.open(cfg)
	if err != nil {
		return nil, err
	}
	p.backend = b
	close(p.opened)
	return b, nil
}

// Close releases the backend.
func (p *Plugin) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backend == nil {
		return nil
	}
	return p.backend.Close()
}

// Fingerprint sends the device list at once, then again whenever it changes. The
// stream stays open whatever happens: ending it would make Nomad drop every
// device of this plugin until the agent restarts.
func (p *Plugin) Fingerprint(_ *devicepb.FingerprintRequest, stream devicepb.DevicePlugin_FingerprintServer) error {
	ctx := stream.Context()
	cfg := p.config()
	if !cfg.Enabled {
		p.log.Info("plugin disabled by config, reporting no devices")
		if err := stream.Send(&devicepb.FingerprintResponse{}); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	ticker := time.NewTicker(cfg.FingerprintEvery())
	defer ticker.Stop()
	var last *devicepb.FingerprintResponse
	var scanner *scanner
	for {
		if scanner == nil {
			// A driver that is not ready yet is tried again every period;
			// meanwhile Nomad gets an empty list, never a closed stream.
			if backend, err := p.openBackend(cfg); err != nil {
				p.log.Error("cannot open the GPU backend, retrying every fingerprint period", "backend", cfg.Backend, "error", err)
			} else {
				scanner = newScanner(cfg, backend, p.log)
			}
		}
		resp, devices := &devicepb.FingerprintResponse{}, []offer(nil)
		if scanner != nil {
			resp, devices = scanner.scan(ctx, p.now())
		}
		if last == nil || !equalFingerprint(last, resp) {
			p.setInventory(devices)
			if err := stream.Send(resp); err != nil {
				return err
			}
			p.log.Debug("sent fingerprint", "devices", len(devices))
			last = resp
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (p *Plugin) setInventory(devices []offer) {
	inv := make(map[string]offer, len(devices))
	for _, d := range devices {
		inv[d.ID] = d
	}
	p.mu.Lock()
	p.inventory = inv
	p.mu.Unlock()
}

// Reserve tells Nomad how to give a task the GPUs it was allocated.
func (p *Plugin) Reserve(_ context.Context, req *devicepb.ReserveRequest) (*devicepb.ReserveResponse, error) {
	res := &devicepb.ContainerReservation{}
	ids := req.GetDeviceIds()
	if len(ids) == 0 {
		return &devicepb.ReserveResponse{ContainerRes: res}, nil
	}
	if !p.config().Enabled {
		return nil, status.Error(codes.FailedPrecondition, "nomad-device-gpu is disabled by config")
	}
	p.mu.Lock()
	var unknown, gpus []string
	var nodes []string
	for _, id := range ids {
		o, ok := p.inventory[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		if !slices.Contains(gpus, o.Device.UUID) {
			gpus = append(gpus, o.Device.UUID) // replicas of one GPU: that GPU, once
		}
		nodes = append(nodes, o.Device.DeviceNodes...)
	}
	p.mu.Unlock()
	if len(unknown) > 0 {
		return nil, status.Errorf(codes.NotFound, "reserve: unknown GPU ids %s (not in the current fingerprint)", strings.Join(unknown, ", "))
	}
	visible := strings.Join(gpus, ",")
	// UUIDs, not indices: CUDA_VISIBLE_DEVICES indices would be renumbered inside
	// a container that sees only these GPUs, UUIDs mean the same GPU everywhere.
	res.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": visible, "CUDA_VISIBLE_DEVICES": visible}
	if len(nodes) > 0 {
		nodes = append(nodes, controlDeviceNodes...)
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n] {
			continue
		}
		seen[n] = true
		if _, err := p.stat(n); err != nil {
			continue // exec-style drivers need only the nodes this host has
		}
		res.Devices = append(res.Devices, &devicepb.DeviceSpec{TaskPath: n, HostPath: n, Permissions: "rwm"})
	}
	return &devicepb.ReserveResponse{ContainerRes: res}, nil
}

// controlDeviceNodes are shared by every GPU of a host and needed by CUDA.
var controlDeviceNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// Stats streams statistics of the fingerprinted devices every interval.
func (p *Plugin) Stats(req *devicepb.StatsRequest, stream devicepb.DevicePlugin_StatsServer) error {
	ctx := stream.Context()
	interval := p.config().StatsEvery()
	if interval == 0 {
		interval = req.GetCollectionInterval().AsDuration()
	}
	if interval <= 0 {
		interval = time.Second
	}
	select {
	case <-p.opened:
	case <-ctx.Done():
		return nil
	}
	p.mu.Lock()
	backend := p.backend
	p.mu.Unlock()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if resp := p.collectStats(ctx, backend); len(resp.Groups) > 0 {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (p *Plugin) collectStats(ctx context.Context, backend Backend) *devicepb.StatsResponse {
	samples, err := backend.Stats(ctx)
	if err != nil {
		p.log.Warn("cannot read GPU statistics", "error", err)
	}
	p.mu.Lock()
	inventory := p.inventory
	p.mu.Unlock()
	return statsResponse(inventory, samples, p.now())
}

// NoDevices is the backend of a host without GPUs.
type NoDevices struct{}

func (NoDevices) Devices(context.Context) ([]gpu.Device, error)         { return nil, nil }
func (NoDevices) Health(context.Context) (map[string]gpu.Health, error) { return nil, nil }
func (NoDevices) Stats(context.Context) ([]gpu.Stats, error)            { return nil, nil }
func (NoDevices) Close() error                                          { return nil }

var _ Backend = NoDevices{}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
