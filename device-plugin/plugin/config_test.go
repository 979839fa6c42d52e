package plugin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"

	hclspecpb "github.com/nomad-gpu/nomad-gpu/device-plugin/proto/hclspec"
)

// nomadEncode does what a Nomad agent does with a `config { ... }` body: decode it
// with the plugin's ConfigSchema and msgpack-encode the result for SetConfig.
func nomadEncode(t *testing.T, body string) ([]byte, hcl.Diagnostics) {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(body), "agent.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("parse: %s", diags)
	}
	spec := toHCLDec(t, ConfigSpec(), "")
	val, diags := hcldec.Decode(f.Body, spec, &hcl.EvalContext{Functions: map[string]function.Function{}})
	if diags.HasErrors() {
		return nil, diags
	}
	b, err := ctymsgpack.Marshal(val, val.Type())
	if err != nil {
		t.Fatal(err)
	}
	return b, nil
}

// toHCLDec converts the kinds of spec ConfigSpec uses, following Nomad's rules:
// an object's key names a direct child attribute or block.
func toHCLDec(t *testing.T, s *hclspecpb.Spec, implied string) hcldec.Spec {
	t.Helper()
	switch b := s.Block.(type) {
	case *hclspecpb.Spec_Object:
		out := hcldec.ObjectSpec{}
		for k, v := range b.Object.Attributes {
			out[k] = toHCLDec(t, v, k)
		}
		return out
	case *hclspecpb.Spec_Attr:
		name := b.Attr.Name
		if name == "" {
			name = implied
		}
		expr, diags := hclsyntax.ParseExpression([]byte(b.Attr.Type), "type", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("type %q: %s", b.Attr.Type, diags)
		}
		ty, diags := typeExpr(expr)
		if diags.HasErrors() {
			t.Fatalf("type %q: %s", b.Attr.Type, diags)
		}
		return &hcldec.AttrSpec{Name: name, Type: ty, Required: b.Attr.Required}
	case *hclspecpb.Spec_Default:
		return &hcldec.DefaultSpec{Primary: toHCLDec(t, b.Default.Primary, ""), Default: toHCLDec(t, b.Default.Default, "")}
	case *hclspecpb.Spec_Literal:
		expr, diags := hclsyntax.ParseExpression([]byte(b.Literal.Value), "literal", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("literal %q: %s", b.Literal.Value, diags)
		}
		v, diags := expr.Value(nil)
		if diags.HasErrors() {
			t.Fatalf("literal %q: %s", b.Literal.Value, diags)
		}
		return &hcldec.LiteralSpec{Value: v}
	case *hclspecpb.Spec_BlockValue:
		name := b.BlockValue.Name
		if name == "" {
			name = implied
		}
		return &hcldec.BlockSpec{TypeName: name, Required: b.BlockValue.Required, Nested: toHCLDec(t, b.BlockValue.Nested, "")}
	}
	t.Fatalf("spec kind %T not handled by the test", s.Block)
	return nil
}

func typeExpr(expr hcl.Expression) (cty.Type, hcl.Diagnostics) {
	switch hcl.ExprAsKeyword(expr) {
	case "string":
		return cty.String, nil
	case "number":
		return cty.Number, nil
	case "bool":
		return cty.Bool, nil
	}
	call, diags := hcl.ExprCall(expr)
	if diags.HasErrors() || call.Name != "list" || len(call.Arguments) != 1 {
		return cty.DynamicPseudoType, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "unsupported type"}}
	}
	elem, diags := typeExpr(call.Arguments[0])
	return cty.List(elem), diags
}

func TestConfigThroughNomadDecoding(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		check   func(t *testing.T, c Config)
		wantErr string
	}{
		{name: "empty block gives the defaults", body: ``, check: func(t *testing.T, c Config) {
			if !c.Enabled || c.Backend != BackendAuto || c.FingerprintEvery() != time.Minute ||
				c.HealthRecoveryAfter() != 5*time.Minute || c.StatsEvery() != 0 || c.Fake.Count != 8 ||
				len(c.IgnoredXIDs) != len(DefaultIgnoredXIDs) {
				t.Errorf("defaults not applied: %+v", c)
			}
		}},
		{name: "every option", body: `
enabled = false
backend = "fake"
fingerprint_period = "10s"
stats_period = "2s"
ignored_gpu_ids = ["GPU-1"]
ignored_xids = [13, 4000000000]
health_recovery = "30s"
island_groups = true
fake {
  count = 1024
  model = "NVIDIA A100-SXM4-40GB"
  memory_mib = 40960
  id_prefix = "c2"
  state_file = "/tmp/s.json"
  islands = 128
}`, check: func(t *testing.T, c Config) {
			want := FakeConfig{Count: 1024, Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, IDPrefix: "c2", StateFile: "/tmp/s.json", Islands: 128}
			if c.Enabled || c.Backend != BackendFake || c.FingerprintEvery() != 10*time.Second || !c.IslandGroups ||
				c.StatsEvery() != 2*time.Second || c.HealthRecoveryAfter() != 30*time.Second ||
				c.IgnoredGPUIDs[0] != "GPU-1" || c.IgnoredXIDs[1] != 4000000000 || c.Fake != want {
				t.Errorf("options not applied: %+v", c)
			}
		}},
		{name: "partial fake block keeps the other defaults", body: `fake { count = 2 }`, check: func(t *testing.T, c Config) {
			if c.Fake.Count != 2 || c.Fake.MemoryMiB != 81559 || c.Fake.Model == "" {
				t.Errorf("fake defaults lost: %+v", c.Fake)
			}
		}},
		{name: "unknown backend", body: `backend = "tpu"`, wantErr: `option backend: "tpu" is not one of`},
		{name: "bad duration", body: `health_recovery = "later"`, wantErr: `option health_recovery: "later" is not a duration`},
		{name: "negative duration", body: `fingerprint_period = "-1s"`, wantErr: `option fingerprint_period: "-1s" must be positive`},
		{name: "more islands than GPUs", body: `fake {
  count = 4
  islands = 5
}`, wantErr: `option fake.islands: 5 is outside 1..4 (fake.count)`},
		{name: "bad fake count", body: `fake { count = -1 }`, wantErr: `option fake.count: -1 is outside 0..4096`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, diags := nomadEncode(t, c.body)
			if diags.HasErrors() {
				t.Fatalf("Nomad would refuse the config: %s", diags)
			}
			cfg, err := DecodeConfig(b)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("want error containing %q, got %v", c.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, cfg)
		})
	}
}

func TestUnknownOptionRefusedByNomadDecoding(t *testing.T) {
	if _, diags := nomadEncode(t, `backnd = "fake"`); !diags.HasErrors() ||
		!strings.Contains(diags.Error(), "backnd") {
		t.Fatalf("an unknown option must be refused, naming it: %v", diags)
	}
}

func TestEmptySetConfigMeansDefaults(t *testing.T) {
	cfg, err := DecodeConfig(nil)
	if err != nil || cfg.Backend != BackendAuto || cfg.FingerprintEvery() != time.Minute {
		t.Fatalf("got %+v, %v", cfg, err)
	}
}

func TestSharingOptionsAreChecked(t *testing.T) {
	for cfg, want := range map[string]string{
		`{"sharing":{"replicas":1,"gpus":0}}`:  "option sharing.replicas: 1 is outside 2..64",
		`{"sharing":{"replicas":4,"gpus":-1}}`: "option sharing.gpus: -1 must be 0 (all) or more",
	} {
		c := DefaultConfig()
		fmt.Sscanf(cfg, `{"sharing":{"replicas":%d,"gpus":%d}}`, &c.Sharing.Replicas, &c.Sharing.GPUs)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
	}
}
