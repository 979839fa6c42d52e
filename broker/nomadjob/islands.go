package nomadjob

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// ModelTarget is the device group's name in a device constraint: its model.
const ModelTarget = "${device.model}"

// islandPattern matches a model's group and each of its NVLink island groups
// ("<model> (island N)", the plugin's island_groups): what a request that
// names the model is rewritten to (MatchIslands), and read back as that
// model (requestModel).
func islandPattern(model string) string {
	return "^" + regexp.QuoteMeta(model) + ` \(island [0-9]+\)$|^` + regexp.QuoteMeta(model) + "$"
}

// islandPatternModel is the model an islandPattern names, if p is one.
func islandPatternModel(p string) (string, bool) {
	quoted, rest, ok := strings.Cut(strings.TrimPrefix(p, "^"), ` \(island [0-9]+\)$|^`)
	if !ok || !strings.HasPrefix(p, "^") || rest != quoted+"$" {
		return "", false
	}
	re, err := regexp.Compile("^" + quoted + "$")
	if err != nil {
		return "", false
	}
	// quoted must be a QuoteMeta of a literal: it matches one string only.
	if lit, complete := re.LiteralPrefix(); complete {
		return lit, true
	}
	return "", false
}

// requestModel is the model a GPU request (named model, ok from GPURequest)
// can be given, the way Nomad matches it: the model it names, or else the
// one an equality constraint on ${device.model} names, or an islandPattern.
func requestModel(dev *api.RequestedDevice, model string) string {
	if model != "" {
		return model
	}
	for _, c := range dev.Constraints {
		if c == nil || c.LTarget != ModelTarget {
			continue
		}
		switch c.Operand {
		case "=", "==", "is":
			return c.RTarget
		case "regexp":
			if m, ok := islandPatternModel(c.RTarget); ok {
				return m
			}
		}
	}
	return ""
}

// MatchIslands rewrites each GPU request that names a model which some node
// offers per NVLink island (islanded; the plugin's island_groups, whose
// groups are "<model> (island N)"). It becomes one Nomad matches with those
// groups too: the vendor and type only, with a ${device.model} constraint
// of islandPattern. An equality constraint on ${device.model} becomes the
// same.
// A job written for the model then places as it did before islands. It
// returns what it wrote, for the answer.
func (r *Request) MatchIslands(islanded func(model string) bool) []string {
	var notes []string
	groups := r.Doc.Root().Get("Job").Get("TaskGroups").Elems()
	for i, tg := range r.Job.TaskGroups {
		if tg == nil || i >= len(groups) || !groups[i].IsObject() {
			continue
		}
		tasks := groups[i].Get("Tasks").Elems()
		for j, t := range tg.Tasks {
			if t == nil || t.Resources == nil || j >= len(tasks) || !tasks[j].IsObject() {
				continue
			}
			devices := tasks[j].Get("Resources").Get("Devices").Elems()
			for k, dev := range t.Resources.Devices {
				if dev == nil || k >= len(devices) || !devices[k].IsObject() {
					continue
				}
				if note := matchIslands(dev, islanded); note != "" {
					devices[k].Set("Name", dev.Name)
					devices[k].Set("Constraints", dev.Constraints)
					notes = append(notes, fmt.Sprintf("task %q: %s", t.Name, note))
				}
			}
		}
	}
	return notes
}

// matchIslands rewrites one request (see MatchIslands), saying what it
// wrote; "" where it wrote nothing.
func matchIslands(dev *api.RequestedDevice, islanded func(model string) bool) string {
	named, ok := GPURequest(dev.Name)
	if !ok || policy.IslandModel(named) != named || strings.HasSuffix(named, SharedSuffix) {
		return "" // not a GPU, or already an island's or a shared group
	}
	if named != "" {
		if !islanded(named) {
			return ""
		}
		id := ParseDeviceID(dev.Name)
		was := dev.Name
		dev.Name = id.Vendor + "/" + id.Type
		if id.Vendor == "" {
			dev.Name = id.Type
		}
		dev.Constraints = append(dev.Constraints, &api.Constraint{LTarget: ModelTarget, Operand: "regexp", RTarget: islandPattern(named)})
		return fmt.Sprintf("device %q is asked as %q with %s regexp %q: nodes offer %s per NVLink island (island_groups)", was, dev.Name, ModelTarget, islandPattern(named), named)
	}
	var wrote []string
	for _, c := range dev.Constraints {
		if c == nil || c.LTarget != ModelTarget || !islanded(c.RTarget) {
			continue
		}
		switch model := c.RTarget; c.Operand {
		case "=", "==", "is":
			c.Operand, c.RTarget = "regexp", islandPattern(model)
			wrote = append(wrote, fmt.Sprintf("constraint %s = %q is %s regexp %q", ModelTarget, model, ModelTarget, c.RTarget))
		}
	}
	if len(wrote) == 0 {
		return ""
	}
	return fmt.Sprintf("device %q: %s: nodes offer the model per NVLink island (island_groups)", dev.Name, strings.Join(wrote, ", "))
}
