package policyhcl_test

import (
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
)

// A policy nested 100,000 levels deep overflowed the broker's stack on
// reload (a crash no recover catches): it is refused before HCL's parser
// reads it, with the line, however the nesting hides in strings, heredocs
// and their templates.
func TestAPolicyNestedTooDeeplyIsRefusedNotParsed(t *testing.T) {
	deep := 100000
	for name, src := range map[string]string{
		"brackets":                "a = " + strings.Repeat("[", deep) + strings.Repeat("]", deep) + "\n",
		"braces across lines":     "x = 1\n" + strings.Repeat("a = {\n", deep),
		"closers in strings":      "a = " + strings.Repeat(`[")))",`, deep) + "\n",
		"in a string's template":  `a = "${` + strings.Repeat("(", deep) + `}"` + "\n",
		"in a heredoc's template": "a = <<EOT\n${" + strings.Repeat("[", deep) + "}\nEOT\n",
		"comments do not close":   "a = " + strings.Repeat("[ # ]\n", deep),
	} {
		_, diags := policyhcl.Parse(map[string][]byte{"policy.hcl": []byte(src)}, 0)
		msg := policyhcl.FormatDiagnostics(diags)
		if !strings.Contains(msg, "Nested too deeply") || !strings.Contains(msg, "policy.hcl:") {
			t.Errorf("%s: %.300s", name, msg)
		}
	}
	// What nests a few levels, or holds brackets as text, is read as before.
	for name, src := range map[string]string{
		"text":    `queue "training" { priority = 60 }` + "\n" + `currency = "` + strings.Repeat("[", 1000) + `"` + "\n",
		"heredoc": "currency = <<EOT\n" + strings.Repeat("{[(", 1000) + "\nEOT\n",
		"comment": "# " + strings.Repeat("{", 1000) + "\n/* " + strings.Repeat("[", 1000) + " */\n",
	} {
		_, diags := policyhcl.Parse(map[string][]byte{"policy.hcl": []byte(src)}, 0)
		if msg := policyhcl.FormatDiagnostics(diags); strings.Contains(msg, "Nested too deeply") {
			t.Errorf("%s: %.300s", name, msg)
		}
	}
}
