package plugin

import (
	"context"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	basepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/base"
	devicepb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/device"
)

// Handshake is Nomad's go-plugin handshake for every external plugin.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  2,
	MagicCookieKey:   "NOMAD_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255",
}

// Serve runs the plugin until Nomad stops it. The plugin-set names never cross
// the wire: one entry registering both services serves whatever Nomad dispenses.
func Serve(p *Plugin) {
	defer p.Close()
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{"device": grpcPlugin{p: p}},
		GRPCServer:      goplugin.DefaultGRPCServer,
		Logger:          p.log,
	})
}

// grpcPlugin adapts Plugin to go-plugin; only the server side is ever used.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	p *Plugin
}

var _ goplugin.GRPCPlugin = grpcPlugin{}

func (g grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	basepb.RegisterBasePluginServer(s, g.p)
	devicepb.RegisterDevicePluginServer(s, g.p)
	return nil
}

func (grpcPlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}
