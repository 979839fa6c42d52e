// Command nomad-device-gpu is a Nomad device plugin for NVIDIA GPUs: Nomad starts
// it from its plugin_dir and talks to it over go-plugin gRPC.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/nvml"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/plugin"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(plugin.Name, version)
		return
	}
	// Created before Serve swaps os.Stderr: Nomad reads these JSON lines from the
	// real stderr and re-logs them at their level.
	log := hclog.New(&hclog.LoggerOptions{Name: plugin.Name, Level: hclog.Trace, JSONFormat: true, Output: os.Stderr})
	plugin.Serve(plugin.New(log, version, func(cfg plugin.Config) (plugin.Backend, error) {
		return openBackend(cfg, log)
	}))
}

// openBackend picks the backend: auto means NVML where libnvidia-ml loads, else none.
func openBackend(cfg plugin.Config, log hclog.Logger) (plugin.Backend, error) {
	switch cfg.Backend {
	case plugin.BackendFake:
		f := cfg.Fake
		log.Info("using simulated GPUs", "count", f.Count, "model", f.Model, "state_file", f.StateFile)
		return fake.New(fake.Config{Count: f.Count, Model: f.Model, MemoryMiB: f.MemoryMiB,
			IDPrefix: f.IDPrefix, StateFile: f.StateFile}, log.Named("fake")), nil
	case plugin.BackendNVML:
		return nvml.Open(nvml.Options{IgnoredXIDs: cfg.IgnoredXIDs}, log.Named("nvml"))
	default:
		b, err := nvml.Open(nvml.Options{IgnoredXIDs: cfg.IgnoredXIDs}, log.Named("nvml"))
		if errors.Is(err, nvml.ErrLibraryNotFound) {
			log.Info("backend auto: libnvidia-ml is not installed on this host, reporting no GPUs")
			return plugin.NoDevices{}, nil
		}
		return b, err
	}
}
