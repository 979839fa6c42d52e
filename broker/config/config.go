// Package config reads the broker's own configuration (broker.hcl): where it
// listens, where its policies are, and how it reaches Nomad and Consul.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// Config is the broker's configuration after defaults and environment.
type Config struct {
	Listen string `hcl:"listen,optional"`
	// Advertise is where the other brokers reach this one (GPU admissions go
	// to the leader); default: http:// and Listen.
	Advertise string `hcl:"advertise,optional"`
	PolicyDir string `hcl:"policy_dir,optional"`
	// Resync is how often the cluster view is listed again in full (a purged
	// job sends no event); default 1m.
	Resync         string        `hcl:"resync,optional"`
	ResyncInterval time.Duration // Resync, parsed by Validate
	// QueueInterval is how often the leader passes through the queue when
	// the cluster has not changed (a job queued by another broker is found
	// then); default 2s.
	QueueInterval         string        `hcl:"queue_interval,optional"`
	QueueIntervalDuration time.Duration // QueueInterval, parsed by Validate
	// PolicyPoll is how often the policy directory is checked for changes
	// (SIGHUP reads it at once); default 2s.
	PolicyPoll         string        `hcl:"policy_poll,optional"`
	PolicyPollInterval time.Duration // PolicyPoll, parsed by Validate
	// AllowPolicyWithoutTenants lets a reload take a policy that has no
	// tenants while the one in force has some; off by default, since that is
	// what an empty or truncated file (a template rendered empty) reads as.
	AllowPolicyWithoutTenants bool `hcl:"allow_policy_without_tenants,optional"`
	// PreemptionReassert is how often the leader sets Nomad's preemption
	// config again (someone may have changed it); default 30s.
	PreemptionReassert         string        `hcl:"preemption_reassert,optional"`
	PreemptionReassertInterval time.Duration // PreemptionReassert, parsed by Validate
	// BodyReadTimeout is how long the body of a call the broker decides on
	// may take to arrive (a client that stalls holds a slot no longer);
	// default 30s.
	BodyReadTimeout         string        `hcl:"body_read_timeout,optional"`
	BodyReadTimeoutDuration time.Duration // BodyReadTimeout, parsed by Validate
	// MaxQueueBytes bounds the register requests all queued jobs keep in
	// Consul together (each tenant's max_queued_request_bytes bounds one):
	// a submission beyond it is refused, before Consul or the brokers, each
	// of which mirrors the queue, run out of memory. Default 256 MiB.
	MaxQueueBytes int64 `hcl:"max_queue_bytes,optional"`
	// Enforcement is "passthrough" (users keep their own job-write rights in
	// Nomad) or "exclusive" (only the broker's token writes jobs in tenant
	// namespaces, for the callers policy names as submitters).
	Enforcement string `hcl:"enforcement,optional"`
	// TLS serves the broker's own listener over HTTPS; its CA file, when
	// given, is what the brokers trust in each other (a follower sends GPU
	// requests to the leader's advertise address).
	TLS    *TLS    `hcl:"tls,block"`
	Nomad  *Nomad  `hcl:"nomad,block"`
	Consul *Consul `hcl:"consul,block"`
	// Regions are the Nomad regions the broker governs besides its own (the
	// nomad block's): one quota, queue and ledger over all of them. A block
	// named as its own region may be given, empty.
	Regions []*Region `hcl:"region,block"`
	// Audit is the audit trail's file (nil: none kept).
	Audit *Audit `hcl:"audit,block"`
	// EnableDebug serves Go's profiler at /debug/pprof/ on the listener, as
	// Nomad's enable_debug does; off by default, since anyone who reaches the
	// listener could read it.
	EnableDebug bool `hcl:"enable_debug,optional"`
}

// Audit is where the audit trail is written: path, rotated to path.1 …
// path.<max_files> when it would grow past max_bytes.
type Audit struct {
	Path     string `hcl:"path"`
	MaxBytes int64  `hcl:"max_bytes,optional"`
	MaxFiles int    `hcl:"max_files,optional"`
}

// Nomad is how the broker reaches Nomad's HTTP API.
type Nomad struct {
	Address string `hcl:"address,optional"`
	Token   string `hcl:"token,optional"`
	// TokenFile holds the token instead (one written by Vault agent or a
	// template): read at start and again on SIGHUP, so that a revoked or
	// rotated token is replaced without a restart.
	TokenFile string `hcl:"token_file,optional"`
	// Region is the Nomad region the broker admits GPU jobs for; empty: the
	// region of the Nomad agent at Address.
	Region string `hcl:"region,optional"`
	TLS    *TLS   `hcl:"tls,block"`
}

// Region is one more Nomad region the broker governs.
type Region struct {
	Name string `hcl:"name,label"`
	// Address is a server of that region, reached with the nomad block's
	// token and TLS; empty: through the nomad block's agent, which forwards
	// a call naming another region to that region's servers.
	Address string `hcl:"address,optional"`
}

// Consul is how the broker reaches Consul, and where its keys live.
type Consul struct {
	Address  string `hcl:"address,optional"`
	Token    string `hcl:"token,optional"`
	KVPrefix string `hcl:"kv_prefix,optional"`
	TLS      *TLS   `hcl:"tls,block"`
}

// TLS files: for a client connection, CA to trust and client certificate;
// for the listener, its certificate.
type TLS struct {
	CAFile   string `hcl:"ca_file,optional"`
	CertFile string `hcl:"cert_file,optional"`
	KeyFile  string `hcl:"key_file,optional"`
}

// Defaults.
const (
	DefaultListen   = "127.0.0.1:4649"
	DefaultNomad    = "http://127.0.0.1:4646"
	DefaultConsul   = "127.0.0.1:8500"
	DefaultKVPrefix = "nomad-gpu/"
	// The audit file rotates at 100 MiB, and ten rotated files are kept.
	DefaultAuditMaxBytes = 100 << 20
	DefaultAuditMaxFiles = 10
	// MaxAuditFiles bounds audit.max_files: a read of the trail goes
	// through every file (2,000,000 took 7.3 s and 299 MiB).
	MaxAuditFiles = 1000
	// DefaultMaxQueueBytes: 10,000 jobs of 25 KB, about.
	DefaultMaxQueueBytes = 256 << 20
)

// Enforcement modes.
const (
	Passthrough = "passthrough"
	Exclusive   = "exclusive"
)

// Load reads path (empty: no file), fills what it leaves out from NOMAD_ADDR,
// NOMAD_TOKEN, CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and the defaults, and validates.
func Load(path string) (*Config, error) {
	c := &Config{}
	at := map[string]hcl.Range{} // where each setting the file gives is
	if path != "" {
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read broker config: %w", err)
		}
		f, diags := policyhcl.ParseFile(src, path)
		if !diags.HasErrors() {
			diags = gohcl.DecodeBody(f.Body, nil, c)
		}
		if diags.HasErrors() {
			return nil, fmt.Errorf("broker config:\n%s", strings.TrimSpace(policyhcl.FormatDiagnostics(diags)))
		}
		settings(f.Body.(*hclsyntax.Body), "", at)
	}
	c.fill(os.Getenv)
	if err := c.Validate(); err != nil {
		if r, ok := at[settingKey(err)]; ok {
			return nil, fmt.Errorf("broker config: %s:%d:%d: %s", r.Filename, r.Start.Line, r.Start.Column, strings.TrimPrefix(err.Error(), "broker config: "))
		}
		return nil, err
	}
	return c, nil
}

// settings records where body gives each setting, by its key ("nomad.address";
// a block by its name, "audit").
func settings(body *hclsyntax.Body, prefix string, at map[string]hcl.Range) {
	for name, a := range body.Attributes {
		at[prefix+name] = a.SrcRange
	}
	for _, b := range body.Blocks {
		name := prefix + b.Type
		if len(b.Labels) > 0 {
			name += "." + b.Labels[0] // region "west": region.west
		}
		at[name] = b.DefRange()
		settings(b.Body, name+".", at)
	}
}

// settingError is a setting Validate refused, by its key.
type settingError struct {
	key string
	err error
}

func (e *settingError) Error() string { return "broker config: " + e.err.Error() }

// settingKey is the key of the setting err refuses ("" if none).
func settingKey(err error) string {
	var se *settingError
	if errors.As(err, &se) {
		return se.key
	}
	return ""
}

func refuse(key, format string, args ...any) error {
	return &settingError{key: key, err: fmt.Errorf(format, args...)}
}

func (c *Config) fill(env func(string) string) {
	if c.Nomad == nil {
		c.Nomad = &Nomad{}
	}
	if c.Consul == nil {
		c.Consul = &Consul{}
	}
	first := func(dst *string, values ...string) {
		for _, v := range values {
			if *dst == "" {
				*dst = v
			}
		}
	}
	first(&c.Listen, DefaultListen)
	scheme := "http://"
	if c.TLS != nil {
		scheme = "https://"
	}
	first(&c.Advertise, scheme+c.Listen)
	first(&c.PolicyDir, "policies")
	first(&c.Resync, "1m")
	first(&c.QueueInterval, "2s")
	first(&c.PolicyPoll, "2s")
	first(&c.PreemptionReassert, "30s")
	first(&c.BodyReadTimeout, "30s")
	first(&c.Enforcement, Passthrough)
	if c.MaxQueueBytes == 0 {
		c.MaxQueueBytes = DefaultMaxQueueBytes
	}
	first(&c.Nomad.Address, env("NOMAD_ADDR"), DefaultNomad)
	if c.Nomad.TokenFile == "" {
		first(&c.Nomad.Token, env("NOMAD_TOKEN"))
	}
	first(&c.Consul.Address, env("CONSUL_HTTP_ADDR"), DefaultConsul)
	first(&c.Consul.Token, env("CONSUL_HTTP_TOKEN"))
	first(&c.Consul.KVPrefix, DefaultKVPrefix)
	if !strings.HasSuffix(c.Consul.KVPrefix, "/") {
		c.Consul.KVPrefix += "/"
	}
}

// Validate checks what can be checked without connecting.
func (c *Config) Validate() error {
	for _, d := range []struct {
		key, value string
		least      time.Duration
		out        *time.Duration
	}{
		{"resync", c.Resync, time.Second, &c.ResyncInterval},
		{"queue_interval", c.QueueInterval, 10 * time.Millisecond, &c.QueueIntervalDuration},
		{"policy_poll", c.PolicyPoll, 10 * time.Millisecond, &c.PolicyPollInterval},
		{"preemption_reassert", c.PreemptionReassert, 10 * time.Millisecond, &c.PreemptionReassertInterval},
		{"body_read_timeout", c.BodyReadTimeout, 10 * time.Millisecond, &c.BodyReadTimeoutDuration},
	} {
		v, err := time.ParseDuration(d.value)
		if err != nil || v < d.least {
			return refuse(d.key, "%s %q is not a duration of at least %s", d.key, d.value, d.least)
		}
		*d.out = v
	}
	if c.MaxQueueBytes < 1<<20 {
		return refuse("max_queue_bytes", "max_queue_bytes %d is below 1 MiB (1048576): the queue would hold next to nothing", c.MaxQueueBytes)
	}
	if c.Enforcement != Passthrough && c.Enforcement != Exclusive {
		return refuse("enforcement", "enforcement %q is neither %q nor %q", c.Enforcement, Passthrough, Exclusive)
	}
	if c.TLS != nil && (c.TLS.CertFile == "" || c.TLS.KeyFile == "") {
		return refuse("tls", "tls needs cert_file and key_file to serve the broker's listener")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return refuse("listen", "listen %q is not host:port: %w", c.Listen, err)
	}
	if !strings.HasPrefix(c.Nomad.Address, "http://") && !strings.HasPrefix(c.Nomad.Address, "https://") {
		return refuse("nomad.address", "nomad.address %q must start with http:// or https://", c.Nomad.Address)
	}
	if err := c.validateRegions(); err != nil {
		return err
	}
	if c.Nomad.TokenFile != "" {
		if c.Nomad.Token != "" {
			return refuse("nomad.token_file", "nomad.token_file and nomad.token are both set: give one")
		}
		tok, err := c.Nomad.ReadToken()
		if err != nil {
			return refuse("nomad.token_file", "%w", err)
		}
		c.Nomad.Token = tok
	}
	if a := c.Audit; a != nil {
		if a.MaxBytes == 0 {
			a.MaxBytes = DefaultAuditMaxBytes
		}
		if a.MaxFiles == 0 {
			a.MaxFiles = DefaultAuditMaxFiles
		}
		if a.Path == "" || a.MaxBytes < 4096 || a.MaxFiles < 1 || a.MaxFiles > MaxAuditFiles {
			return refuse("audit", "audit needs a path, max_bytes of at least 4096 and max_files from 1 to %d (a read goes through every file)", MaxAuditFiles)
		}
	}
	if u, err := url.Parse(c.Advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return refuse("advertise", "advertise %q is not an http:// or https:// address the other brokers can reach", c.Advertise)
	}
	if p := c.Consul.KVPrefix; p == "/" || strings.HasPrefix(p, "/") || slices.Contains(strings.Split(p, "/"), "..") ||
		slices.Contains(strings.Split(p, "/"), ".") || strings.Contains(p, "//") {
		return refuse("consul.kv_prefix", "consul.kv_prefix %q must be a relative key path without . or .. (like %q)", p, DefaultKVPrefix)
	}
	if fi, err := os.Stat(c.PolicyDir); err != nil || !fi.IsDir() {
		return refuse("policy_dir", "policy_dir %q is not a directory", c.PolicyDir)
	}
	return nil
}

// validateRegions refuses a region named twice, one with an address that is
// not http(s), and the broker's own region given an address of its own (it is
// reached at nomad.address).
func (c *Config) validateRegions() error {
	seen := map[string]bool{}
	for _, r := range c.Regions {
		key := "region." + r.Name
		switch {
		case r.Name == "":
			return refuse(key, "a region block needs the region's name, as Nomad's agents give it (-region)")
		case seen[r.Name]:
			return refuse(key, "region %q is given twice", r.Name)
		case r.Address != "" && !strings.HasPrefix(r.Address, "http://") && !strings.HasPrefix(r.Address, "https://"):
			return refuse(key, "region %q: address %q must start with http:// or https://", r.Name, r.Address)
		case r.Address != "" && r.Name == c.Nomad.Region:
			return refuse(key, "region %q is the broker's own (nomad.region): it is reached at nomad.address, so give it no address", r.Name)
		}
		seen[r.Name] = true
	}
	return nil
}

// ReadToken reads the token in TokenFile, without the white space and
// newline around it that tools write.
func (n *Nomad) ReadToken() (string, error) {
	b, err := os.ReadFile(n.TokenFile)
	if err != nil {
		return "", fmt.Errorf("nomad.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("nomad.token_file %s is empty", n.TokenFile)
	}
	return tok, nil
}
