package nomadjob

import (
	"fmt"

	"github.com/hashicorp/nomad/api"
)

// CgroupBoundTasks are the tasks that ask for GPUs under exec or raw_exec.
// On Nomad before 1.8 with cgroups v2, those drivers' cgroups let a task
// open only the default devices, not the GPUs reserved for it (raw_exec
// not, if its plugin runs without cgroups, which the broker cannot see).
// Each is named as the task, its group and its driver.
func CgroupBoundTasks(job *api.Job) []string {
	var out []string
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		for _, t := range tg.Tasks {
			if t != nil && (t.Driver == "exec" || t.Driver == "raw_exec") && asksForGPUs(t) {
				out = append(out, fmt.Sprintf("task %q of group %q (driver %s)", t.Name, deref(tg.Name), t.Driver))
			}
		}
	}
	return out
}
