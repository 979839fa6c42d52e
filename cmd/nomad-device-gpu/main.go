// Command nomad-device-gpu is a Nomad device plugin for NVIDIA GPUs: Nomad starts
// it from its plugin_dir and talks to it over go-plugin gRPC.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/device-plugin/check"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/fake"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/nvml"
	"github.com/nomad-gpu/nomad-gpu/device-plugin/plugin"
	"github.com/nomad-gpu/nomad-gpu/internal/version"
)

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.String(plugin.Name))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(runCheck(os.Args[2:]))
	}
	// Created before Serve swaps os.Stderr: Nomad reads these JSON lines from the
	// real stderr and re-logs them at their level.
	log := hclog.New(&hclog.LoggerOptions{Name: plugin.Name, Level: hclog.Trace, JSONFormat: true, Output: os.Stderr})
	p := plugin.New(log, version.Version, func(cfg plugin.Config) (plugin.Backend, error) {
		return openBackend(cfg, log)
	})
	if self, err := os.Executable(); err == nil {
		p.FollowAgentConfig(plugin.ParentAgent, self)
	}
	plugin.Serve(p)
}

// openBackend picks the backend: auto means NVML where libnvidia-ml loads, else none.
func openBackend(cfg plugin.Config, log hclog.Logger) (plugin.Backend, error) {
	switch cfg.Backend {
	case plugin.BackendFake:
		f := cfg.Fake
		log.Info("using simulated GPUs", "count", f.Count, "model", f.Model, "state_file", f.StateFile)
		return fake.New(fake.Config{Count: f.Count, Model: f.Model, MemoryMiB: f.MemoryMiB,
			IDPrefix: f.IDPrefix, StateFile: f.StateFile, Islands: f.Islands}, log.Named("fake")), nil
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

// runCheck is `nomad-device-gpu check`: this binary started as the plugin
// and driven as Nomad would, with no Nomad (make gpu-check).
func runCheck(args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	backend := fs.String("backend", plugin.BackendNVML, "the plugin's backend: nvml, fake or auto")
	config := fs.String("config", "", "more of the plugin's config block, as JSON (for example {\"fake\":{\"count\":2}})")
	statsFor := fs.Duration("stats", 10*time.Second, "how long to read stats")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: nomad-device-gpu check [-backend nvml|fake|auto] [-config JSON] [-stats 10s]")
		return 2
	}
	cfg := map[string]any{}
	if *config != "" {
		// Numbers as Nomad sends them: a whole number is an integer.
		dec := json.NewDecoder(strings.NewReader(*config))
		dec.UseNumber()
		if err := dec.Decode(&cfg); err != nil {
			fmt.Fprintln(os.Stderr, "nomad-device-gpu check: -config:", err)
			return 2
		}
		cfg = integers(cfg).(map[string]any)
	}
	cfg["backend"] = *backend
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nomad-device-gpu check:", err)
		return 1
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn, Output: os.Stderr})
	if err := check.Run(context.Background(), os.Stdout, check.Options{Plugin: self, Config: cfg, StatsFor: *statsFor, Log: log}); err != nil {
		fmt.Fprintln(os.Stderr, "nomad-device-gpu check: FAILED:", err)
		return 1
	}
	return 0
}

// integers turns the JSON numbers in v into int64 where whole, else float64.
func integers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = integers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = integers(e)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	}
	return v
}
