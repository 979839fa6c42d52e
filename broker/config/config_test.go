package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadFillsFromEnvironmentAndDefaults(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`
policy_dir = "`+dir+`"
consul {
  kv_prefix = "gpus"
}
`), 0o644)
	t.Setenv("NOMAD_ADDR", "http://127.0.0.1:5646")
	t.Setenv("NOMAD_TOKEN", "secret")
	t.Setenv("CONSUL_HTTP_ADDR", "")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.Nomad.Address != "http://127.0.0.1:5646" || c.Nomad.Token != "secret" ||
		c.Consul.Address != DefaultConsul || c.Consul.KVPrefix != "gpus/" || c.MaxQueueBytes != 256<<20 {
		t.Errorf("got %+v %+v %+v", c, c.Nomad, c.Consul)
	}
}

func TestLoadNamesTheProblem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte("listen = \"127.0.0.1:4649\"\nnomad {\n  adress = \"x\"\n}\n"), 0o644)
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), "broker.hcl:3:3: error: Unsupported argument") {
		t.Fatalf("want file:line of the unknown key, got %v", err)
	}
	os.WriteFile(path, []byte(`policy_dir = "/nonexistent"`), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), `policy_dir "/nonexistent"`) {
		t.Fatalf("want the policy_dir named, got %v", err)
	}
}

func TestResyncAndAdvertise(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
listen = "127.0.0.1:5000"
`), 0o644)
	c, err := Load(path)
	if err != nil || c.ResyncInterval != time.Minute || c.Advertise != "http://127.0.0.1:5000" {
		t.Fatalf("defaults: %v %+v", err, c)
	}
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
resync = "soon"
`), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), `resync "soon"`) {
		t.Fatalf("want the resync value named, got %v", err)
	}
}

func TestEnforcementAndListenerTLS(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"`), 0o644)
	c, err := Load(path)
	if err != nil || c.Enforcement != Passthrough || c.TLS != nil {
		t.Fatalf("defaults: %v %+v", err, c)
	}
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
enforcement = "exclusive"
listen = "127.0.0.1:5000"
tls {
  cert_file = "broker.pem"
  key_file  = "broker-key.pem"
}
`), 0o644)
	c, err = Load(path)
	if err != nil || c.Enforcement != Exclusive || c.Advertise != "https://127.0.0.1:5000" || c.TLS.CertFile != "broker.pem" {
		t.Fatalf("exclusive with TLS: %v %+v", err, c)
	}
	for bad, want := range map[string]string{
		`enforcement = "strict"`:           `enforcement "strict" is neither "passthrough" nor "exclusive"`,
		`tls { cert_file = "broker.pem" }`: `tls needs cert_file and key_file`,
		// Issue 34 §5: each was taken as it was.
		`advertise = "not a url"`:                             `advertise "not a url" is not an http:// or https:// address`,
		`consul { kv_prefix = "/" }`:                          `consul.kv_prefix "/" must be a relative key path`,
		`consul { kv_prefix = "../../" }`:                     `consul.kv_prefix "../../" must be a relative key path`,
		"audit {\n path = \"a.log\"\n max_files = 2000000\n}": `max_files from 1 to 1000`,
	} {
		os.WriteFile(path, []byte(`policy_dir = "`+dir+`"`+"\n"+bad+"\n"), 0o644)
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want %q, got %v", bad, want, err)
		}
	}
}

func TestAuditBlock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
audit {
  path = "/var/log/gpu-broker/audit.log"
}
`), 0o644)
	c, err := Load(path)
	if err != nil || c.Audit == nil || c.Audit.Path != "/var/log/gpu-broker/audit.log" || c.Audit.MaxBytes != 100<<20 || c.Audit.MaxFiles != 10 {
		t.Fatalf("audit: %v %+v", err, c.Audit)
	}
	if c.EnableDebug {
		t.Error("enable_debug is on by default")
	}
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
audit {
  path      = "a.log"
  max_bytes = 10
}
`), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "max_bytes of at least 4096") {
		t.Fatalf("want max_bytes named, got %v", err)
	}
	os.WriteFile(path, []byte("audit {\n}\n"), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), `broker.hcl:1:7: error: Missing required argument`) {
		t.Fatalf("want the missing path at file:line, got %v", err)
	}
}

func TestLoopIntervals(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"`), 0o644)
	c, err := Load(path)
	if err != nil || c.QueueIntervalDuration != 2*time.Second || c.PolicyPollInterval != 2*time.Second || c.PreemptionReassertInterval != 30*time.Second ||
		c.BodyReadTimeoutDuration != 30*time.Second {
		t.Fatalf("defaults: %v %+v", err, c)
	}
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
queue_interval      = "100ms"
policy_poll         = "200ms"
preemption_reassert = "1s"
body_read_timeout   = "5s"
`), 0o644)
	if c, err = Load(path); err != nil || c.QueueIntervalDuration != 100*time.Millisecond || c.PolicyPollInterval != 200*time.Millisecond || c.PreemptionReassertInterval != time.Second ||
		c.BodyReadTimeoutDuration != 5*time.Second {
		t.Fatalf("set: %v %+v", err, c)
	}
	for _, bad := range []string{`queue_interval = "0s"`, `policy_poll = "often"`, `preemption_reassert = "-1s"`, `body_read_timeout = "1ns"`} {
		os.WriteFile(path, []byte(`policy_dir = "`+dir+`"`+"\n"+bad+"\n"), 0o644)
		key := strings.Fields(bad)[0]
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: want %s named, got %v", bad, key, err)
		}
	}
}

// A setting the file gives that Validate refuses is named with its place.
func TestASettingRefusedIsNamedWithItsFileAndLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	for _, c := range []struct{ src, want string }{
		{"policy_dir = \"" + dir + "\"\nenforcement = \"strict\"\n", `broker.hcl:2:1: enforcement "strict" is neither`},
		{"policy_dir = \"" + dir + "\"\nnomad {\n  address = \"127.0.0.1:4646\"\n}\n", `broker.hcl:3:3: nomad.address "127.0.0.1:4646" must start with http://`},
		{"policy_dir = \"" + dir + "\"\naudit {\n  path = \"\"\n}\n", `broker.hcl:2:1: audit needs a path`},
		{"policy_dir = \"/nonexistent\"\n", `broker.hcl:1:1: policy_dir "/nonexistent" is not a directory`},
		{"policy_dir = \"" + dir + "\"\nmax_queue_bytes = 4096\n", `broker.hcl:2:1: max_queue_bytes 4096 is below 1 MiB`},
	} {
		if err := os.WriteFile(path, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}

// FuzzLoad: any broker.hcl gives a configuration or an error, never a panic.
func FuzzLoad(f *testing.F) {
	f.Add("listen = \"127.0.0.1:4649\"\nnomad {\n  address = \"http://127.0.0.1:4646\"\n}\naudit {\n  path = \"a.log\"\n}\n")
	f.Add("resync = \"0s\"\ntls {}\n")
	f.Add("consul { kv_prefix = 1 }\n")
	f.Add("\xff{")
	f.Fuzz(func(t *testing.T, src string) {
		dir := t.TempDir()
		path := filepath.Join(dir, "broker.hcl")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if (c == nil) == (err == nil) {
			t.Fatalf("config %v with error %v", c, err)
		}
	})
}

func TestNomadTokenFile(t *testing.T) {
	dir := t.TempDir()
	path, tokenPath := filepath.Join(dir, "broker.hcl"), filepath.Join(dir, "nomad-token")
	t.Setenv("NOMAD_TOKEN", "from-the-environment")
	os.WriteFile(path, []byte("policy_dir = \""+dir+"\"\nnomad {\n  token_file = \""+tokenPath+"\"\n}\n"), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "broker.hcl:3:3: nomad.token_file: open "+tokenPath) {
		t.Errorf("a missing token file: %v", err)
	}
	os.WriteFile(tokenPath, []byte("\n"), 0o600)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "broker.hcl:3:3: nomad.token_file "+tokenPath+" is empty") {
		t.Errorf("an empty token file: %v", err)
	}
	// The file's token, not NOMAD_TOKEN's; the newline a tool writes is not part of it.
	os.WriteFile(tokenPath, []byte("s3cr3t\n"), 0o600)
	c, err := Load(path)
	if err != nil || c.Nomad.Token != "s3cr3t" {
		t.Fatalf("token %q, %v", c.Nomad.Token, err)
	}
	os.WriteFile(tokenPath, []byte("rotated"), 0o600)
	if tok, err := c.Nomad.ReadToken(); err != nil || tok != "rotated" {
		t.Errorf("read again: %q, %v", tok, err)
	}
	os.WriteFile(path, []byte("policy_dir = \""+dir+"\"\nnomad {\n  token = \"x\"\n  token_file = \""+tokenPath+"\"\n}\n"), 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "broker.hcl:4:3: nomad.token_file and nomad.token are both set") {
		t.Errorf("both: %v", err)
	}
}

func TestRegionBlocks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "broker.hcl")
	os.WriteFile(path, []byte(`policy_dir = "`+dir+`"
nomad {
  region = "east"
}
region "east" {}
region "west" {
  address = "https://nomad.west:4646"
}
region "north" {}
`), 0o644)
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Regions) != 3 || c.Regions[1].Name != "west" || c.Regions[1].Address != "https://nomad.west:4646" || c.Regions[2].Address != "" {
		t.Fatalf("regions: %+v %+v %+v", c.Regions[0], c.Regions[1], c.Regions[2])
	}
	for body, want := range map[string]string{
		"region \"west\" {}\nregion \"west\" {}\n":                 `broker.hcl:4:1: region "west" is given twice`,
		"region \"west\" {\n  address = \"nomad.west:4646\"\n}\n":  `broker.hcl:3:1: region "west": address "nomad.west:4646" must start with http:// or https://`,
		"region \"east\" {\n  address = \"http://elsewhere\"\n}\n": `broker.hcl:3:1: region "east" is the broker's own (nomad.region)`,
		"region \"\" {}\n": `broker.hcl:3:1: a region block needs the region's name`,
	} {
		os.WriteFile(path, []byte("policy_dir = \""+dir+"\"\nnomad { region = \"east\" }\n"+body), 0o644)
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want %q, got %v", body, want, err)
		}
	}
}
