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
	{"libraries", []string{"internal/clock", "internal/jsondoc", "internal/version",
		"device-plugin/proto", "device-plugin/proto/base", "device-plugin/proto/device", "device-plugin/proto/hclspec", "device-plugin/proto/structs"}},
	{"domain and engines", []string{"broker/policy", "broker/admission", "broker/approval", "broker/enrich", "broker/queue", "broker/queue/queuetest",
		"broker/reclaim", "broker/reclaim/reclaimtest", "broker/usage", "device-plugin/gpu"}},
	{"adapters", []string{"broker/policyhcl", "broker/policystore", "broker/config", "broker/consulkv", "broker/nomadapi", "broker/nomadjob",
		"broker/metrics", "broker/audit", "broker/cluster", "broker/webui", "device-plugin/nvml", "device-plugin/fake", "device-plugin/plugin"}},
	{"the admission sequence", []string{"broker/decide", "broker/sim"}},
	{"loops and the HTTP front", []string{"broker/admitter", "broker/reclaimer", "broker/leader", "broker/front", "broker/gpuapi", "broker/server", "device-plugin/check"}},
	{"wiring", []string{"broker/agent", "cmd/gpu-broker", "cmd/nomad-device-gpu"}},
}

// testsOnly are packages of tests alone: in no ring, and imported by none.
var testsOnly = map[string]bool{"broker/integration": true, "device-plugin/integration": true}

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

// No package of the broker or the device plugin imports one from a ring
// above its own, or one in no ring (the test harness). Every such package
// has a ring: a new one is placed in docs/design.md and here.
func TestNoPackageImportsFromARingAbove(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../../broker/...", "../../internal/...",
		"../../device-plugin/...", "../../cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		if testsOnly[pkg] {
			continue
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
			switch r, ok := ringOf(dep); {
			case !ok:
				t.Errorf("%s (%s) imports %s, which is in no ring (the test harness, or a package to place)", pkg, rings[ring].name, dep)
			case r > ring:
				t.Errorf("%s (%s) imports %s (%s), a ring above it", pkg, rings[ring].name, dep, rings[r].name)
			}
		}
	}
}

// maxLines is the longest a function of non-test code may be without a
// "// Long: why" line in its comment; maxLong the longest with one. A
// marker on a function no longer over maxLines is stale, and fails too.
const (
	maxLines = 80
	maxLong  = 200
)

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
			marked := fn.Doc != nil && strings.Contains(fn.Doc.Text(), "Long: ")
			switch {
			case lines > maxLines && !marked:
				t.Errorf("%s: %s is %d lines, over %d: split it, or say why in a \"// Long: …\" line above it",
					fset.Position(fn.Pos()), fn.Name.Name, lines, maxLines)
			case lines > maxLong:
				t.Errorf("%s: %s is %d lines, over %d even with its reason: split it", fset.Position(fn.Pos()), fn.Name.Name, lines, maxLong)
			case marked && lines <= maxLines:
				t.Errorf("%s: %s is %d lines: its \"// Long:\" marker is stale, take it out", fset.Position(fn.Pos()), fn.Name.Name, lines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An integration subtest that uses the package's env binds it to its own t
// first (e := e.in(t)): the env's helpers fail through the t they hold, and
// a subtest failing its parent's t panics instead of saying what failed.
func TestIntegrationSubtestsBindTheirEnv(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("../../broker/integration/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no integration tests found: %v", err)
	}
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Run" {
				return true
			}
			body, ok := call.Args[1].(*ast.FuncLit)
			if !ok || !usesEnv(body.Body) || bindsEnv(body.Body) {
				return true
			}
			t.Errorf("%s: a subtest uses the env e without binding it to its own t: begin it with e := e.in(t)", fset.Position(call.Pos()))
			return true
		})
	}
}

// usesEnv says whether a subtest's body names e, the enclosing test's env:
// an e it declares itself (a loop's entry) is not.
func usesEnv(body *ast.BlockStmt) bool {
	used, declared := false, false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			used = used || n.Name == "e"
		case *ast.RangeStmt:
			declared = declared || n.Tok == token.DEFINE && (isE(n.Key) || isE(n.Value))
		case *ast.AssignStmt:
			for _, l := range n.Lhs {
				declared = declared || n.Tok == token.DEFINE && isE(l)
			}
		}
		return true
	})
	return used && !declared
}

func isE(x ast.Expr) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == "e"
}

// bindsEnv says whether one of a subtest's first two statements (the other
// may be t.Parallel()) is e := e.in(t).
func bindsEnv(body *ast.BlockStmt) bool {
	for _, s := range body.List[:min(2, len(body.List))] {
		as, ok := s.(*ast.AssignStmt)
		if !ok || as.Tok != token.DEFINE || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			continue
		}
		if id, ok := as.Lhs[0].(*ast.Ident); !ok || id.Name != "e" {
			continue
		}
		if call, ok := as.Rhs[0].(*ast.CallExpr); ok {
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "in" {
				return true
			}
		}
	}
	return false
}
