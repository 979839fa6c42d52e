package policy

import (
	"sort"
	"time"
)

// ReclaimRule releases GPUs that a running job holds without using them well:
// idle, past its lifetime, on a sick GPU, crash-looping, or never admitted.
// Exactly one condition is set.
type ReclaimRule struct {
	Name string
	// Selectors, ANDed; empty matches any.
	Workload, Queue, Tenant string

	Condition Condition
	// IdleBelow (percent) and IdleFor: every GPU of the allocation below
	// IdleBelow in every sample for IdleFor.
	IdleBelow float64
	IdleFor   time.Duration
	// MaxLifetime, and how far a job's own nomad-gpu.ttl may extend it.
	MaxLifetime, MaxExtend time.Duration
	// DeviceUnhealthyFor: a GPU of the allocation unhealthy this long.
	DeviceUnhealthyFor time.Duration
	// RestartsAbove restarts of a task Within this long.
	RestartsAbove int
	Within        time.Duration

	Action Action
	Grace  time.Duration // between the decision and the action
	Mode   Mode
	Pos    Pos // where it is defined
}

// Condition is what a reclaim rule looks for.
type Condition string

// The conditions, named by the attribute that sets each.
const (
	CondIdle       Condition = "idle_below"
	CondLifetime   Condition = "max_lifetime"
	CondUnhealthy  Condition = "device_unhealthy_for"
	CondRestarts   Condition = "restarts_above"
	CondUnadmitted Condition = "unadmitted"
	// CondPreempted is the built-in rule's: a borrowed allocation Nomad
	// preempted. No policy sets it.
	CondPreempted Condition = "preempted"
	// CondOverLimit is the built-in rule of over_limit = "reclaim": a
	// tenant holding more than its limit past over_limit_grace.
	CondOverLimit Condition = "over_limit"
	// CondMakeRoom is the built-in rule of make_room = "reclaim": a
	// tenant's own lower-band work in the way of its queued job.
	CondMakeRoom Condition = "make_room"
)

// PreemptedBorrowed is the built-in rule, always on: a borrowed job whose
// allocation Nomad preempted goes back to the broker's queue, so that its
// tenant is not charged for GPUs it no longer holds.
var PreemptedBorrowed = &ReclaimRule{Name: "preempted-borrowed", Condition: CondPreempted, Action: ActionRequeue, Mode: ModeEnforce}

// OverLimit is the built-in rule of over_limit = "reclaim": a tenant over
// its limit (a limit lowered by a reload) has its newest work requeued,
// borrowed and lowest-band first, until it is within the limit.
var OverLimit = &ReclaimRule{Name: "over-limit", Condition: CondOverLimit, Action: ActionRequeue, Mode: ModeEnforce}

// Action is what a reclaim decision does.
type Action string

// The actions.
const (
	ActionStop       Action = "stop"
	ActionReschedule Action = "reschedule"
	ActionRequeue    Action = "requeue"
	ActionNotify     Action = "notify"
)

// Mode says whether decisions are carried out.
type Mode string

// The modes; DryRun is the default.
const (
	ModeEnforce Mode = "enforce"
	ModeDryRun  Mode = "dry-run"
)

// ReclaimSettings are the reclaim_settings block.
type ReclaimSettings struct {
	Period    time.Duration // between passes (jittered)
	Retention time.Duration // finished decision records are kept this long
}

// Defaults of reclaim_settings.
const (
	DefaultReclaimPeriod    = 30 * time.Second
	DefaultReclaimRetention = 30 * 24 * time.Hour
)

// ReclaimRules are the reclaim rules in name order.
func (p *Policy) ReclaimRules() []*ReclaimRule {
	out := make([]*ReclaimRule, 0, len(p.Reclaim))
	for _, r := range p.Reclaim {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// MakeRoom is the built-in rule of make_room = "reclaim": a tenant's queued
// job that its guarantee would hold but for its own lower-band work has
// that work requeued (never another tenant's).
var MakeRoom = &ReclaimRule{Name: "make-room", Condition: CondMakeRoom, Action: ActionRequeue, Mode: ModeEnforce}
