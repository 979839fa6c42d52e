package plugin

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeConfig: whatever msgpack Nomad (or anything else) hands the
// plugin, decoding gives a valid config or an error, never a panic.
func FuzzDecodeConfig(f *testing.F) {
	for _, seed := range []map[string]any{
		{"backend": "fake", "fingerprint_period": "5s", "fake": map[string]any{"count": 8, "model": "H100", "id_prefix": "a"}},
		{"backend": "nvml", "fake": nil},
		{"backend": "tpu"},
		{"fingerprint_period": "soon"},
		{"fake": map[string]any{"count": -1}},
		{"fake": "not a block"},
	} {
		b, err := msgpack.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xc1})
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := DecodeConfig(b)
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("decoded a config that does not validate: %v", verr)
			}
		}
	})
}
