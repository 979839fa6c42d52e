package server

import (
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// TestJobsFromNewerNomadArriveAsSent: a job carrying every field of the
// newest Nomad api Job type (testdata/newest-job.json, made by
// scripts/apigen) reaches Nomad as sent, but for what the broker writes:
// its meta keys and the priority. Among them are fields the broker's v1.6
// api types do not have (UI, VersionTag, MaxRunDuration, Disconnect,
// Identities, Actions, Schedule, Secrets, NUMA, SecretsMB, ...). Its GPUs are
// counted from Resources.Devices, a NUMA block beside them.
func TestJobsFromNewerNomadArriveAsSent(t *testing.T) {
	s, up, _, _ := newTestServer(t)
	raw, err := os.ReadFile("testdata/newest-job.json")
	if err != nil {
		t.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		t.Fatal(err)
	}
	job := req["Job"].(map[string]any)
	for _, f := range []string{"UI", "VersionTag"} {
		if job[f] == nil {
			t.Fatalf("the fixture has no %s: make it again with scripts/apigen", f)
		}
	}
	// A GPU job the broker admits: in tenant vision's namespace, one
	// allocation of one GPU, neither multiregion, periodic nor parameterized.
	job["ID"], job["Name"], job["Namespace"], job["Type"], job["Region"] = "newest", "newest", "vision", "batch", "global"
	for _, f := range []string{"Multiregion", "Periodic", "ParameterizedJob", "ParentID", "Dispatched", "Stop"} {
		delete(job, f)
	}
	tg := job["TaskGroups"].([]any)[0].(map[string]any)
	tg["Count"] = 1
	tg["Scaling"].(map[string]any)["Min"], tg["Scaling"].(map[string]any)["Max"] = 1, 1
	res := tg["Tasks"].([]any)[0].(map[string]any)["Resources"].(map[string]any)
	dev := res["Devices"].([]any)[0].(map[string]any)
	dev["Name"], dev["Count"], dev["Constraints"], dev["Affinities"] = "nvidia/gpu", 1, nil, nil
	res["NUMA"] = map[string]any{"Affinity": "require", "Devices": []any{"nvidia/gpu"}}
	body, _ := json.Marshal(req)

	rec := do(s, http.MethodPut, "/v1/jobs", string(body))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "admitted: tenant vision, queue training, priority 60, 1 GPUs") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	got := up.last["Job"].(map[string]any)
	meta := got["Meta"].(map[string]any)
	if meta[nomadjob.MetaAdmission] == nil || got["Priority"] != 60.0 {
		t.Fatalf("not admitted as the broker writes: priority %v, meta %v", got["Priority"], meta)
	}
	// What was sent, with what the broker writes, read back as JSON.
	want := map[string]any{}
	json.Unmarshal(body, &req)
	job = req["Job"].(map[string]any)
	job["Priority"] = 60
	for k, v := range meta {
		if strings.HasPrefix(k, "nomad-gpu.") {
			job["Meta"].(map[string]any)[k] = v
		}
	}
	b, _ := json.Marshal(job)
	json.Unmarshal(b, &want)
	if !reflect.DeepEqual(got, want) {
		gotJSON, _ := json.MarshalIndent(got, "", " ")
		wantJSON, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("Nomad got another job than was sent:\n%s", diffLines(string(wantJSON), string(gotJSON)))
	}
}

// diffLines lists the lines of want missing from got and the other way round.
func diffLines(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[strings.TrimSpace(l)]++
		}
		return m
	}
	w, g := count(want), count(got)
	var out []string
	for l, n := range w {
		if g[l] < n {
			out = append(out, "- "+l)
		}
	}
	for l, n := range g {
		if w[l] < n {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
