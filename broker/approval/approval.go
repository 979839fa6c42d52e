// Package approval is temporary escalation: a user asks for one job to run
// at a higher priority or with more GPUs than its tenant's limit, for a
// while; one of the policy's approvers grants or denies it; it expires on
// its own. Pure: the stores and the HTTP API are elsewhere.
package approval

import (
	"errors"
	"fmt"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// States of an approval.
const (
	Pending = "pending"
	Granted = "granted"
	Denied  = "denied"
	Expired = "expired"
)

// MaxFor bounds how long one approval may last.
const MaxFor = 7 * 24 * time.Hour

// Approval is one request and what became of it.
type Approval struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Job       string `json:"job"`
	Reason    string `json:"reason"`
	// Exactly one of Priority (the band the job runs at) and ExtraGPUs
	// (above its tenant's limit, for this job only).
	Priority  int    `json:"priority,omitempty"`
	ExtraGPUs int    `json:"extra_gpus,omitempty"`
	For       string `json:"for"` // a duration, from the grant
	State     string `json:"state"`

	RequestedBy       string    `json:"requested_by"`
	RequestedAccessor string    `json:"requested_accessor,omitempty"`
	RequestedAt       time.Time `json:"requested_at"`
	DecidedBy         string    `json:"decided_by,omitempty"`
	DecidedAt         time.Time `json:"decided_at,omitempty"`
	ExpiresAt         time.Time `json:"expires_at,omitempty"`

	ModifyIndex uint64 `json:"-"`
}

// ErrNotFound is an approval that does not exist.
var ErrNotFound = errors.New("no such approval")

// Check validates a new request.
func (a Approval) Check() error {
	switch {
	case a.Namespace == "" || a.Job == "":
		return errors.New("an approval names a job and its namespace")
	case a.Reason == "":
		return errors.New("an approval says why (-reason)")
	case (a.Priority == 0) == (a.ExtraGPUs == 0):
		return errors.New("an approval asks for exactly one of a priority (-priority N) or GPUs above the limit (-extra-gpus N)")
	case a.Priority < 0 || a.Priority > 100:
		return fmt.Errorf("priority %d is not a Nomad priority (1 to 100)", a.Priority)
	case a.ExtraGPUs < 0:
		return fmt.Errorf("extra GPUs %d is below 0", a.ExtraGPUs)
	}
	d, err := time.ParseDuration(a.For)
	if err != nil || d <= 0 || d > MaxFor {
		return fmt.Errorf("for %q is not a duration of at most %s", a.For, MaxFor)
	}
	return nil
}

// Grant records approver's grant at now; the approval lasts For from now.
func (a *Approval) Grant(approver string, now time.Time) {
	d, _ := time.ParseDuration(a.For)
	a.State, a.DecidedBy, a.DecidedAt, a.ExpiresAt = Granted, approver, now.UTC(), now.UTC().Add(d)
}

// Active reports whether the approval is in force at now.
func (a Approval) Active(now time.Time) bool { return a.State == Granted && now.Before(a.ExpiresAt) }

// For is what the approvals in force at now grant job namespace/job: the
// extra GPUs of each, and the highest band granted.
func For(approvals []Approval, namespace, job string, now time.Time) admission.Granted {
	var g admission.Granted
	for _, a := range approvals {
		if a.Namespace != namespace || a.Job != job || !a.Active(now) {
			continue
		}
		g.ExtraGPUs += a.ExtraGPUs
		g.Priority = max(g.Priority, a.Priority)
	}
	return g
}
