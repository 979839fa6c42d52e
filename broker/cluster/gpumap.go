package cluster

import (
	"slices"
	"sort"
	"time"
)

// States of a GPU on the map.
const (
	GPUFree       = "free"       // healthy, held by no allocation
	GPUHeld       = "held"       // held by a running or pending allocation
	GPUIdle       = "idle"       // held, but its last sample was below the idle threshold
	GPUUnhealthy  = "unhealthy"  // the device plugin reports it unhealthy
	GPURecovering = "recovering" // healthy again, waiting out the plugin's hysteresis
)

// Sample is a GPU's latest telemetry, from its Nomad client's stats. A
// value the device does not report is nil.
type Sample struct {
	Node, Model    string
	At             time.Time
	Utilization    *float64 // percent
	MemoryUsedMiB  *float64
	MemoryTotalMiB *float64
	TemperatureC   *float64
	PowerW         *float64
	SMClockMHz     *float64
	MemClockMHz    *float64
	LastXID        *float64 // the last XID the GPU reported (0: none)
	ECCCorrected   *float64 // since the driver loaded
	ECCUncorrected *float64
	MemCopyUtil    *float64 // percent of time device memory was read or written
	EncoderUtil    *float64 // percent
	DecoderUtil    *float64 // percent
	TensorActive   *float64 // percent of time tensor cores were busy (GPM, Hopper and later)
	DriverVersion  string
	// Which GPU the device is, as the plugin says in its stats: the GPU's
	// index on its host, the physical GPU's UUID, and a MIG instance's GPU
	// instance id and profile.
	GPUIndex    *float64
	GPUUUID     string
	MIGInstance *float64
	MIGProfile  string
}

// MapNode is one node of the GPU map: what Nomad says of it, and each of
// its GPUs.
type MapNode struct {
	ID       string   `json:"id"`
	Name     string   `json:"name"`
	Region   string   `json:"region,omitempty"` // its Nomad region, when the broker governs several
	Pool     string   `json:"node_pool"`
	Status   string   `json:"status"`
	Draining bool     `json:"draining"`
	Eligible bool     `json:"eligible"`
	GPUs     []MapGPU `json:"gpus"`
}

// MapGPU is one GPU of the map. The holder's fields are set when an
// allocation holds it; Tenant, Queue and Borrowed come from the job's
// verified admission stamp.
type MapGPU struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	State string `json:"state"`
	// Health is the device plugin's description of an unhealthy GPU.
	Health    string `json:"health,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Job       string `json:"job,omitempty"`
	// ParentJob is a dispatched or periodic child's parent; Group and Task
	// are the task group and task holding the GPU.
	ParentJob string `json:"parent_job,omitempty"`
	Group     string `json:"task_group,omitempty"`
	Task      string `json:"task,omitempty"`
	Alloc     string `json:"alloc,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	Queue     string `json:"queue,omitempty"`
	Borrowed  bool   `json:"borrowed,omitempty"`
	// Replicas: the device is one of this many time-sliced replicas of a GPU.
	Replicas    int      `json:"replicas,omitempty"`
	Utilization *float64 `json:"utilization,omitempty"`
	MemoryUsed  *float64 `json:"memory_used_mib,omitempty"`
	MemoryTotal *float64 `json:"memory_total_mib,omitempty"`
	Temperature *float64 `json:"temperature_c,omitempty"`
	Power       *float64 `json:"power_w,omitempty"`
	// Telemetry beyond what the map draws, and which GPU the device is
	// (Sample's fields of those names).
	SMClock        *float64 `json:"sm_clock_mhz,omitempty"`
	MemClock       *float64 `json:"mem_clock_mhz,omitempty"`
	LastXID        *float64 `json:"last_xid,omitempty"`
	ECCCorrected   *float64 `json:"ecc_corrected,omitempty"`
	ECCUncorrected *float64 `json:"ecc_uncorrected,omitempty"`
	MemCopyUtil    *float64 `json:"mem_copy_util,omitempty"`
	EncoderUtil    *float64 `json:"encoder_util,omitempty"`
	DecoderUtil    *float64 `json:"decoder_util,omitempty"`
	TensorActive   *float64 `json:"tensor_active,omitempty"`
	DriverVersion  string   `json:"driver_version,omitempty"`
	PCIBusID       string   `json:"pci_bus_id,omitempty"`
	GPUIndex       *float64 `json:"gpu_index,omitempty"`
	GPUUUID        string   `json:"gpu_uuid,omitempty"`
	MIGInstance    *float64 `json:"mig_instance,omitempty"`
	MIGProfile     string   `json:"mig_profile,omitempty"`
}

// SetSamples replaces the GPUs' telemetry with the latest pass's.
func (v *View) SetSamples(s map[string]Sample) {
	v.mu.Lock()
	v.samples = s
	v.mu.Unlock()
}

// Map returns every node with GPUs, by name, each GPU in device id order
// with its state; a held GPU sampled below idleBelow percent is idle.
func (v *View) Map(idleBelow float64) []MapNode {
	v.mu.RLock()
	defer v.mu.RUnlock()
	holder := v.holders()
	out := make([]MapNode, 0, len(v.nodes))
	for id, n := range v.nodes {
		if len(n.devices) == 0 {
			continue
		}
		mn := MapNode{ID: id, Name: n.name, Pool: n.pool, Status: n.status, Draining: n.draining, Eligible: n.eligible,
			GPUs: make([]MapGPU, 0, len(n.devices))}
		for dev, g := range n.devices {
			mg := MapGPU{ID: dev, Model: g.Model, State: GPUFree, Replicas: g.Replicas, PCIBusID: g.PCIBusID}
			if s, ok := v.samples[dev]; ok {
				mg.Utilization, mg.MemoryUsed, mg.MemoryTotal, mg.Temperature, mg.Power = s.Utilization, s.MemoryUsedMiB, s.MemoryTotalMiB, s.TemperatureC, s.PowerW
				mg.SMClock, mg.MemClock, mg.LastXID, mg.ECCCorrected, mg.ECCUncorrected = s.SMClockMHz, s.MemClockMHz, s.LastXID, s.ECCCorrected, s.ECCUncorrected
				mg.GPUIndex, mg.GPUUUID, mg.MIGInstance, mg.MIGProfile = s.GPUIndex, s.GPUUUID, s.MIGInstance, s.MIGProfile
				mg.MemCopyUtil, mg.EncoderUtil, mg.DecoderUtil, mg.DriverVersion = s.MemCopyUtil, s.EncoderUtil, s.DecoderUtil, s.DriverVersion
				mg.TensorActive = s.TensorActive
			}
			if a, ok := holder[dev]; ok {
				mg.State, mg.Namespace, mg.Job, mg.Alloc, mg.Tenant, mg.Queue = GPUHeld, a.Namespace, a.JobID, a.ID, a.Tenant, a.Queue
				j := v.jobs.live[jobKey{a.Namespace, a.JobID}]
				mg.Borrowed, mg.ParentJob, mg.Group = j.borrowed, j.parent, a.Group
				if i := slices.Index(a.GPUs, dev); i >= 0 && i < len(a.Tasks) {
					mg.Task = a.Tasks[i]
				}
				if mg.Utilization != nil && *mg.Utilization < idleBelow {
					mg.State = GPUIdle
				}
			}
			if !g.Healthy {
				mg.State, mg.Health = GPUUnhealthy, g.Health
				if g.Why == "recovering" {
					mg.State = GPURecovering
				}
			}
			mn.GPUs = append(mn.GPUs, mg)
		}
		sort.Slice(mn.GPUs, func(i, j int) bool { return mn.GPUs[i].ID < mn.GPUs[j].ID })
		out = append(out, mn)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}
