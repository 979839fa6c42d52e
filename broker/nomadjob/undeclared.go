package nomadjob

import (
	"fmt"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// gpuEnv are the variables through which a task names the GPUs it uses: the
// device plugin sets them from the GPUs Nomad assigns the task.
var gpuEnv = []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}

// UndeclaredGPUAccess says, per task, how the job would use GPUs it does not
// ask for with a device block, so that no tenant is charged for them: a GPU
// variable set by hand, a privileged container (it sees every device of its
// node), a container given /dev/nvidia* devices, or the nvidia container
// runtime without a GPU device (it then exposes the GPUs it is told to, or
// all). What a task does on its node beyond its job spec (a binary that
// opens /dev/nvidia* itself) it cannot see.
func UndeclaredGPUAccess(job *api.Job) []string {
	var out []string
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		for _, task := range tg.Tasks {
			if task == nil {
				continue
			}
			where := fmt.Sprintf("task %q of group %q", task.Name, deref(tg.Name))
			for _, v := range gpuEnv {
				if _, ok := task.Env[v]; ok {
					out = append(out, fmt.Sprintf("%s sets %s, which the device plugin sets from the GPUs Nomad assigns", where, v))
				}
			}
			if b, ok := task.Config["privileged"].(bool); ok && b {
				out = append(out, where+" runs privileged, seeing every GPU of its node")
			}
			if nvidiaDevice(task.Config["devices"]) {
				out = append(out, where+" is given /dev/nvidia* devices")
			}
			if r, ok := task.Config["runtime"].(string); ok && r == "nvidia" && !asksForGPUs(task) {
				out = append(out, where+` uses the nvidia runtime without asking for a GPU`)
			}
		}
	}
	return out
}

// nvidiaDevice reports whether a driver's devices list (strings, or maps
// with a host_path) names a /dev/nvidia* device.
func nvidiaDevice(v any) bool {
	list, _ := v.([]any)
	for _, d := range list {
		path, _ := d.(string)
		if m, ok := d.(map[string]any); ok {
			path, _ = m["host_path"].(string)
		}
		if strings.HasPrefix(strings.TrimSpace(path), "/dev/nvidia") {
			return true
		}
	}
	return false
}

// asksForGPUs reports whether a task has a GPU device request.
func asksForGPUs(task *api.Task) bool {
	if task.Resources == nil {
		return false
	}
	for _, d := range task.Resources.Devices {
		if d == nil {
			continue
		}
		if _, gpu := GPURequest(d.Name); gpu {
			return true
		}
	}
	return false
}
