package nomadjob

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// A system or sysbatch job places its groups' count on every fitting node,
// nodes that join later included. So the broker pins each of its GPU task
// groups to the nodes it counted at admission, with a constraint of this
// form: a node that joins adds nothing the tenant was not charged for. A
// group registered again through the broker is pinned anew.
const (
	nodeIDTarget = "${node.unique.id}"
	pinOperand   = "set_contains_any"
)

// PinNodes writes into each GPU task group of a system or sysbatch job the
// nodes it may run on: those fitting says fit one of its allocations now,
// within any node-id set the group (or the job) already names.
func (r *Request) PinNodes(fitting func(model string, gpus int) []string) {
	if !isSystem(r.Job) {
		return
	}
	groups := r.Doc.Root().Get("Job").Get("TaskGroups").Elems()
	for i, tg := range r.Job.TaskGroups {
		if tg == nil || i >= len(groups) || !groups[i].IsObject() {
			continue
		}
		perModel, err := gpusPerAlloc(tg)
		if err != nil || len(perModel) == 0 {
			continue
		}
		var ids []string
		for k, m := range perModel {
			fit := fitting(m.model, m.gpus)
			if k == 0 {
				ids = fit
			} else {
				ids = slices.DeleteFunc(ids, func(id string) bool { return !slices.Contains(fit, id) })
			}
		}
		kept := tg.Constraints[:0:0]
		for _, c := range tg.Constraints {
			if set, ok := pinnedSet(c); ok {
				ids = slices.DeleteFunc(ids, func(id string) bool { return !slices.Contains(set, id) })
				continue // replaced by the pin, which keeps within it
			}
			kept = append(kept, c)
		}
		if set, ok := jobPin(r.Job); ok {
			ids = slices.DeleteFunc(ids, func(id string) bool { return !slices.Contains(set, id) })
		}
		tg.Constraints = append(kept, &api.Constraint{LTarget: nodeIDTarget, Operand: pinOperand, RTarget: strings.Join(ids, ",")})
		groups[i].Set("Constraints", tg.Constraints)
	}
}

// isSystem reports whether job places on every fitting node.
func isSystem(job *api.Job) bool {
	return job.Type != nil && (*job.Type == api.JobTypeSystem || *job.Type == api.JobTypeSysbatch)
}

// pinsOf writes the node-id sets the job and group tg are pinned to, each
// sorted, the job's then the group's: what a stamp binds.
func pinsOf(job *api.Job, tg *api.TaskGroup) string {
	var sets []string
	for _, cs := range [][]*api.Constraint{job.Constraints, tg.Constraints} {
		for _, c := range cs {
			if set, ok := pinnedSet(c); ok {
				set = slices.Clone(set)
				slices.Sort(set)
				sets = append(sets, strings.Join(set, ","))
			}
		}
		sets = append(sets, "|")
	}
	return strings.Join(sets, ";")
}

// pinnedSet is the node ids a set_contains_any constraint on the node's id
// allows, if c is one.
func pinnedSet(c *api.Constraint) ([]string, bool) {
	if c == nil || c.LTarget != nodeIDTarget || c.Operand != pinOperand {
		return nil, false
	}
	var ids []string
	for _, id := range strings.Split(c.RTarget, ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids, true
}

// pinned reports whether the job or task group tg is pinned to a node-id set.
func pinned(job *api.Job, tg *api.TaskGroup) bool { return pinnedNodes(job, tg) >= 0 }

// jobPin is the node-id set a job-level constraint allows, if any.
func jobPin(job *api.Job) ([]string, bool) {
	for _, c := range job.Constraints {
		if set, ok := pinnedSet(c); ok {
			return set, true
		}
	}
	return nil, false
}

// pinnedNodes bounds the nodes a system task group can run on: the fewest
// ids a node-id set of the group or its job allows; -1 for no bound.
func pinnedNodes(job *api.Job, tg *api.TaskGroup) int {
	n := -1
	consider := func(cs []*api.Constraint) {
		for _, c := range cs {
			if set, ok := pinnedSet(c); ok && (n < 0 || len(set) < n) {
				n = len(set)
			}
		}
	}
	consider(job.Constraints)
	consider(tg.Constraints)
	return n
}

// isService reports whether job is a long-running service.
func isService(job *api.Job) bool { return job.Type == nil || *job.Type == api.JobTypeService }

// GroupPins are the node-id sets job's GPU task groups are pinned to, by
// group (nil: none).
func GroupPins(job *api.Job) map[string][]string {
	var out map[string][]string
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		if perModel, err := gpusPerAlloc(tg); err != nil || len(perModel) == 0 {
			continue
		}
		for _, c := range tg.Constraints {
			if set, ok := pinnedSet(c); ok {
				if out == nil {
					out = map[string][]string{}
				}
				out[deref(tg.Name)] = set
			}
		}
	}
	return out
}

// Unpin takes the node-id sets off job's task groups (not the document):
// where it may run is then read without the pins the broker wrote.
func Unpin(job *api.Job) {
	for _, tg := range job.TaskGroups {
		if tg != nil {
			tg.Constraints = slices.DeleteFunc(slices.Clone(tg.Constraints), func(c *api.Constraint) bool {
				_, ok := pinnedSet(c)
				return ok
			})
		}
	}
}

// where reads where job may run: its datacenters, node pool and node-id
// set, and whether it places itself by rules of its own.
func where(job *api.Job) admission.Where {
	w := admission.Where{Datacenters: job.Datacenters, NoPin: isSystem(job) || isService(job) || len(job.Affinities) > 0 || len(job.Spreads) > 0 || constrains(job.Constraints)}
	if job.NodePool != nil {
		w.Pool = *job.NodePool
	}
	if set, ok := jobPin(job); ok {
		w.Nodes = set
	}
	for _, tg := range job.TaskGroups {
		if tg == nil {
			continue
		}
		w.NoPin = w.NoPin || len(tg.Affinities) > 0 || len(tg.Spreads) > 0 || constrains(tg.Constraints)
		for _, c := range tg.Constraints {
			if set, ok := pinnedSet(c); ok {
				w.Nodes = intersect(w.Nodes, set)
			}
		}
		for _, t := range tg.Tasks {
			if t == nil {
				continue
			}
			w.NoPin = w.NoPin || len(t.Affinities) > 0 || constrains(t.Constraints)
			if t.Resources != nil {
				for _, d := range t.Resources.Devices {
					w.NoPin = w.NoPin || d != nil && (len(d.Constraints) > 0 || len(d.Affinities) > 0)
				}
			}
		}
	}
	return w
}

// constrains reports whether cs holds a constraint other than a node-id set.
func constrains(cs []*api.Constraint) bool {
	for _, c := range cs {
		if _, ok := pinnedSet(c); !ok && c != nil {
			return true
		}
	}
	return false
}

// intersect is the ids in both sets (a nil set: any).
func intersect(a, b []string) []string {
	if a == nil {
		return b
	}
	return slices.DeleteFunc(slices.Clone(a), func(id string) bool { return !slices.Contains(b, id) })
}

// PinTo writes into each GPU task group the nodes admission placed its
// allocations on (placement mode broker), as its node-id set, in place of
// one it had (the nodes were chosen within it). It says what it wrote, for
// the answer.
func (r *Request) PinTo(placed admission.Placed) string {
	if len(placed) == 0 {
		return ""
	}
	groups := r.Doc.Root().Get("Job").Get("TaskGroups").Elems()
	var wrote []string
	for i, tg := range r.Job.TaskGroups {
		if tg == nil || i >= len(groups) || !groups[i].IsObject() {
			continue
		}
		ids := placed[deref(tg.Name)]
		if len(ids) == 0 {
			continue
		}
		ids = slices.Compact(slices.Sorted(slices.Values(ids)))
		tg.Constraints = append(slices.DeleteFunc(slices.Clone(tg.Constraints), func(c *api.Constraint) bool {
			_, ok := pinnedSet(c)
			return ok
		}), &api.Constraint{LTarget: nodeIDTarget, Operand: pinOperand, RTarget: strings.Join(ids, ",")})
		groups[i].Set("Constraints", tg.Constraints)
		wrote = append(wrote, fmt.Sprintf("task group %q on node %s", deref(tg.Name), strings.Join(ids, ", ")))
	}
	if len(wrote) == 0 {
		return ""
	}
	return "nomad-gpu: placed by the broker (placement mode broker), pinned with a ${node.unique.id} constraint: " + strings.Join(wrote, "; ")
}
