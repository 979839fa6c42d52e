package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// hclBlock is a fenced hcl block of the docs, and where it starts.
type hclBlock struct{ at, src string }

// docsHCL are the fenced hcl blocks of README.md and docs/*.md.
func docsHCL(t *testing.T) []hclBlock {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	fence := regexp.MustCompile("(?ms)^```hcl\n(.*?)^```")
	var out []hclBlock
	for _, f := range append([]string{"../../README.md"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fence.FindAllSubmatchIndex(b, -1) {
			out = append(out, hclBlock{at: fmt.Sprintf("%s:%d", strings.TrimPrefix(f, "../../"), 2+strings.Count(string(b[:m[0]]), "\n")),
				src: string(b[m[2]:m[3]])})
		}
	}
	return out
}

// nomadOwn are top-level names of Nomad's own HCL (an agent's
// configuration, an ACL policy) that the docs show beside the broker's.
var nomadOwn = map[string]bool{"plugin": true, "limits": true, "client": true, "server": true, "namespace": true, "node": true, "acl": true}

// Every fenced hcl block of README.md and docs/ reads as what it is. One
// whose first line is "# broker.hcl" goes through `gpu-broker config
// validate`; Nomad's own HCL (an agent's configuration, an ACL policy) is
// read as HCL; any other is a policy file for `gpu-broker policy
// validate`. A block that is a fragment by design says so in its first
// line ("# fragment: ...") and is read as HCL alone.
func TestEveryHCLBlockOfTheDocsReads(t *testing.T) {
	blocks := docsHCL(t)
	if len(blocks) < 10 {
		t.Fatalf("%d hcl blocks in the docs: the fence is not found", len(blocks))
	}
	t.Chdir(t.TempDir())
	for _, v := range []string{"NOMAD_ADDR", "NOMAD_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN"} {
		t.Setenv(v, "")
	}
	kinds := map[string]int{}
	for i, b := range blocks {
		f, diags := hclsyntax.ParseConfig([]byte(b.src), b.at, hcl.InitialPos)
		if diags.HasErrors() {
			t.Errorf("%s: not HCL: %s", b.at, diags.Error())
			continue
		}
		first, _, _ := strings.Cut(strings.TrimSpace(b.src), "\n")
		body := f.Body.(*hclsyntax.Body)
		var stdout, stderr strings.Builder
		dir := fmt.Sprintf("block%d", i)
		switch {
		case strings.HasPrefix(first, "# fragment"):
			kinds["fragment"]++
		case first == "# broker.hcl":
			kinds["broker.hcl"]++
			if err := os.MkdirAll("policies", 0o755); err != nil {
				t.Fatal(err)
			}
			path := dir + ".hcl"
			writeDoc(t, path, b.src)
			if validateConfig([]string{path}, &stdout, &stderr) != 0 {
				t.Errorf("%s: gpu-broker config validate refuses it:\n%s", b.at, stderr.String())
			}
		case nomadOwnHCL(body):
			kinds["nomad"]++
		default:
			kinds["policy"]++
			writeDoc(t, filepath.Join(dir, "policy.hcl"), b.src)
			if validatePolicy([]string{dir}, &stdout, &stderr) != 0 {
				t.Errorf("%s: gpu-broker policy validate refuses it:\n%s", b.at, stderr.String())
			}
		}
	}
	t.Logf("hcl blocks read: %v", kinds)
}

// nomadOwnHCL reports whether body's top level is Nomad's own HCL.
func nomadOwnHCL(body *hclsyntax.Body) bool {
	for _, b := range body.Blocks {
		if !nomadOwn[b.Type] {
			return false
		}
	}
	return len(body.Blocks) > 0 && len(body.Attributes) == 0
}

func writeDoc(t *testing.T, path, src string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
