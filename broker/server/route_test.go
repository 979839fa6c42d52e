package server

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// nomadSource is where `make tools` keeps the files of Nomad v1.6.3's source
// that register its HTTP routes.
const nomadSource = "nomad-routes/v1.6.3"

// TestEveryNomadRouteIsClassified reads the routes Nomad v1.6.3 serves from
// its own source and fails on any the route table does not have: a newer
// Nomad's routes must be classified before this passes against it.
func TestEveryNomadRouteIsClassified(t *testing.T) {
	httpGo := readNomadFile(t, "http.go")
	var registered []string
	for _, m := range regexp.MustCompile(`s\.mux\.Handle(?:Func)?\("([^"]+)"`).FindAllStringSubmatch(httpGo, -1) {
		registered = append(registered, m[1])
	}
	if len(registered) < 80 {
		t.Fatalf("read %d routes from Nomad's http.go: the pattern no longer matches its source", len(registered))
	}
	var table []string
	for _, r := range nomadRoutes {
		if !slices.Contains(table, r.mux) {
			table = append(table, r.mux)
		}
	}
	for _, p := range registered {
		if !slices.Contains(table, p) {
			t.Errorf("Nomad serves %s, which the route table (nomadRoutes) does not classify", p)
		}
		if got := muxPattern(p); got != p {
			t.Errorf("%s is matched as %s", p, got)
		}
	}
	for _, p := range table {
		if !slices.Contains(registered, p) {
			t.Errorf("the route table has %s, which Nomad v1.6.3 does not serve", p)
		}
	}

	// Within a route, Nomad's handler picks the sub-route by the path's
	// suffix or prefix, first match wins: the table tries them in the same
	// order.
	subs := func(mux string) []string {
		var out []string
		for _, r := range nomadRoutes {
			if r.mux == mux && r.sub != "" && !slices.Contains(out, r.sub) {
				out = append(out, r.sub)
			}
		}
		return out
	}
	for _, c := range []struct{ file, handler, mux, test string }{
		{"job_endpoint.go", "JobSpecificRequest", "/v1/job/", "HasSuffix"},
		{"deployment_endpoint.go", "DeploymentSpecificRequest", "/v1/deployment/", "HasPrefix"},
	} {
		body := funcBody(t, readNomadFile(t, c.file), c.handler)
		var want []string
		for _, m := range regexp.MustCompile(`strings\.`+c.test+`\(path, "([^"]+)"\)`).FindAllStringSubmatch(body, -1) {
			want = append(want, m[1])
		}
		if got := subs(c.mux); len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s picks sub-routes of %s in the order %q; the table has %q", c.handler, c.mux, want, got)
		}
	}

	for _, r := range nomadRoutes {
		switch {
		case r.methods == "" && r.class != unknown:
			t.Errorf("%s %s: no methods, but class %d", r.mux, r.sub, r.class)
		case r.methods != "" && r.class == unknown:
			t.Errorf("%s %s: writes with %s, unclassified", r.mux, r.sub, r.methods)
		case r.class == decided && r.call == callNone:
			t.Errorf("%s %s: decided, by no call", r.mux, r.sub)
		case (r.class == neutral || r.class == refused) && r.why == "":
			t.Errorf("%s %s: %d without a reason", r.mux, r.sub, r.class)
		}
	}
}

func readNomadFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(tools.File(t, filepath.Join(nomadSource, name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// funcBody is the text of Go function name's body in src, up to the next
// top-level func.
func funcBody(t *testing.T, src, name string) string {
	t.Helper()
	_, body, ok := strings.Cut(src, ") "+name+"(")
	if !ok {
		t.Fatalf("Nomad's source has no func %s", name)
	}
	body, _, _ = strings.Cut(body, "\nfunc ")
	return body
}

// A route stays neutral only where Nomad's own handler cannot create or
// revive an allocation: each neutral write on jobs, nodes, allocations and
// evaluations names the v1.6.3 handler that says so.
func TestANeutralWriteOnJobsNamesNomadsHandler(t *testing.T) {
	for _, r := range nomadRoutes {
		touches := false
		for _, p := range []string{"/v1/job/", "/v1/node/", "/v1/allocation/", "/v1/evaluations", "/v1/client/allocation/", "/v1/client/gc", "/v1/system/"} {
			touches = touches || strings.HasPrefix(r.mux, p) && !strings.HasPrefix(r.mux, "/v1/node/pool")
		}
		if r.class == neutral && touches && !regexp.MustCompile(`\(v1\.6\.3 nomad/\w+\.go[,:)]`).MatchString(r.why) {
			t.Errorf("%s%s is neutral, and its why names no handler of Nomad v1.6.3 that shows it places nothing: %q", r.mux, r.sub, r.why)
		}
	}
}
