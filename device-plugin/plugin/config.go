package plugin

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	hclspecpb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/hclspec"
)

// Backends the plugin can use.
const (
	BackendAuto = "auto" // NVML when libnvidia-ml loads, else no devices
	BackendNVML = "nvml"
	BackendFake = "fake"
)

// DefaultIgnoredXIDs are XIDs that an application causes (bad memory access,
// a killed context...): they say nothing about the GPU's health.
var DefaultIgnoredXIDs = []int{13, 31, 43, 45, 68, 109}

// Config is the plugin's `config` block, as Nomad decodes it with ConfigSchema.
type Config struct {
	Enabled           bool       `msgpack:"enabled"`
	Backend           string     `msgpack:"backend"`
	FingerprintPeriod string     `msgpack:"fingerprint_period"`
	StatsPeriod       string     `msgpack:"stats_period"`
	IgnoredGPUIDs     []string   `msgpack:"ignored_gpu_ids"`
	IgnoredXIDs       []int      `msgpack:"ignored_xids"`
	HealthRecovery    string     `msgpack:"health_recovery"`
	Fake              FakeConfig `msgpack:"fake"`
	// Sharing offers GPUs as time-sliced replicas.
	Sharing SharingConfig `msgpack:"sharing"`
	// IslandGroups offers each NVLink island (GPUs without NVLink: each
	// NUMA node) as a device group of its own, "<model> (island N)": Nomad
	// takes every GPU of one request from one group.
	IslandGroups bool `msgpack:"island_groups"`

	// Parsed durations, filled by Validate.
	fingerprintPeriod time.Duration
	statsPeriod       time.Duration
	healthRecovery    time.Duration
}

// FakeConfig is the `fake { ... }` block: simulated GPUs.
type FakeConfig struct {
	Count     int    `msgpack:"count"`
	Model     string `msgpack:"model"`
	MemoryMiB int64  `msgpack:"memory_mib"`
	IDPrefix  string `msgpack:"id_prefix"`
	StateFile string `msgpack:"state_file"`
	// Islands splits the GPUs into this many NVLink islands, in order, and
	// NUMA nodes with them (1: one island, as on an NVSwitch machine).
	Islands int `msgpack:"islands"`
}

// SharingConfig is the `sharing { ... }` block: each of the first GPUs GPUs of
// the node (by PCI bus id; 0: all) is offered as Replicas devices of a
// separate "(shared)" group instead of whole (Replicas 0: no sharing).
type SharingConfig struct {
	Replicas int `msgpack:"replicas"`
	GPUs     int `msgpack:"gpus"`
}

// MaxReplicas bounds the replicas of one GPU.
const MaxReplicas = 64

// DefaultConfig is what an absent `config` block means.
func DefaultConfig() Config {
	return Config{
		Enabled:           true,
		Backend:           BackendAuto,
		FingerprintPeriod: "1m",
		HealthRecovery:    "5m",
		IgnoredXIDs:       append([]int(nil), DefaultIgnoredXIDs...),
		Fake:              FakeConfig{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Islands: 1},
	}
}

// FingerprintEvery is how often devices and their health are scanned.
func (c Config) FingerprintEvery() time.Duration { return c.fingerprintPeriod }

// StatsEvery is the stats period the operator set, or 0 to follow Nomad's collection interval.
func (c Config) StatsEvery() time.Duration { return c.statsPeriod }

// HealthRecoveryAfter is how long a device must stay clean before it is healthy again.
func (c Config) HealthRecoveryAfter() time.Duration { return c.healthRecovery }

// DecodeConfig reads the msgpack bytes of SetConfig over the defaults and validates them.
func DecodeConfig(b []byte) (Config, error) {
	cfg := DefaultConfig()
	if len(b) > 0 {
		// Nomad fills every key from the schema; a nil value (an absent fake block) keeps ours.
		var raw map[string]msgpack.RawMessage
		if err := msgpack.Unmarshal(b, &raw); err != nil {
			return cfg, fmt.Errorf("decode plugin config: %w", err)
		}
		for key, v := range raw {
			if err := decodeKey(&cfg, key, v); err != nil {
				return cfg, err
			}
		}
	}
	return cfg, cfg.Validate()
}

// isNil reports a msgpack nil, which the decoder hands back as an empty RawMessage.
func isNil(m msgpack.RawMessage) bool { return len(m) == 0 || (len(m) == 1 && m[0] == 0xc0) }

func decodeKey(cfg *Config, key string, v msgpack.RawMessage) error {
	var dst any
	switch key {
	case "enabled":
		dst = &cfg.Enabled
	case "backend":
		dst = &cfg.Backend
	case "fingerprint_period":
		dst = &cfg.FingerprintPeriod
	case "stats_period":
		dst = &cfg.StatsPeriod
	case "ignored_gpu_ids":
		dst = &cfg.IgnoredGPUIDs
	case "ignored_xids":
		dst = &cfg.IgnoredXIDs
	case "health_recovery":
		dst = &cfg.HealthRecovery
	case "fake":
		dst = &cfg.Fake
	case "sharing":
		dst = &cfg.Sharing
	case "island_groups":
		dst = &cfg.IslandGroups
	default:
		return fmt.Errorf("plugin config: unknown option %q", key)
	}
	if isNil(v) {
		return nil
	}
	if err := msgpack.Unmarshal(v, dst); err != nil {
		return fmt.Errorf("plugin config: option %q: %w", key, err)
	}
	return nil
}

// Validate checks every option and parses the durations; errors name the option.
func (c *Config) Validate() error {
	var errs []error
	switch c.Backend {
	case BackendAuto, BackendNVML, BackendFake:
	default:
		errs = append(errs, fmt.Errorf("option backend: %q is not one of %q, %q, %q", c.Backend, BackendAuto, BackendNVML, BackendFake))
	}
	parse := func(name, value string, dst *time.Duration, allowEmpty bool) {
		if value == "" && allowEmpty {
			*dst = 0
			return
		}
		d, err := time.ParseDuration(value)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("option %s: %q is not a duration such as \"30s\" or \"1m\"", name, value))
		case d <= 0 && !(allowEmpty && d == 0):
			errs = append(errs, fmt.Errorf("option %s: %q must be positive", name, value))
		default:
			*dst = d
		}
	}
	parse("fingerprint_period", c.FingerprintPeriod, &c.fingerprintPeriod, false)
	parse("stats_period", c.StatsPeriod, &c.statsPeriod, true)
	parse("health_recovery", c.HealthRecovery, &c.healthRecovery, true)
	for _, x := range c.IgnoredXIDs {
		if x <= 0 {
			errs = append(errs, fmt.Errorf("option ignored_xids: %d is not an XID", x))
		}
	}
	if c.Fake.Count < 0 || c.Fake.Count > 4096 {
		errs = append(errs, fmt.Errorf("option fake.count: %d is outside 0..4096", c.Fake.Count))
	}
	if c.Fake.Model == "" {
		errs = append(errs, errors.New("option fake.model: must not be empty"))
	}
	if r := c.Sharing.Replicas; r != 0 && (r < 2 || r > MaxReplicas) {
		errs = append(errs, fmt.Errorf("option sharing.replicas: %d is outside 2..%d (0: no sharing)", r, MaxReplicas))
	}
	if c.Sharing.GPUs < 0 {
		errs = append(errs, fmt.Errorf("option sharing.gpus: %d must be 0 (all) or more", c.Sharing.GPUs))
	}
	if c.Fake.Islands < 1 || (c.Fake.Count > 0 && c.Fake.Islands > c.Fake.Count) {
		errs = append(errs, fmt.Errorf("option fake.islands: %d is outside 1..%d (fake.count)", c.Fake.Islands, max(c.Fake.Count, 1)))
	}
	if c.Fake.MemoryMiB <= 0 {
		errs = append(errs, fmt.Errorf("option fake.memory_mib: %d must be positive", c.Fake.MemoryMiB))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid nomad-device-gpu config: %w", err)
	}
	return nil
}

// ConfigSpec is the schema Nomad decodes the `config` block with: unknown keys are
// refused by Nomad itself, and each option has its default here.
func ConfigSpec() *hclspecpb.Spec {
	d := DefaultConfig()
	return object(map[string]*hclspecpb.Spec{
		"enabled":            withDefault("enabled", "bool", "true"),
		"backend":            withDefault("backend", "string", fmt.Sprintf("%q", d.Backend)),
		"fingerprint_period": withDefault("fingerprint_period", "string", fmt.Sprintf("%q", d.FingerprintPeriod)),
		"stats_period":       withDefault("stats_period", "string", `""`),
		"ignored_gpu_ids":    withDefault("ignored_gpu_ids", "list(string)", "[]"),
		"ignored_xids":       withDefault("ignored_xids", "list(number)", hclList(d.IgnoredXIDs)),
		"health_recovery":    withDefault("health_recovery", "string", fmt.Sprintf("%q", d.HealthRecovery)),
		"island_groups":      withDefault("island_groups", "bool", "false"),
		"fake": {Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{
			Name: "fake",
			Nested: object(map[string]*hclspecpb.Spec{
				"count":      withDefault("count", "number", fmt.Sprint(d.Fake.Count)),
				"model":      withDefault("model", "string", fmt.Sprintf("%q", d.Fake.Model)),
				"memory_mib": withDefault("memory_mib", "number", fmt.Sprint(d.Fake.MemoryMiB)),
				"id_prefix":  withDefault("id_prefix", "string", `""`),
				"state_file": withDefault("state_file", "string", `""`),
				"islands":    withDefault("islands", "number", fmt.Sprint(d.Fake.Islands)),
			}),
		}}},
		"sharing": {Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{
			Name: "sharing",
			Nested: object(map[string]*hclspecpb.Spec{
				"replicas": withDefault("replicas", "number", "0"),
				"gpus":     withDefault("gpus", "number", "0"),
			}),
		}}},
	})
}

func object(attrs map[string]*hclspecpb.Spec) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Object{Object: &hclspecpb.Object{Attributes: attrs}}}
}

// withDefault is an optional attribute: the name is repeated because Nomad gives
// no implied name to the primary of a default.
func withDefault(name, typ, literal string) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Default{Default: &hclspecpb.Default{
		Primary: &hclspecpb.Spec{Block: &hclspecpb.Spec_Attr{Attr: &hclspecpb.Attr{Name: name, Type: typ}}},
		Default: &hclspecpb.Spec{Block: &hclspecpb.Spec_Literal{Literal: &hclspecpb.Literal{Value: literal}}},
	}}}
}

func hclList(xs []int) string {
	s := "["
	for i, x := range xs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(x)
	}
	return s + "]"
}
