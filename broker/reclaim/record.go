package reclaim

import (
	"errors"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// ErrNotFound is returned for an id that names no record (or is no id at all).
var ErrNotFound = errors.New("no such reclaim decision")

// State is where a decision stands.
type State string

// The states of a decision record: proposed, then executed, cancelled or
// failed; dry-run decisions are recorded and never carried out.
const (
	Proposed  State = "proposed"
	Executed  State = "executed"
	Cancelled State = "cancelled"
	Failed    State = "failed"
	DryRun    State = "dry-run"
)

// Record is a decision as it is kept (Consul KV nomad-gpu/reclaim/<id>):
// written before the action, updated after it.
type Record struct {
	ID         string        `json:"id"`
	Rule       string        `json:"rule"`
	Action     policy.Action `json:"action"`
	Mode       policy.Mode   `json:"mode"`
	Namespace  string        `json:"namespace"`
	Job        string        `json:"job"`
	Region     string        `json:"region,omitempty"` // the job's Nomad region ("": the broker's own)
	Allocs     []string      `json:"allocs"`
	WholeJob   bool          `json:"whole_job"`
	Tenant     string        `json:"tenant"`
	Queue      string        `json:"queue"`
	GPUs       int           `json:"gpus"`
	Evidence   string        `json:"evidence"`
	State      State         `json:"state"`
	ProposedAt time.Time     `json:"proposed_at"`
	ActAfter   time.Time     `json:"act_after"`
	// ActingSince is set (before the action) by the leader carrying it out: it
	// can no longer be cancelled, and a leader after a crash finishes it.
	ActingSince time.Time `json:"acting_since,omitzero"`
	ExecutedAt  time.Time `json:"executed_at,omitzero"`
	Result      string    `json:"result,omitempty"`

	ModifyIndex uint64 `json:"-"` // Consul's, for check-and-set
}

// NewRecord is decision d recorded as id at now: proposed, or dry-run when
// its rule only records.
func NewRecord(id string, d Decision, now time.Time) Record {
	state := Proposed
	if d.Mode != policy.ModeEnforce {
		state = DryRun
	}
	return Record{ID: id, Rule: d.Rule, Action: d.Action, Mode: d.Mode, Namespace: d.Namespace, Job: d.JobID, Region: d.Region,
		Allocs: d.Allocs, WholeJob: d.WholeJob, Tenant: d.Tenant, Queue: d.Queue, GPUs: d.GPUs, Evidence: d.Evidence,
		State: state, ProposedAt: now.UTC(), ActAfter: d.ActAfter.UTC()}
}

// Due reports whether a proposed decision's grace has passed at now.
func (r Record) Due(now time.Time) bool { return r.State == Proposed && !now.Before(r.ActAfter) }
