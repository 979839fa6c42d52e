// Package structure checks the shape of the tree that docs/design.md
// describes: which ring each package is in, that none imports one from a
// ring above it, and that no function grows long without a reason.
package structure

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/nomad-gpu/nomad-gpu/"

// rings are docs/design.md's layers, lowest first: a package may import
// from its own ring and those below.
var rings = []struct {
	name     string
	packages []string
}{
	{"libraries", []string{"internal/clock", "internal/jsondoc", "internal/version"}},
	{"domain and engines", []string{"broker/policy", "broker/admission", "broker/approval", "broker/queue", "broker/queue/queuetest",
		"broker/reclaim", "broker/reclaim/reclaimtest", "broker/usage"}},
	{"adapters", []string{"broker/policyhcl", "broker/policystore", "broker/config", "broker/consulkv", "broker/nomadapi", "broker/nomadjob",
		"broker/metrics", "broker/audit", "broker/cluster", "broker/webui"}},
	{"the admission sequence", []string{"broker/decide", "broker/sim"}},
	{"loops and the HTTP front", []string{"broker/admitter", "broker/reclaimer", "broker/leader", "broker/server"}},
	{"wiring", []string{"broker/agent", "cmd/gpu-broker"}},
}

func ringOf(pkg string) (int, bool) {
	for i, r := range rings {
		for _, p := range r.packages {
			if p == pkg {
				return i, true
			}
		}
	}
	return 0, false
}

// No broker package imports one from a ring above its own, and every broker
// package has a ring (a new one is placed in docs/design.md and here).
func TestNoPackageImportsFromARingAbove(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../../broker/...", "../../internal/...", "../../cmd/gpu-broker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		if pkg == "broker/integration" {
			continue // tests only
		}
		ring, ok := ringOf(pkg)
		if !ok {
			t.Errorf("%s is in no ring: place it in docs/design.md and here", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			if r, ok := ringOf(dep); ok && r > ring {
				t.Errorf("%s (%s) imports %s (%s), a ring above it", pkg, rings[ring].name, dep, rings[r].name)
			}
		}
	}
}

// maxLines is the longest a function of non-test code may be without a
// "// Long: why" line in its comment.
const maxLines = 80

func TestNoLongFunctionWithoutAReason(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.Walk("../..", func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() && (strings.HasPrefix(info.Name(), ".") && path != "../.." || info.Name() == "testing") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines > maxLines && (fn.Doc == nil || !strings.Contains(fn.Doc.Text(), "Long: ")) {
				t.Errorf("%s: %s is %d lines, over %d: split it, or say why in a \"// Long: …\" line above it",
					fset.Position(fn.Pos()), fn.Name.Name, lines, maxLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
