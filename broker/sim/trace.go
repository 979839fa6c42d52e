// Package sim replays a GPU workload against a simulated Nomad cluster in
// simulated time, three ways on the same jobs: Nomad alone, strict quotas,
// and nomad-gpu. The broker's own code decides (admission, queue order,
// reclaim rules, fair-share decay); only Nomad's placement is approximated.
// It is pure: traces and reports are read and written through io.
package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Job is one job of a workload: one line of a trace file (JSON lines).
type Job struct {
	ID string `json:"id"`
	// Submit is when it is submitted, in seconds from the trace's start.
	Submit float64 `json:"submit"`
	// Namespace decides the tenant, as in the broker; Tenant may name the
	// tenant instead (its first namespace is then used).
	Namespace string `json:"namespace,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	Queue     string `json:"queue,omitempty"` // "": the tenant's default queue
	// GPUs each allocation asks for, Count allocations (default 1), of
	// Model ("": any model).
	GPUs  int    `json:"gpus"`
	Count int    `json:"count,omitempty"`
	Model string `json:"model,omitempty"`
	// Duration is the seconds of running it needs to finish.
	Duration float64 `json:"duration"`
	// Idle: its GPUs stay below the policy's idle threshold while it runs
	// (a development session nobody uses).
	Idle bool `json:"idle,omitempty"`
	// TTL is its nomad-gpu.ttl in seconds (0: none), for lifetime rules.
	TTL float64 `json:"ttl,omitempty"`
	// Checkpoint is the seconds between its checkpoints (0: none): a
	// preempted job loses the work since its last one.
	Checkpoint float64 `json:"checkpoint,omitempty"`
	// Outcome is how it ended in the trace (completed, failed, cancelled):
	// reported, it changes nothing in the replay.
	Outcome string `json:"outcome,omitempty"`
}

// allocs is the number of allocations.
func (j *Job) allocs() int { return max(j.Count, 1) }

// gpus is its GPUs in all.
func (j *Job) gpus() int { return j.GPUs * j.allocs() }

// ReadTrace reads a JSON-lines trace; name is used in errors (name:line).
// Jobs come back in submission order.
func ReadTrace(r io.Reader, name string) ([]Job, error) {
	var jobs []Job
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seen := map[string]int{}
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		var j Job
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if err := j.check(); err != nil {
			return nil, fmt.Errorf("%s:%d: job %q: %w", name, line, j.ID, err)
		}
		if first, dup := seen[j.ID]; dup {
			return nil, fmt.Errorf("%s:%d: job %q: the same id as on line %d", name, line, j.ID, first)
		}
		seen[j.ID] = line
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("%s: no jobs", name)
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Submit < jobs[b].Submit })
	return jobs, nil
}

func (j *Job) check() error {
	switch {
	case j.ID == "":
		return fmt.Errorf("no id")
	case j.Namespace == "" && j.Tenant == "":
		return fmt.Errorf("neither namespace nor tenant")
	case j.GPUs <= 0:
		return fmt.Errorf("gpus must be at least 1, not %d", j.GPUs)
	case j.Count < 0:
		return fmt.Errorf("count must not be negative")
	case j.Duration <= 0:
		return fmt.Errorf("duration must be above 0 seconds")
	case j.Submit < 0 || j.TTL < 0 || j.Checkpoint < 0:
		return fmt.Errorf("submit, ttl and checkpoint must not be negative")
	}
	return nil
}

// WriteTrace writes jobs as JSON lines.
func WriteTrace(w io.Writer, jobs []Job) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range jobs {
		if err := enc.Encode(&jobs[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
