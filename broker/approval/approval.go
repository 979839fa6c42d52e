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
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
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

// Apply is the policy and the least priority a decision on job must use
// under the approvals in force at now: the tenant's limit raised by the
// extra GPUs granted for that job, and the band granted for it (0: none).
func Apply(p *policy.Policy, approvals []Approval, namespace, job string, now time.Time) (*policy.Policy, int) {
	extra, priority := 0, 0
	for _, a := range approvals {
		if a.Namespace != namespace || a.Job != job || !a.Active(now) {
			continue
		}
		extra += a.ExtraGPUs
		priority = max(priority, a.Priority)
	}
	if t := p.TenantOf(namespace); t != nil && extra > 0 {
		p = p.WithExtraLimit(t.Name, extra)
	}
	return p, priority
}

// Raise gives an admitted decision the band an approval granted (0: none),
// and says in its reason what approvals it was admitted under (extra: a
// raised limit was decided on).
func Raise(d admission.Decision, extra bool, priority int) admission.Decision {
	if d.Outcome != admission.Admit && d.Outcome != admission.AdmitBorrowed {
		return d
	}
	if extra {
		d.Reason += "; the tenant's limit raised for this job by approval"
	}
	if priority > d.Priority {
		d.Priority = priority
		d.Reason += fmt.Sprintf("; priority %d by approval", priority)
	}
	return d
}
