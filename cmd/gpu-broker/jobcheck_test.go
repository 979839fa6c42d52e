package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/testing/tools"
)

// The example jobspecs pass the example policies, as JSON from
// `nomad job run -output` (the nomad CLI parses HCL offline).
func TestTheExampleJobspecsPassTheExamplePolicies(t *testing.T) {
	nomad := tools.Binary(t, "nomad")
	specs, _ := filepath.Glob("../../jobspecs/*.nomad.hcl")
	if len(specs) < 3 {
		t.Fatalf("jobspecs: %v", specs)
	}
	args := []string{"-policy", "../../policies", "-max-gpus-per-node", "8"}
	for _, spec := range specs {
		out, err := exec.Command(nomad, "job", "run", "-output", spec).Output()
		if err != nil {
			t.Fatalf("nomad job run -output %s: %v", spec, err)
		}
		path := filepath.Join(t.TempDir(), filepath.Base(spec)+".json")
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, path)
	}
	if code := checkJobs(args); code != 0 {
		t.Errorf("gpu-broker job check of jobspecs/ exited %d", code)
	}
}

func TestBrokenJobspecsAreNamed(t *testing.T) {
	p, diags := policyhcl.LoadDir("../../policies", 0)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	job := func(ns, queue string, count, gpus int, meta string) string {
		return fmt.Sprintf(`{"ID":"j","Namespace":%q,"Meta":{"nomad-gpu.queue":%q%s},"TaskGroups":[{"Name":"g","Count":%d,`+
			`"Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":%d}]}}]}]}`, ns, queue, meta, count, gpus)
	}
	for name, c := range map[string]struct{ src, want string }{
		"two GPUs for dev":     {job("vision", "dev", 1, 2, ""), "error: job \"j\" rejected by rule workload-max-gpus"},
		"inference, no canary": {job("search", "inference", 2, 1, ""), "error: job \"j\" rejected by rule workload-require-update"},
		"no tenant":            {job("default", "", 1, 1, ""), "error: job \"j\" rejected by rule unmapped-namespace"},
		"periodic": {strings.Replace(job("vision", "training", 1, 1, ""), `"ID":"j",`, `"ID":"j","Periodic":{"Enabled":true,"Spec":"0 0 1 1 *","SpecType":"cron"},`, 1),
			"error: job \"j\" rejected by rule periodic-gpu-job: periodic jobs launch GPU work on Nomad's schedule without admission"},
		"larger than any node":  {job("vision", "training", 1, 9, ""), "error: job \"j\" rejected by rule no-node-fits"},
		"queue of another":      {job("vision", "inference", 1, 1, ""), "error: job \"j\" rejected by rule queue-not-allowed"},
		"ttl beyond max_extend": {job("vision", "dev", 1, 1, `,"nomad-gpu.ttl":"48h"`), "error: job \"j\" rejected by rule dev-ttl"},
		"HCL without Nomad":     {"job \"j\" {}\n", "error: j.hcl is HCL: give -address"},
		"dev gets its ttl":      {job("vision", "dev", 1, 1, ""), "warning: the broker writes into it meta nomad-gpu.ttl = \"8h0m0s\""},
	} {
		file := filepath.Join(t.TempDir(), "j.json")
		if strings.HasPrefix(c.src, "job") {
			file = filepath.Join(t.TempDir(), "j.hcl")
		}
		if err := os.WriteFile(file, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(checkJob(p, file, 8, ""), "\n")
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: want %q in\n%s", name, c.want, got)
		}
	}
}
