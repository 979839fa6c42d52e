package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/enrich"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

const jobCheckUsage = `usage: gpu-broker job check -policy DIR [-max-gpus-per-node N] [-address NOMAD_ADDR] FILE...
  Checks jobspecs against a policy set as admission would, before nomad job run:
  JSON jobs (nomad job run -output prints them), or HCL parsed by the Nomad at -address.
`

// checkJobs checks jobspecs offline against a policy set with admission's
// own decision, on an empty cluster of nodes of max-gpus-per-node GPUs;
// exit 1 on any error.
func checkJobs(args []string) int {
	fs := flag.NewFlagSet("job check", flag.ContinueOnError)
	dir := fs.String("policy", "policies", "policy directory")
	perNode := fs.Int("max-gpus-per-node", 0, "GPUs of the largest node (0: not checked)")
	addr := fs.String("address", os.Getenv("NOMAD_ADDR"), "Nomad, to parse HCL jobspecs (default: NOMAD_ADDR)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprint(os.Stderr, jobCheckUsage)
		return 2
	}
	p, diags := policyhcl.LoadDir(*dir, 0)
	if p == nil {
		fmt.Fprint(os.Stderr, policyhcl.FormatDiagnostics(diags))
		return 1
	}
	failed := false
	for _, file := range fs.Args() {
		for _, line := range checkJob(p, file, *perNode, *addr) {
			fmt.Println(file + ": " + line)
			failed = failed || strings.HasPrefix(line, "error:")
		}
	}
	if failed {
		return 1
	}
	return 0
}

// checkJob is what admission would say of one jobspec: "error: …" and
// "warning: …" lines.
func checkJob(p *policy.Policy, file string, perNode int, addr string) []string {
	body, err := jobBody(file, addr)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	req, err := nomadjob.ReadRequest(nomadjob.Register, body, url.Values{})
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	// The gate's own sequence, on an empty cluster with no job running yet.
	seq := &decide.Sequence{Cluster: emptyCluster{p, perNode}, Enricher: enrich.Enricher{Clock: clock.Real}}
	prepared, err := seq.Prepare(context.Background(), p, req, noVersions{})
	if err != nil {
		return []string{fmt.Sprintf("error: job %q: %v", req.JobID, err)}
	}
	if len(prepared.Groups) == 0 {
		return []string{fmt.Sprintf("warning: job %q asks for no GPU: the broker passes it through", req.JobID)}
	}
	var out []string
	for _, note := range prepared.Wrote {
		out = append(out, "warning: the broker writes into it "+note)
	}
	d, _ := seq.Decide(p, prepared.AdmissionJob(), decide.Preview)
	switch d.Outcome {
	case admission.Reject:
		out = append(out, fmt.Sprintf("error: job %q rejected by rule %s: %s", req.JobID, d.Rule, d.Reason))
	case admission.AdmitBorrowed:
		out = append(out, fmt.Sprintf("warning: job %q runs borrowed (preemptible) even on an empty cluster: %s", req.JobID, d.Reason))
	case admission.Queue:
		out = append(out, fmt.Sprintf("warning: job %q would wait even on an empty cluster: %s", req.JobID, d.Reason))
	}
	return out
}

// emptyCluster is a cluster with every GPU idle, on nodes of perNode GPUs
// (0: as large as any job), each group fitting one node.
type emptyCluster struct {
	p       *policy.Policy
	perNode int
}

func (emptyCluster) NodesFitting(string, int) int      { return 1 }
func (emptyCluster) FittingNodes(string, int) []string { return []string{"any-node"} }
func (emptyCluster) Islanded(string) bool              { return false }
func (c emptyCluster) UsageFor(*policy.Policy, admission.Job) admission.Usage {
	const plenty = 1 << 30
	perNode := c.perNode
	if perNode <= 0 {
		perNode = plenty
	}
	u := admission.Usage{Tenants: map[string]admission.TenantUsage{}, Idle: policy.Quota{policy.AllGPUs: plenty},
		MaxAlloc: policy.Quota{policy.AllGPUs: float64(perNode)}}
	for class := range c.p.Classes {
		u.Idle[class], u.MaxAlloc[class] = plenty, float64(perNode)
	}
	return u
}

// Admit is never called: job check previews.
func (c emptyCluster) Admit(p *policy.Policy, j admission.Job) (admission.Decision, *cluster.Reservation) {
	return admission.Decide(p, j, c.UsageFor(p, j)), nil
}

// noVersions: job check sees no job running yet.
type noVersions struct{}

func (noVersions) Job(context.Context, string, string) (*api.Job, error)       { return nil, nil }
func (noVersions) StableJob(context.Context, string, string) (*api.Job, error) { return nil, nil }

// jobBody reads a jobspec as a register request: JSON ({"Job": …} or the job
// itself), or HCL that Nomad at addr parses.
func jobBody(file, addr string) ([]byte, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(src)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &probe); err != nil {
			return nil, fmt.Errorf("not a JSON job: %w", err)
		}
		if _, ok := probe["Job"]; ok {
			return trimmed, nil
		}
		return append(append([]byte(`{"Job":`), trimmed...), '}'), nil
	}
	if addr == "" {
		return nil, fmt.Errorf("%s is HCL: give -address (Nomad parses it) or check what `nomad job run -output %s` prints", filepath.Base(file), file)
	}
	req, _ := json.Marshal(map[string]any{"JobHCL": string(src), "Canonicalize": false})
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Post(strings.TrimRight(addr, "/")+"/v1/jobs/parse", "application/json", bytes.NewReader(req))
	if err != nil {
		return nil, fmt.Errorf("parse with Nomad: %w", err)
	}
	defer resp.Body.Close()
	job, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("parse with Nomad: %s", bytes.TrimSpace(job))
	}
	return append(append([]byte(`{"Job":`), job...), '}'), nil
}
