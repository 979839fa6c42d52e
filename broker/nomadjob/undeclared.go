package nomadjob

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// gpuEnv are the variables through which a task names the GPUs it uses: the
// device plugin sets them from the GPUs Nomad assigns the task.
var gpuEnv = []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}

// UndeclaredGPUAccess says, per task, how the job would use GPUs it does not
// ask for with a device block, so that no tenant is charged for them. Four
// ways do:
//   - a GPU variable set by hand (in env without a GPU request, or by a
//     template, which overrides the device plugin's);
//   - a privileged container, which sees every device of its node;
//   - a container given an NVIDIA device (a path or a bind mount);
//   - the nvidia container runtime without a GPU device, which exposes the
//     GPUs it is told to, or all.
//
// Values are read as the drivers decode them: "true" is true, /dev//nvidia0
// is /dev/nvidia0. Hiding every GPU (NVIDIA_VISIBLE_DEVICES=void,
// CUDA_VISIBLE_DEVICES=-1) is not using one.
// What a task does on its node beyond its job spec (a binary that opens
// /dev/nvidia* itself, a template read from a file) it cannot see.
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
			out = append(out, undeclaredIn(task, fmt.Sprintf("task %q of group %q", task.Name, deref(tg.Name)))...)
		}
	}
	return out
}

func undeclaredIn(task *api.Task, where string) []string {
	var out []string
	asks := asksForGPUs(task)
	for _, v := range gpuEnv {
		// A task that asks for GPUs gets these from the device plugin, which
		// Nomad sets after the task's own env: its own values are replaced.
		if val, ok := task.Env[v]; ok && !asks && !hidesGPUs(v, val) {
			out = append(out, fmt.Sprintf("%s sets %s, which the device plugin sets from the GPUs Nomad assigns", where, v))
		}
	}
	for _, tmpl := range task.Templates {
		if tmpl != nil && tmpl.Envvars != nil && *tmpl.Envvars && templateSetsGPUs(deref(tmpl.EmbeddedTmpl)) {
			out = append(out, where+" has a template that sets NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, overriding the device plugin's")
		}
	}
	if isTrue(task.Config["privileged"]) {
		out = append(out, where+" runs privileged, seeing every GPU of its node")
	}
	if nvidiaDevice(task.Config["devices"]) {
		out = append(out, where+" is given NVIDIA devices (/dev/nvidia*, /dev/char/195:*)")
	}
	if nvidiaMount(task.Config) {
		out = append(out, where+" mounts /dev or an NVIDIA device into its container")
	}
	if r, ok := task.Config["runtime"].(string); ok && strings.TrimSpace(r) == "nvidia" && !asks {
		out = append(out, where+` uses the nvidia runtime without asking for a GPU`)
	}
	return out
}

// hidesGPUs reports whether value of GPU variable name shows the task no
// GPU: the nvidia runtime's void, none or empty; CUDA's -1 or empty.
func hidesGPUs(name, value string) bool {
	value = strings.TrimSpace(value)
	if name == "NVIDIA_VISIBLE_DEVICES" {
		return value == "" || value == "void" || value == "none"
	}
	return value == "" || value == "-1" || strings.HasPrefix(value, "-1,")
}

// templateSetsGPUs reports whether an env template sets a GPU variable to
// anything but a value that hides GPUs (a value it renders counts as set).
func templateSetsGPUs(text string) bool {
	for _, line := range strings.Split(text, "\n") {
		for _, v := range gpuEnv {
			if !strings.Contains(line, v) {
				continue
			}
			name, value, ok := strings.Cut(strings.TrimSpace(line), "=")
			if !ok || strings.TrimSpace(name) != v || strings.Contains(value, "{{") || !hidesGPUs(v, strings.Trim(strings.TrimSpace(value), `"'`)) {
				return true
			}
		}
	}
	return false
}

// isTrue reports whether a driver config value decodes as true: a boolean,
// or a string HCL converts to one.
func isTrue(v any) bool {
	switch b := v.(type) {
	case bool:
		return b
	case string:
		t, err := strconv.ParseBool(strings.TrimSpace(b))
		return err == nil && t
	}
	return false
}

// nvidiaDevice reports whether a driver's devices list (strings, or maps
// with a host_path) names an NVIDIA device.
func nvidiaDevice(v any) bool {
	list, _ := v.([]any)
	for _, d := range list {
		if m, ok := d.(map[string]any); ok {
			p, _ := m["host_path"].(string)
			if isNVIDIADevice(strings.TrimSpace(p), false) {
				return true
			}
			continue
		}
		// "host[:container[:permissions]]"; /dev/char/195:0 holds a colon
		// of its own.
		p, _ := d.(string)
		host, _, _ := strings.Cut(strings.TrimSpace(p), ":")
		if isNVIDIADevice(host, false) || isNVIDIADevice(strings.TrimSpace(p), false) {
			return true
		}
	}
	return false
}

// nvidiaMount reports whether a driver's volumes ("host:container") or
// mount blocks (source) bind /dev, /dev/char or an NVIDIA device.
func nvidiaMount(config map[string]any) bool {
	list, _ := config["volumes"].([]any)
	for _, v := range list {
		s, _ := v.(string)
		if host, _, _ := strings.Cut(strings.TrimSpace(s), ":"); isNVIDIADevice(host, true) {
			return true
		}
	}
	for _, key := range []string{"mount", "mounts"} {
		mounts, _ := config[key].([]any)
		for _, m := range mounts {
			mm, _ := m.(map[string]any)
			src, _ := mm["source"].(string)
			if isNVIDIADevice(src, true) {
				return true
			}
		}
	}
	return false
}

// isNVIDIADevice reports whether host path p (cleaned, as the kernel reads
// it) is an NVIDIA device node: /dev/nvidia*, or /dev/char/195:* (NVIDIA's
// major number); with dirs, also a directory holding them (/dev, /dev/char).
func isNVIDIADevice(p string, dirs bool) bool {
	if p == "" {
		return false
	}
	p = path.Clean(p)
	switch {
	case strings.HasPrefix(p, "/dev/nvidia"), strings.HasPrefix(p, "/dev/char/195:"):
		return true
	case dirs:
		return p == "/dev" || p == "/dev/char" || p == "/"
	}
	return false
}

// asksForGPUs reports whether a task has a GPU device request of at least
// one GPU (count absent: 1).
func asksForGPUs(task *api.Task) bool {
	if task.Resources == nil {
		return false
	}
	for _, d := range task.Resources.Devices {
		if d == nil || d.Count != nil && *d.Count == 0 {
			continue
		}
		if _, gpu := GPURequest(d.Name); gpu {
			return true
		}
	}
	return false
}
