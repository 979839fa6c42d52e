// Package check drives the device plugin the way Nomad does, over go-plugin
// gRPC, with no Nomad: it starts the plugin binary, configures it, and
// prints its fingerprint, some seconds of stats, its health and a
// reservation. `nomad-device-gpu check` (make gpu-check) runs it on a machine
// with a real GPU and only the NVIDIA driver.
package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/plugin"
	basepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/base"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
	structspb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/structs"
)

// Options say which plugin to check and how.
type Options struct {
	// Plugin is the plugin binary's path; Args its arguments (none: it serves).
	Plugin string
	Args   []string
	// Config is the plugin's config block, as Nomad would send it.
	Config map[string]any
	// StatsFor is how long stats are read, one collection a second.
	StatsFor time.Duration
	// Log receives the plugin's own log lines (nil: dropped).
	Log hclog.Logger
}

// Run checks the plugin and writes what it saw to w; any error of the
// plugin's is returned (and the check is a failure).
// Long: the plugin driven in Nomad's order, each step printed as it runs.
func Run(ctx context.Context, w io.Writer, o Options) error {
	log := o.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake,
		Plugins:          goplugin.PluginSet{"device": conn{}},
		Cmd:              exec.Command(o.Plugin, o.Args...),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           log,
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		return fmt.Errorf("start plugin %s: %w", o.Plugin, err)
	}
	raw, err := rpc.Dispense("device")
	if err != nil {
		return fmt.Errorf("connect to plugin: %w", err)
	}
	cc := raw.(*grpc.ClientConn)
	base, device := basepb.NewBasePluginClient(cc), devicepb.NewDevicePluginClient(cc)

	info, err := base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("plugin info: %w", err)
	}
	fmt.Fprintf(w, "plugin: %s %s (type %s, API %s)\n", info.Name, info.PluginVersion, info.Type, strings.Join(info.PluginApiVersions, ", "))
	config, err := msgpack.Marshal(o.Config)
	if err != nil {
		return err
	}
	if _, err := base.SetConfig(ctx, &basepb.SetConfigRequest{MsgpackConfig: config, PluginApiVersion: "v0.1.0"}); err != nil {
		return fmt.Errorf("set config %v: %w", o.Config, err)
	}

	fp, err := fingerprint(ctx, device)
	if err != nil {
		return err
	}
	var ids []string
	fmt.Fprintln(w, "\nfingerprint:")
	for _, g := range fp.DeviceGroup {
		fmt.Fprintf(w, "  group %s/%s/%s: %d devices\n", g.Vendor, g.DeviceType, g.DeviceName, len(g.Devices))
		for _, name := range slices.Sorted(maps.Keys(g.Attributes)) {
			fmt.Fprintf(w, "    %-20s %s\n", name, attribute(g.Attributes[name]))
		}
		for _, d := range g.Devices {
			pci := ""
			if d.HwLocality != nil {
				pci = d.HwLocality.PciBusId
			}
			fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("    device %s  pci %s  healthy %t %s", d.ID, pci, d.Healthy, d.HealthDescription), " "))
			if d.Healthy {
				ids = append(ids, d.ID)
			}
		}
	}
	if len(ids) == 0 {
		return errors.New("the plugin fingerprinted no healthy GPU")
	}

	if err := stats(ctx, w, device, o.StatsFor); err != nil {
		return err
	}

	res, err := device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: ids[:1]})
	if err != nil {
		return fmt.Errorf("reserve %s: %w", ids[0], err)
	}
	fmt.Fprintf(w, "\nreserve %s:\n", ids[0])
	cr := res.ContainerRes
	for _, k := range slices.Sorted(maps.Keys(cr.GetEnvs())) {
		fmt.Fprintf(w, "  env    %s=%s\n", k, cr.Envs[k])
	}
	for _, d := range cr.GetDevices() {
		fmt.Fprintf(w, "  device %s -> %s (%s)\n", d.HostPath, d.TaskPath, d.Permissions)
	}
	for _, m := range cr.GetMounts() {
		fmt.Fprintf(w, "  mount  %s -> %s (read-only %t)\n", m.HostPath, m.TaskPath, m.ReadOnly)
	}
	fmt.Fprintln(w, "\nok")
	return nil
}

// fingerprint is the plugin's first fingerprint (it sends one at once, then
// on every change).
func fingerprint(ctx context.Context, device devicepb.DevicePluginClient) (*devicepb.FingerprintResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, err := device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	fp, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	return fp, nil
}

// stats prints each collection of the stats stream for d.
func stats(ctx context.Context, w io.Writer, device devicepb.DevicePluginClient, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stream, err := device.Stats(ctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(time.Second)})
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	fmt.Fprintf(w, "\nstats, every second for %s:\n", d)
	deadline, _ := ctx.Deadline()
	for n := 0; ; n++ {
		resp, err := stream.Recv()
		// The plugin ends the stream at the deadline it was sent, which a
		// busy machine can deliver before this context's own timer has run.
		if ctx.Err() != nil || (err != nil && !time.Now().Before(deadline)) {
			if n == 0 {
				return errors.New("stats: none within " + d.String())
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		for _, g := range resp.Groups {
			for _, id := range slices.Sorted(maps.Keys(g.InstanceStats)) {
				s := g.InstanceStats[id]
				var parts []string
				for _, name := range slices.Sorted(maps.Keys(s.GetStats().GetAttributes())) {
					parts = append(parts, name+" "+stat(s.Stats.Attributes[name]))
				}
				fmt.Fprintf(w, "  %s %s: %s; %s\n", s.GetTimestamp().AsTime().Format("15:04:05"), id, stat(s.Summary), strings.Join(parts, ", "))
			}
		}
	}
}

func attribute(a *structspb.Attribute) string {
	var v string
	switch x := a.GetValue().(type) {
	case *structspb.Attribute_FloatVal:
		v = fmt.Sprint(x.FloatVal)
	case *structspb.Attribute_IntVal:
		v = fmt.Sprint(x.IntVal)
	case *structspb.Attribute_StringVal:
		v = x.StringVal
	case *structspb.Attribute_BoolVal:
		v = fmt.Sprint(x.BoolVal)
	}
	if a.GetUnit() != "" {
		v += " " + a.Unit
	}
	return v
}

func stat(s *structspb.StatValue) string {
	var v string
	switch {
	case s == nil:
		return "-"
	case s.StringVal != nil:
		v = s.StringVal.GetValue()
	case s.IntNumeratorVal != nil:
		v = fmt.Sprint(s.IntNumeratorVal.GetValue())
		if s.IntDenominatorVal != nil {
			v += "/" + fmt.Sprint(s.IntDenominatorVal.GetValue())
		}
	case s.FloatNumeratorVal != nil:
		v = fmt.Sprintf("%.1f", s.FloatNumeratorVal.GetValue())
		if s.FloatDenominatorVal != nil {
			v += fmt.Sprintf("/%.1f", s.FloatDenominatorVal.GetValue())
		}
	case s.BoolVal != nil:
		v = fmt.Sprint(s.BoolVal.GetValue())
	}
	if s.Unit != "" {
		v += " " + s.Unit
	}
	return v
}

// conn is the client side of the plugin set: the gRPC connection itself.
type conn struct {
	goplugin.NetRPCUnsupportedPlugin
}

func (conn) GRPCServer(*goplugin.GRPCBroker, *grpc.Server) error { return nil }

func (conn) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return cc, nil
}
