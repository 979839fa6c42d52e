package cluster

import (
	"fmt"
	"maps"
	"math"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

type node struct {
	schedulable bool
	pool        string
	datacenter  string
	// For the GPU map: what Nomad says of the node.
	name, status string
	draining     bool
	eligible     bool
	gpus         map[string]int  // healthy GPUs by model
	devices      map[string]GPU  // every GPU, by device id
	replicas     map[string]int  // replicas per GPU of its shared groups, by group name
	islands      map[string]bool // its groups that are one NVLink island each (island_groups)
	// cgroupBound: its Nomad (before 1.8) on cgroups v2 lets exec and
	// raw_exec tasks open only the default devices, not their GPUs.
	cgroupBound bool
}

// GPU is one GPU of a node.
type GPU struct {
	Model   string
	Healthy bool
	// Replicas is how many devices its physical GPU is offered as (0 for a
	// whole GPU): such a device is 1/Replicas of a GPU.
	Replicas int
	// Why is the class of what made it unhealthy: xid, ecc, lost,
	// recovering (healthy again, waiting out its hysteresis) or other.
	Why string
	// Health is the device plugin's description of its health.
	Health string
	// PCIBusID is where the device sits ("0000:3b:00.0"; a MIG instance or
	// a replica: its GPU's), as the plugin reports its locality.
	PCIBusID string
}

// whyUnhealthy classes the device plugin's health description.
func whyUnhealthy(desc string) string {
	d := strings.ToLower(desc)
	switch {
	case strings.HasPrefix(d, "recovering"):
		return "recovering"
	case strings.Contains(d, "xid"):
		return "xid"
	case strings.Contains(d, "ecc"):
		return "ecc"
	case strings.Contains(d, "lost"):
		return "lost"
	}
	return "other"
}

// ObserveNode records a node's schedulable, healthy GPUs.
func (v *View) ObserveNode(n *api.Node) {
	v.mu.Lock()
	v.observeNode(n, v.nodes[n.ID])
	v.mu.Unlock()
	v.notify()
}

// observeNode records n, which was was before (zero: unknown).
func (v *View) observeNode(n *api.Node, was node) {
	nd := node{schedulable: n.Status == api.NodeStatusReady && n.SchedulingEligibility != api.NodeSchedulingIneligible,
		pool: n.NodePool, datacenter: n.Datacenter, gpus: map[string]int{}, devices: map[string]GPU{}, replicas: map[string]int{}, islands: map[string]bool{},
		name: n.Name, status: n.Status, draining: n.Drain || n.DrainStrategy != nil, eligible: n.SchedulingEligibility != api.NodeSchedulingIneligible,
		cgroupBound: n.Attributes["unique.cgroup.version"] == "v2" && nomadBefore(n.Attributes["nomad.version"], 1, 8)}
	if n.NodeResources != nil {
		for _, d := range n.NodeResources.Devices {
			if d == nil || !nomadjob.IsGPUGroup(d.Vendor, d.Type) {
				continue
			}
			if island := d.Attributes["island"]; island != nil && island.IntVal != nil {
				nd.islands[d.Name] = true
			}
			replicas := 0
			if shared, ok := d.Attributes["shared"]; ok && shared != nil && shared.BoolVal != nil && *shared.BoolVal {
				if r := d.Attributes["replicas"]; r != nil && r.IntVal != nil && *r.IntVal > 1 && *r.IntVal <= 64 {
					replicas = int(*r.IntVal)
					nd.replicas[d.Name] = replicas
				}
			}
			for _, inst := range d.Instances {
				if inst == nil {
					continue
				}
				g := GPU{Model: d.Name, Healthy: inst.Healthy, Replicas: replicas, Health: inst.HealthDescription}
				if inst.Locality != nil {
					g.PCIBusID = inst.Locality.PciBusID
				}
				if !inst.Healthy {
					g.Why = whyUnhealthy(inst.HealthDescription)
				}
				nd.devices[inst.ID] = g
				if inst.Healthy {
					nd.gpus[d.Name]++
				}
			}
		}
	}
	if healthyGPUs(nd) > healthyGPUs(was) {
		v.gpusCameBack.Add(1)
	}
	if !samePlacement(was, nd) {
		v.nodesGen.Add(1)
	}
	v.nodes[n.ID], v.nodesDirty, v.rooms, v.order = nd, true, nil, nil
}

// samePlacement reports whether two reads of a node offer work the same:
// what preparing a job reads of it (the nodes that fit a request, NVLink
// islands, shared replicas). A node's status or drain alone is not that.
func samePlacement(a, b node) bool {
	return a.schedulable == b.schedulable && a.pool == b.pool && a.datacenter == b.datacenter &&
		maps.Equal(a.gpus, b.gpus) && maps.Equal(a.islands, b.islands) && maps.Equal(a.replicas, b.replicas)
}

// NodesGeneration moves whenever what preparing a job reads of the nodes
// changes (samePlacement): a node joins or leaves, or its GPUs, health,
// eligibility, pool or datacenter change. Allocations do not move it.
func (v *View) NodesGeneration() uint64 { return v.nodesGen.Load() }

// healthyGPUs is what a node offers to new work: its healthy GPUs while it
// is schedulable.
func healthyGPUs(n node) int {
	if !n.schedulable {
		return 0
	}
	total := 0
	for _, c := range n.gpus {
		total += c
	}
	return total
}

// GPUsCameBack counts the times a node's healthy, schedulable GPUs grew (a
// GPU recovered, a node came back, joined or became eligible): a reader that
// compares counts misses no dip and recovery between two of its looks.
func (v *View) GPUsCameBack() uint64 { return v.gpusCameBack.Load() }

// ForgetNode drops a deregistered node.
func (v *View) ForgetNode(id string) {
	v.mu.Lock()
	v.forgetNode(id)
	v.mu.Unlock()
	v.notify()
}

func (v *View) forgetNode(id string) {
	if _, ok := v.nodes[id]; ok {
		v.nodesGen.Add(1)
	}
	delete(v.nodes, id)
	v.nodesDirty, v.rooms, v.order = true, nil, nil
}

// NodesFitting counts schedulable nodes with at least gpus healthy GPUs of
// model ("" any model): where a system job's allocations can go.
func (v *View) NodesFitting(model string, gpus int) int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.nodesFitting(model, gpus)
}

func (v *View) nodesFitting(model string, gpus int) int { return v.nodes.fitting(model, gpus) }

// nodeSet is the view's nodes by id, as it keeps them: what each offers,
// and what they offer together. The view calls it with its lock held.
type nodeSet map[string]node

// fitting counts the nodes that fit gpus GPUs of model in one group (fits).
func (ns nodeSet) fitting(model string, gpus int) int {
	n := 0
	for _, nd := range ns {
		if fits(nd, model, gpus) {
			n++
		}
	}
	return n
}

// fittingIDs are the ids of the nodes fitting counts, sorted.
func (ns nodeSet) fittingIDs(model string, gpus int) []string {
	var ids []string
	for id, nd := range ns {
		if fits(nd, model, gpus) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// islanded reports whether some node offers model per NVLink island.
func (ns nodeSet) islanded(model string) bool {
	for _, nd := range ns {
		for group := range nd.islands {
			if policy.IslandModel(group) == model {
				return true
			}
		}
	}
	return false
}

// FittingNodes are the ids of the nodes NodesFitting counts, sorted.
func (v *View) FittingNodes(model string, gpus int) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.nodes.fittingIDs(model, gpus)
}

// Islanded reports whether some node offers model per NVLink island
// ("<model> (island N)" groups: the plugin's island_groups).
func (v *View) Islanded(model string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.nodes.islanded(model)
}

// fits reports whether a schedulable node has at least gpus healthy GPUs of
// model ("" any) in one device group, as Nomad takes them: a model offered
// per NVLink island from one of its islands.
func fits(nd node, model string, gpus int) bool {
	if !nd.schedulable {
		return false
	}
	have := nd.gpus[model]
	for group, c := range nd.gpus {
		if nd.islands[group] && policy.IslandModel(group) == model {
			have = max(have, c)
		}
	}
	if model == "" {
		have = 0
		for _, c := range nd.gpus {
			have += c
		}
	}
	return have >= gpus && have > 0
}

// totals sums schedulable, healthy GPUs by class, and the most on one
// node, a shared group's GPUs weighed by replicas (sharedReplicas).
func (ns nodeSet) totals(p *policy.Policy, replicas map[string]int) (capacity, maxAlloc policy.Quota) {
	capacity, maxAlloc = policy.Quota{}, policy.Quota{}
	for _, n := range ns {
		if !n.schedulable {
			continue
		}
		perNode := classify(p, n.gpus, admission.Usage{Replicas: replicas})
		for class, count := range perNode {
			capacity[class] += count
		}
		for class, count := range classify(p, askable(n), admission.Usage{Replicas: replicas}) {
			maxAlloc[class] = max(maxAlloc[class], count)
		}
	}
	return capacity, maxAlloc
}

// askable is, by group, the healthy GPUs one request can get on n: a model
// offered per NVLink island only its largest island's (Nomad takes all of a
// request's GPUs from one group).
func askable(n node) map[string]int {
	if len(n.islands) == 0 {
		return n.gpus
	}
	out := map[string]int{}
	largest := map[string]string{} // model: its largest island group
	for group, c := range n.gpus {
		if !n.islands[group] {
			out[group] = c
			continue
		}
		model := policy.IslandModel(group)
		if cur, ok := largest[model]; !ok || c > n.gpus[cur] {
			largest[model] = group
		}
	}
	for _, group := range largest {
		out[group] = n.gpus[group]
	}
	return out
}

// sharedReplicas is, per shared group, the fewest replicas per GPU any node
// offers it as.
func (ns nodeSet) sharedReplicas() map[string]int {
	out := map[string]int{}
	for _, n := range ns {
		for group, r := range n.replicas {
			if cur, ok := out[group]; !ok || r < cur {
				out[group] = r
			}
		}
	}
	return out
}

// Capacity is the number of schedulable, healthy GPUs (a GPU offered as
// replicas counted once).
func (v *View) Capacity() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	// Replicas weigh as in admission: the same share, whatever the node.
	u := admission.Usage{Replicas: v.nodes.sharedReplicas()}
	total := 0.0
	for _, n := range v.nodes {
		if n.schedulable {
			for model, c := range n.gpus {
				total += float64(c) * modelShare(model, u)
			}
		}
	}
	return int(math.Round(total))
}

// nomadBefore reports whether version (Nomad's nomad.version attribute,
// "1.6.3", "1.8.0-beta.1") is older than major.minor; false when it
// cannot be read.
func nomadBefore(version string, major, minor int) bool {
	var ma, mi int
	if n, _ := fmt.Sscanf(version, "%d.%d", &ma, &mi); n != 2 {
		return false
	}
	return ma < major || ma == major && mi < minor
}

// CgroupBoundGPUNodes are, of the schedulable nodes with GPUs, those (by
// name, sorted) where exec and raw_exec tasks cannot open their GPUs
// (node.cgroupBound), and how many schedulable GPU nodes there are. A view
// follows one region: it is the region asked of (Regions.CgroupBoundGPUNodes).
func (v *View) CgroupBoundGPUNodes(string) (bound []string, of int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, n := range v.nodes {
		if !n.schedulable || len(n.devices) == 0 {
			continue
		}
		of++
		if n.cgroupBound {
			bound = append(bound, n.name)
		}
	}
	sort.Strings(bound)
	return bound, of
}
