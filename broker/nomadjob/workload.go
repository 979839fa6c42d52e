package nomadjob

import (
	"fmt"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// CanaryAutoRevert reports whether every GPU task group of job updates with
// canaries and auto_revert (its own update block over the job's).
func CanaryAutoRevert(job *api.Job) bool {
	seen := false
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		if perModel, err := gpusPerAlloc(tg); err != nil || len(perModel) == 0 {
			continue
		}
		seen = true
		if canaryCount(job, tg) == 0 || !autoRevert(job, tg) {
			return false
		}
	}
	return seen
}

// AutoReverts reports whether registering job starts a deployment that
// Nomad reverts, if it fails, to the job's latest stable version: a service
// job with auto_revert in any task group's update block (its own over the
// job's). Its GPU groups or not: the stable version may have them.
func AutoReverts(job *api.Job) bool {
	if job.Type != nil && *job.Type != "" && *job.Type != api.JobTypeService {
		return false
	}
	for _, tg := range job.TaskGroups {
		if tg != nil && autoRevert(job, tg) {
			return true
		}
	}
	return false
}

// autoRevert is tg's auto_revert: its own update block's, else the job's.
func autoRevert(job *api.Job, tg *api.TaskGroup) bool {
	if tg.Update != nil && tg.Update.AutoRevert != nil {
		return *tg.Update.AutoRevert
	}
	return job.Update != nil && job.Update.AutoRevert != nil && *job.Update.AutoRevert
}

// ApplyWorkload writes what workload w asks of a job into the request, where
// the job leaves it open, and says what it wrote. That is nomad-gpu.ttl (its
// default_ttl), and a restart block in GPU task groups without one
// (restart_attempts). Their tasks get a kill_timeout of at least
// checkpoint_grace, so that a preempted task can write its checkpoint. Unless
// the workload is shared, a constraint keeps its GPUs off time-sliced
// replicas.
func (r *Request) ApplyWorkload(w *policy.Workload) []string {
	if w == nil {
		return nil
	}
	var notes []string
	job := r.Doc.Root().Get("Job")
	if w.DefaultTTL > 0 && r.Job.Meta[MetaTTL] == "" {
		ttl := w.DefaultTTL.String()
		if r.Job.Meta == nil {
			r.Job.Meta = map[string]string{}
		}
		r.Job.Meta[MetaTTL] = ttl
		job.Object("Meta").Set(MetaTTL, ttl)
		notes = append(notes, fmt.Sprintf("meta %s = %q (workload %s's default_ttl)", MetaTTL, ttl, w.Name))
	}
	groups := job.Get("TaskGroups").Elems()
	for i, tg := range r.Job.TaskGroups {
		if tg == nil || i >= len(groups) || !groups[i].IsObject() {
			continue
		}
		if perModel, err := gpusPerAlloc(tg); err != nil || len(perModel) == 0 {
			continue
		}
		name := deref(tg.Name)
		if w.RestartAttempts > 0 && tg.RestartPolicy == nil {
			tg.RestartPolicy = &api.RestartPolicy{Attempts: &w.RestartAttempts}
			groups[i].Set("RestartPolicy", map[string]any{"Attempts": w.RestartAttempts})
			notes = append(notes, fmt.Sprintf("group %q: restart { attempts = %d } (workload %s)", name, w.RestartAttempts, w.Name))
		}
		tasks := groups[i].Get("Tasks").Elems()
		for j, t := range tg.Tasks {
			if t == nil || j >= len(tasks) || !tasks[j].IsObject() {
				continue
			}
			if !w.Shared {
				notes = append(notes, wholeGPUsOnly(t, tasks[j], w)...)
			}
			if w.CheckpointGrace <= 0 || (t.KillTimeout != nil && *t.KillTimeout >= w.CheckpointGrace) {
				continue
			}
			grace := w.CheckpointGrace
			t.KillTimeout = &grace
			tasks[j].Set("KillTimeout", int64(grace))
			notes = append(notes, fmt.Sprintf("task %q: kill_timeout = %s (workload %s's checkpoint_grace)", t.Name, grace, w.Name))
		}
	}
	return notes
}

// SharedAttr is the device attribute that tells a time-sliced replica.
const SharedAttr = "${device.attr.shared}"

// wholeGPUsOnly constrains task t's GPU requests (doc is its node in the
// request) to devices that are not replicas, where they say nothing of
// sharing: a workload without `shared` never lands on a time-sliced GPU. "!="
// also matches GPUs whose plugin reports no such attribute.
func wholeGPUsOnly(t *api.Task, doc *jsondoc.Node, w *policy.Workload) []string {
	if t.Resources == nil {
		return nil
	}
	devices := doc.Get("Resources").Get("Devices").Elems()
	var notes []string
	for k, dev := range t.Resources.Devices {
		if _, gpu := GPURequest(deref(dev).Name); !gpu || k >= len(devices) || !devices[k].IsObject() || SharedOnly(dev) {
			continue
		}
		constrained := false
		for _, c := range dev.Constraints {
			constrained = constrained || (c != nil && c.LTarget == SharedAttr)
		}
		if constrained {
			continue
		}
		dev.Constraints = append(dev.Constraints, &api.Constraint{LTarget: SharedAttr, Operand: "!=", RTarget: "true"})
		devices[k].Set("Constraints", dev.Constraints)
		notes = append(notes, fmt.Sprintf("task %q: device %q constraint %s != true (workload %s takes whole GPUs)", t.Name, dev.Name, SharedAttr, w.Name))
	}
	return notes
}
