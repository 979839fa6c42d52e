package policyhcl

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// LoadDir reads every *.hcl file of dir as one policy set. The policy is nil
// when the diagnostics hold an error; warnings come with a valid policy.
func LoadDir(dir string, capacity int) (*policy.Policy, hcl.Diagnostics) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.hcl"))
	if err != nil || len(paths) == 0 {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "No policy files",
			Detail: fmt.Sprintf("%s holds no *.hcl files", dir)}}
	}
	sort.Strings(paths)
	files := map[string][]byte{}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot read policy file", Detail: err.Error()}}
		}
		files[path] = b
	}
	return Parse(files, capacity)
}

// FormatDiagnostics renders diagnostics as `file:line:col: severity: message`, one a line.
func FormatDiagnostics(diags hcl.Diagnostics) string {
	var sb strings.Builder
	for _, d := range diags {
		sev := "error"
		if d.Severity == hcl.DiagWarning {
			sev = "warning"
		}
		msg := d.Summary
		if d.Detail != "" {
			msg += ": " + d.Detail
		}
		if d.Subject != nil {
			fmt.Fprintf(&sb, "%s:%d:%d: %s: %s\n", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column, sev, msg)
		} else {
			fmt.Fprintf(&sb, "%s: %s\n", sev, msg)
		}
	}
	return sb.String()
}
