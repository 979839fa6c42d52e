package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What an operator sees from `gpu-broker config validate`: the file read
// as serve reads it, errors at file:line, exit 0 only when valid.
func TestConfigValidate(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, v := range []string{"NOMAD_ADDR", "NOMAD_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN"} {
		t.Setenv(v, "") // what the file leaves out comes from the defaults
	}
	if err := os.Mkdir("policies", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, src string
		code      int
		out       string
	}{
		{"valid", "listen = \"127.0.0.1:4650\"\nnomad {\n  address = \"http://127.0.0.1:4646\"\n}\n", 0,
			"broker.hcl: valid: listen 127.0.0.1:4650, advertise http://127.0.0.1:4650, nomad http://127.0.0.1:4646, consul 127.0.0.1:8500, policies in policies, enforcement passthrough, 0 more regions"},
		{"a misspelt attribute", "nomad {\n  adress = \"http://x:4646\"\n}\n", 1, "broker.hcl:2:3: error: Unsupported argument"},
		{"two attributes on a one-line block", "tls { cert_file = \"a\"  key_file = \"b\" }\n", 1, "broker.hcl:1:"},
		{"a value refused", "listen = \"127.0.0.1:4650\"\nenforcement = \"strict\"\n", 1, "broker.hcl:2:1: enforcement \"strict\" is neither"},
		{"no policy directory", "policy_dir = \"nowhere\"\n", 1, "broker.hcl:1:1: policy_dir \"nowhere\" is not a directory"},
	} {
		if err := os.WriteFile("broker.hcl", []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr strings.Builder
		code := validateConfig([]string{"broker.hcl"}, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.out) {
			t.Errorf("%s: exit %d, want %d and %q:\n%s%s", c.name, code, c.code, c.out, stdout.String(), stderr.String())
		}
	}
	var stdout, stderr strings.Builder
	if code := validateConfig(nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage: gpu-broker config validate FILE") {
		t.Errorf("no file: exit %d\n%s", code, stderr.String())
	}
	if code := validateConfig([]string{filepath.Join("no", "such.hcl")}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "read broker config") {
		t.Errorf("a missing file: exit %d\n%s", code, stderr.String())
	}
}
