// Package approval is temporary escalation. A user asks for one job to run
// at a higher priority or with more GPUs than its tenant's limit, for a
// while. One of the policy's approvers grants or denies it, and it expires
// on its own. Pure: the stores and the HTTP API are elsewhere.
package approval

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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

	RequestedBy       string `json:"requested_by"`
	RequestedAccessor string `json:"requested_accessor,omitempty"`
	// RequestedIdentity is the person who asked, whatever token they use
	// (Identity); nobody grants or denies a request of their own.
	RequestedIdentity string `json:"requested_identity,omitempty"`
	// RequestedGrants are the roles and policies of the token that asked
	// ("role:x", "policy:y", sorted), when it may approve: another token
	// holding all of them is the same approver's (SamePerson).
	RequestedGrants []string  `json:"requested_grants,omitempty"`
	RequestedAt     time.Time `json:"requested_at"`
	DecidedBy       string    `json:"decided_by,omitempty"`
	DecidedAt       time.Time `json:"decided_at,omitempty"`
	ExpiresAt       time.Time `json:"expires_at,omitempty"`

	ModifyIndex uint64 `json:"-"`
}

// ErrNotFound is an approval that does not exist.
var ErrNotFound = errors.New("no such approval")

// Bounds of what requests may hold: every admission reads the approvals, and
// anyone who may read a namespace may ask.
const (
	// MaxReason is the longest reason, in bytes.
	MaxReason = 1024
	// MaxPendingPerRequester and MaxPendingPerNamespace bound the requests
	// waiting for a decision.
	MaxPendingPerRequester = 10
	MaxPendingPerNamespace = 50
	// PendingFor is how long a request waits for a decision before it
	// expires undecided.
	PendingFor = policy.MaxApprovalDuration
)

// Check validates a new request.
func (a Approval) Check() error {
	switch {
	case a.Namespace == "" || a.Job == "":
		return errors.New("an approval names a job and its namespace")
	case a.Reason == "":
		return errors.New("an approval says why (-reason)")
	case len(a.Reason) > MaxReason:
		return fmt.Errorf("the reason is %d bytes, more than %d", len(a.Reason), MaxReason)
	case (a.Priority == 0) == (a.ExtraGPUs == 0):
		return errors.New("an approval asks for exactly one of a priority (-priority N) or GPUs above the limit (-extra-gpus N)")
	case a.Priority < 0 || a.Priority > 100:
		return fmt.Errorf("priority %d is not a Nomad priority (1 to 100)", a.Priority)
	case a.ExtraGPUs < 0:
		return fmt.Errorf("extra GPUs %d is below 0", a.ExtraGPUs)
	}
	d, err := time.ParseDuration(a.For)
	if err != nil || d <= 0 || d > policy.MaxApprovalDuration {
		return fmt.Errorf("for %q is not a duration of at most %s", a.For, policy.MaxApprovalDuration)
	}
	return nil
}

// Identity is the person an ACL token named tokenName with grants g stands
// for: its name, which Nomad's operators give each person's tokens. A token
// from an OIDC or JWT login is named after its auth method ("OIDC-<method>"),
// and Nomad v1.6 keeps none of the login's claims on it. Such a token
// stands for whoever holds its roles and policies: two logins with the
// same ones are one person (a role bound per person tells people apart).
func Identity(tokenName string, g policy.Grants) string {
	if !strings.HasPrefix(tokenName, "OIDC-") && !strings.HasPrefix(tokenName, "JWT-") {
		return tokenName
	}
	return tokenName + " roles=" + strings.Join(slices.Sorted(slices.Values(g.Roles)), ",") +
		" policies=" + strings.Join(slices.Sorted(slices.Values(g.Policies)), ",")
}

// CheckPending says why one more pending request by identity for namespace
// would be too many, or nil.
func CheckPending(approvals []Approval, identity, namespace string) error {
	mine, there := 0, 0
	for _, a := range approvals {
		if a.State != Pending {
			continue
		}
		if a.RequestedIdentity == identity {
			mine++
		}
		if a.Namespace == namespace {
			there++
		}
	}
	switch {
	case mine >= MaxPendingPerRequester:
		return fmt.Errorf("you have %d requests waiting for a decision already, the most there may be: wait for them, or ask an approver", mine)
	case there >= MaxPendingPerNamespace:
		return fmt.Errorf("namespace %q has %d requests waiting for a decision already, the most there may be", namespace, there)
	}
	return nil
}

// Settled reports what the leader does with a at now: expire it (pending
// for PendingFor, or granted past its time), or delete it (denied or
// expired, and decided or expired more than retention ago).
func (a Approval) Settled(now time.Time, retention time.Duration) (expire, remove bool) {
	switch a.State {
	case Pending:
		return now.Sub(a.RequestedAt) >= PendingFor, false
	case Granted:
		return !a.Active(now), false
	}
	ended := a.DecidedAt
	if a.State == Expired && !a.ExpiresAt.IsZero() {
		ended = a.ExpiresAt
	}
	if ended.IsZero() {
		ended = a.RequestedAt
	}
	return false, now.Sub(ended) >= retention
}

// GrantsOf lists a token's roles and policies as RequestedGrants does.
func GrantsOf(g policy.Grants) []string {
	out := make([]string, 0, len(g.Roles)+len(g.Policies))
	for _, r := range g.Roles {
		out = append(out, "role:"+r)
	}
	for _, p := range g.Policies {
		out = append(out, "policy:"+p)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SamePerson reports whether the token named tokenName, holding grants g,
// is one of the tokens of the person who asked for a. Nomad v1.6 records
// no token's creator, so a person is told by what their tokens show:
//   - the same identity (Identity: the token's name; for a login token, its
//     method, roles and policies);
//   - a name that is the asker's, or the asker's name is its, followed by
//     one of - . _ @ + and more ("dana-ci", "dana.laptop" are dana's);
//   - for a request an approver made, a token that holds all its roles
//     and policies (not none), whatever else it holds: what a token can do,
//     not its name, tells a second key to the same approver's rights (N5:
//     dana2, with dana's roles and one more, granted dana's request). Two
//     approvers are told apart by a role each of their own.
//
// For a request recorded before identities were, its token's name stands
// for the identity.
func (a Approval) SamePerson(tokenName string, g policy.Grants) bool {
	asker := a.RequestedIdentity
	if asker == "" {
		asker = strings.TrimSuffix(a.RequestedBy, " ("+a.RequestedAccessor+")")
	}
	if asker == Identity(tokenName, g) {
		return true
	}
	askerName := strings.TrimSuffix(a.RequestedBy, " ("+a.RequestedAccessor+")")
	if namePrefix(askerName, tokenName) || namePrefix(tokenName, askerName) {
		return true
	}
	mine := GrantsOf(g)
	if len(a.RequestedGrants) == 0 {
		return false
	}
	for _, r := range a.RequestedGrants {
		if _, held := slices.BinarySearch(mine, r); !held {
			return false
		}
	}
	return true
}

// namePrefix reports whether name is person's, a separator, and more.
func namePrefix(person, name string) bool {
	rest, ok := strings.CutPrefix(name, person)
	return ok && person != "" && len(rest) > 1 && strings.ContainsRune("-._@+", rune(rest[0]))
}

// Duration is how long the approval lasts once granted (For; 0 when For
// is not a duration, which Check refuses).
func (a Approval) Duration() time.Duration {
	d, _ := time.ParseDuration(a.For)
	return d
}

// Grant records approver's grant at now; the approval lasts For from now.
func (a *Approval) Grant(approver string, now time.Time) {
	a.State, a.DecidedBy, a.DecidedAt, a.ExpiresAt = Granted, approver, now.UTC(), now.UTC().Add(a.Duration())
}

// Active reports whether the approval is in force at now.
func (a Approval) Active(now time.Time) bool { return a.State == Granted && now.Before(a.ExpiresAt) }

// For is what the approvals in force at now grant job namespace/job under
// policy p: the extra GPUs of each, together at most its tenant's
// max_extra_gpus (however many were granted), and the highest band granted.
func For(approvals []Approval, p *policy.Policy, namespace, job string, now time.Time) admission.Granted {
	var g admission.Granted
	for _, a := range approvals {
		if a.Namespace != namespace || a.Job != job || !a.Active(now) {
			continue
		}
		g.ExtraGPUs += a.ExtraGPUs
		g.Priority = max(g.Priority, a.Priority)
	}
	if t := p.TenantOf(namespace); t != nil {
		g.ExtraGPUs = min(g.ExtraGPUs, t.Approvals.MaxExtraGPUs)
	} else {
		g.ExtraGPUs = 0
	}
	return g
}

// ExtraByTenant is the GPUs above their limits that the approvals in force at
// now grant each tenant's jobs, by the name of the tenant policy p gives the
// approval's namespace (none: not counted), each at most its max_extra_gpus.
func ExtraByTenant(approvals []Approval, p *policy.Policy, now time.Time) map[string]float64 {
	out := map[string]float64{}
	for _, a := range approvals {
		if t := p.TenantOf(a.Namespace); t != nil && a.Active(now) && a.ExtraGPUs > 0 {
			out[t.Name] = min(out[t.Name]+float64(a.ExtraGPUs), float64(t.Approvals.MaxExtraGPUs))
		}
	}
	return out
}

// CheckGrant says why granting a, of tenant t, at now would take the GPUs
// above the limit that the approvals in force grant its job, or its
// tenant's jobs together, past the tenant's max_extra_gpus; or nil. A
// bound per approval alone let three grants of +2 give one job +6.
func CheckGrant(approvals []Approval, a Approval, t *policy.Tenant, now time.Time) error {
	if a.ExtraGPUs == 0 {
		return nil
	}
	job, tenant := a.ExtraGPUs, a.ExtraGPUs
	for _, o := range approvals {
		if o.ID == a.ID || !o.Active(now) || o.ExtraGPUs == 0 || !slices.Contains(t.Namespaces, o.Namespace) {
			continue
		}
		tenant += o.ExtraGPUs
		if o.Namespace == a.Namespace && o.Job == a.Job {
			job += o.ExtraGPUs
		}
	}
	bound := t.Approvals.MaxExtraGPUs
	switch {
	case job > bound:
		return fmt.Errorf("job %q would be granted %d GPUs above the limit in all, with the approvals in force; tenant %q's approvals grant at most %d (approvals { max_extra_gpus })",
			a.Job, job, t.Name, bound)
	case tenant > bound:
		return fmt.Errorf("tenant %q's jobs would be granted %d GPUs above its limit in all, with the approvals in force; at most %d (approvals { max_extra_gpus })",
			t.Name, tenant, bound)
	}
	return nil
}

// ExtraGranted is ExtraByTenant of the approvals in force under the policy in
// force, as the reclaim rule over_limit asks for it.
func ExtraGranted(policies policy.Source, approvals interface{ Current() []Approval }) func(now time.Time) map[string]float64 {
	return func(now time.Time) map[string]float64 {
		return ExtraByTenant(approvals.Current(), policies.Current(), now)
	}
}
