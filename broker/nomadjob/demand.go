package nomadjob

import (
	"fmt"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// Bounds beyond which a count is refused as absurd rather than multiplied: no
// real cluster comes near them, and they keep every product far from overflow.
const (
	MaxGroupCount   = 100_000
	MaxDeviceCount  = 1_024
	MaxGroupsOrTask = 10_000
)

// GPU device groups of this project: vendor and type as the plugin reports them.
const (
	GPUVendor = "nvidia"
	GPUType   = "gpu"
)

// DeviceID is a device request's name split the way Nomad splits it:
// "type", "vendor/type" or "vendor/type/name"; an empty part matches any.
type DeviceID struct{ Vendor, Type, Name string }

// ParseDeviceID splits a device request name.
func ParseDeviceID(name string) DeviceID {
	parts := strings.SplitN(name, "/", 3)
	switch len(parts) {
	case 1:
		return DeviceID{Type: parts[0]}
	case 2:
		return DeviceID{Vendor: parts[0], Type: parts[1]}
	default:
		return DeviceID{Vendor: parts[0], Type: parts[1], Name: parts[2]}
	}
}

// Matches reports whether a node's device group (vendor, type, name) satisfies
// the request, by Nomad's rule: every part the request names must be equal.
func (id DeviceID) Matches(vendor, typ, name string) bool {
	return (id.Name == "" || id.Name == name) && (id.Vendor == "" || id.Vendor == vendor) && (id.Type == "" || id.Type == typ)
}

// GPURequest reports whether a device request can be given NVIDIA GPUs, and of
// which model ("" for any). "gpu", "nvidia/gpu", "/gpu", "nvidia//H100" and
// even "//" all can.
func GPURequest(name string) (model string, ok bool) {
	if name == "" {
		return "", false // Nomad refuses a device request without a name
	}
	id := ParseDeviceID(name)
	return id.Name, id.Matches(GPUVendor, GPUType, id.Name)
}

// SharedSuffix ends the name of the plugin's device group of time-sliced
// replicas of a model ("<model> (shared)"), whose devices carry the attribute
// shared = true.
const SharedSuffix = " (shared)"

// SharedOnly reports whether a GPU request can be given time-sliced replicas
// only: it names a shared group, or constrains ${device.attr.shared} to true
// the way Nomad compares device attributes. The value is parsed as Nomad
// parses it: "true", "True", "TRUE", "t" or "T" is the boolean true.
func SharedOnly(dev *api.RequestedDevice) bool {
	if strings.HasSuffix(ParseDeviceID(dev.Name).Name, SharedSuffix) {
		return true
	}
	for _, c := range dev.Constraints {
		if c == nil || c.LTarget != SharedAttr {
			continue
		}
		switch c.Operand {
		case "", "=", "==", "is":
			switch c.RTarget {
			case "true", "True", "TRUE", "t", "T":
				return true
			}
		}
	}
	return false
}

// IsGPUGroup reports whether a node's device group is one of this project's GPUs.
func IsGPUGroup(vendor, typ string) bool { return vendor == GPUVendor && typ == GPUType }

// Placement is what Nomad knows beyond a job's body that decides how many
// allocations it places.
type Placement struct {
	// Current is the version Nomad runs now (nil: none, or stopped).
	Current *api.Job
	// PreserveCounts keeps Current's group counts (the request flag).
	PreserveCounts bool
	// NodesFitting counts eligible nodes with at least gpus healthy GPUs of
	// model ("" any): system and sysbatch jobs place their count on each.
	NodesFitting func(model string, gpus int) int
}

// Groups is a job's GPU demand as Nomad will place it: one admission group
// per task group and GPU model. Each has the allocation count Nomad will run:
// count, or the scaling block's min when count is absent, or the current
// count with PreserveCounts. System and sysbatch jobs run that count on each
// fitting node. Canaries a service update places beside the current
// allocations are added.
func Groups(job *api.Job, pl Placement) ([]admission.Group, error) {
	if len(job.TaskGroups) > MaxGroupsOrTask {
		return nil, fmt.Errorf("job has %d task groups, more than %d", len(job.TaskGroups), MaxGroupsOrTask)
	}
	typ := api.JobTypeService
	if job.Type != nil && *job.Type != "" {
		typ = *job.Type
	}
	var out []admission.Group
	for i, tg := range job.TaskGroups {
		if tg == nil {
			return nil, fmt.Errorf("task group %d is null", i)
		}
		name := deref(tg.Name)
		perModel, err := gpusPerAlloc(tg)
		if err != nil {
			return nil, fmt.Errorf("task group %q: %w", name, err)
		}
		if len(perModel) == 0 {
			continue
		}
		count, err := groupCount(tg)
		if err != nil {
			return nil, fmt.Errorf("task group %q: %w", name, err)
		}
		cur := currentGroup(pl.Current, name)
		if pl.PreserveCounts && cur != nil && cur.Count != nil {
			count = *cur.Count
		}
		canaries := 0
		if typ == api.JobTypeService && cur != nil {
			canaries = canaryCount(job, tg)
			if canaries > 0 && cur.Count != nil {
				count = max(count, *cur.Count) // the current allocations run on beside the canaries
			}
		}
		for _, m := range perModel {
			n := count
			if typ == api.JobTypeSystem || typ == api.JobTypeSysbatch {
				nodes := 0
				if pl.NodesFitting != nil {
					nodes = pl.NodesFitting(m.model, m.gpus)
				}
				if pinned := pinnedNodes(job, tg); pinned >= 0 {
					nodes = min(nodes, pinned) // pinned (PinNodes): a node that joins adds nothing
				}
				n = nodes * count // Nomad places count on each node (a system job's is at most 1)
			}
			out = append(out, admission.Group{Name: name, Count: n + canaries, GPUsPerAlloc: m.gpus, Model: m.model, Shared: m.shared})
		}
	}
	return out, nil
}

// HasCanaries reports whether a service job places canaries for an update of
// a GPU task group: its counts then depend on what runs now.
func HasCanaries(job *api.Job) bool {
	if job.Type != nil && *job.Type != "" && *job.Type != api.JobTypeService {
		return false
	}
	for _, tg := range job.TaskGroups {
		if tg == nil || canaryCount(job, tg) == 0 {
			continue
		}
		if perModel, err := gpusPerAlloc(tg); err != nil || len(perModel) > 0 {
			return true
		}
	}
	return false
}

type modelGPUs struct {
	model  string
	shared bool // replicas only (SharedOnly)
	gpus   int
}

// gpusPerAlloc sums the GPUs one allocation of tg asks for, per model and
// sharing, in the order they first appear.
func gpusPerAlloc(tg *api.TaskGroup) ([]modelGPUs, error) {
	if len(tg.Tasks) > MaxGroupsOrTask {
		return nil, fmt.Errorf("%d tasks, more than %d", len(tg.Tasks), MaxGroupsOrTask)
	}
	var out []modelGPUs
	for i, task := range tg.Tasks {
		if task == nil {
			return nil, fmt.Errorf("task %d is null", i)
		}
		if task.Resources == nil {
			continue
		}
		for j, dev := range task.Resources.Devices {
			if dev == nil {
				return nil, fmt.Errorf("task %q: device request %d is null", task.Name, j)
			}
			model, ok := GPURequest(dev.Name)
			if !ok {
				continue
			}
			model = requestModel(dev, model)
			n := uint64(1) // Nomad's default
			if dev.Count != nil {
				n = *dev.Count
			}
			if n > MaxDeviceCount {
				return nil, fmt.Errorf("task %q asks for %d devices %q, more than %d", task.Name, n, dev.Name, MaxDeviceCount)
			}
			shared := SharedOnly(dev)
			found := false
			for k := range out {
				if out[k].model == model && out[k].shared == shared {
					out[k].gpus += int(n)
					found = true
				}
			}
			if !found && n > 0 {
				out = append(out, modelGPUs{model: model, shared: shared, gpus: int(n)})
			}
		}
	}
	for _, m := range out {
		if m.gpus > MaxDeviceCount {
			return nil, fmt.Errorf("one allocation asks for %d GPUs, more than %d", m.gpus, MaxDeviceCount)
		}
	}
	return out, nil
}

// groupCount is the count Nomad gives a group: count, else the scaling block's
// min, else 1.
func groupCount(tg *api.TaskGroup) (int, error) {
	count := 1
	switch {
	case tg.Count != nil:
		count = *tg.Count
	case tg.Scaling != nil && tg.Scaling.Min != nil:
		if *tg.Scaling.Min < 0 || *tg.Scaling.Min > MaxGroupCount {
			return 0, fmt.Errorf("scaling min %d is out of range 0..%d", *tg.Scaling.Min, MaxGroupCount)
		}
		count = int(*tg.Scaling.Min)
	}
	if count < 0 || count > MaxGroupCount {
		return 0, fmt.Errorf("count %d is out of range 0..%d", count, MaxGroupCount)
	}
	return count, nil
}

// canaryCount is the group's canary count, the group's update block taking
// precedence over the job's.
func canaryCount(job *api.Job, tg *api.TaskGroup) int {
	n := 0
	if job.Update != nil && job.Update.Canary != nil {
		n = *job.Update.Canary
	}
	if tg.Update != nil && tg.Update.Canary != nil {
		n = *tg.Update.Canary
	}
	return min(max(n, 0), MaxGroupCount)
}

func currentGroup(cur *api.Job, name string) *api.TaskGroup {
	if cur == nil || (cur.Stop != nil && *cur.Stop) {
		return nil
	}
	for _, tg := range cur.TaskGroups {
		if tg != nil && deref(tg.Name) == name {
			return tg
		}
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
