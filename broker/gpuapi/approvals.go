package gpuapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// Approvals are the approval records, and the snapshot admission reads.
type Approvals interface {
	Create(ctx context.Context, a approval.Approval) (bool, error)
	Update(ctx context.Context, a approval.Approval) (bool, error)
	Get(ctx context.Context, id string) (approval.Approval, error)
	List(ctx context.Context) ([]approval.Approval, error)
	front.Approvals
}

// ApprovalRequest is the body of POST /v1/gpu/approvals.
type ApprovalRequest struct {
	Namespace string `json:"namespace"`
	Job       string `json:"job"`
	Reason    string `json:"reason"`
	Priority  int    `json:"priority,omitempty"`
	ExtraGPUs int    `json:"extra_gpus,omitempty"`
	For       string `json:"for"`
}

// approvalList serves every approval the caller may read.
func (s *API) approvalList(_ http.ResponseWriter, r *http.Request) (any, error) {
	all, err := s.approvalStore.List(r.Context())
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	out := []approval.Approval{}
	readable := map[string]bool{}
	for _, a := range all {
		if s.access.MayRead(r, a.Namespace, readable) {
			out = append(out, a)
		}
	}
	return out, nil
}

// readApproval is approval id, if the caller may read it.
func (s *API) readApproval(r *http.Request, id string) (approval.Approval, error) {
	a, err := s.approvalStore.Get(r.Context(), id)
	switch {
	case errors.Is(err, approval.ErrNotFound) || (err == nil && !s.access.MayRead(r, a.Namespace, map[string]bool{})):
		return a, front.Fail(front.ErrNotFound, "no approval %q", id)
	case err != nil:
		return a, front.Fail(front.ErrUnavailable, "%v", err)
	}
	return a, nil
}

// requestApproval records a pending request by a caller who may read the
// job's namespace.
func (s *API) requestApproval(r *http.Request, who string) (any, error) {
	var req ApprovalRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		return nil, front.Fail(front.ErrBadRequest, "approval request: %v", err)
	}
	name, accessor, _ := s.callers.As(r).Resolve()
	identity := name
	var grants []string
	if accessor != "" {
		g, err := s.callers.As(r).Grants()
		if err != nil {
			return nil, front.Fail(front.ErrForbidden, "reading your token's grants: %v", err)
		}
		tokenName := strings.TrimSuffix(name, " ("+accessor+")")
		identity = approval.Identity(tokenName, g)
		if s.policies.Current().MayApprove(tokenName, g) {
			grants = approval.GrantsOf(g)
		}
	}
	a := approval.Approval{ID: s.newID(), Namespace: req.Namespace, Job: req.Job, Reason: req.Reason, Priority: req.Priority,
		ExtraGPUs: req.ExtraGPUs, For: req.For, State: approval.Pending, RequestedBy: who, RequestedAccessor: accessor,
		RequestedIdentity: identity, RequestedGrants: grants, RequestedAt: s.clock.Now().UTC()}
	if err := a.Check(); err != nil {
		return nil, front.Fail(front.ErrBadRequest, "approval request: %v", err)
	}
	if err := approval.CheckPending(front.InForce(s.approvalStore), identity, a.Namespace); err != nil {
		return nil, front.Fail(front.ErrTooMany, "approval request: %v", err)
	}
	t := s.policies.Current().TenantOf(a.Namespace)
	if t == nil {
		return nil, front.Fail(front.ErrBadRequest, "approval request: namespace %q belongs to no tenant", a.Namespace)
	}
	if err := t.CheckApproval(a.ExtraGPUs, a.Duration()); err != nil {
		return nil, front.Fail(front.ErrBadRequest, "approval request: %v", err)
	}
	if !s.access.MayRead(r, a.Namespace, map[string]bool{}) {
		return nil, front.Fail(front.ErrForbidden, "your token may not read namespace %q", a.Namespace)
	}
	if err := front.Audited(s.audit, audit.Event{Who: who, What: audit.ApprovalAsk, ID: a.ID, Namespace: a.Namespace, Job: a.Job, Result: approvalAsks(a)}); err != nil {
		return nil, err
	}
	if ok, err := s.approvalStore.Create(r.Context(), a); err != nil || !ok {
		return nil, front.Fail(front.ErrUnavailable, "approval request not recorded: %v", err)
	}
	return a, nil
}

// decideApproval grants or denies a pending request: only an approver the
// policy names, and never the one who asked.
func (s *API) decideApproval(r *http.Request, id string, grant bool, who string) (any, error) {
	a, err := s.readApproval(r, id)
	if err != nil {
		return nil, err
	}
	name, accessor, err := s.callers.As(r).Resolve()
	if err != nil || accessor == "" {
		return nil, front.Fail(front.ErrForbidden, "granting or denying an approval needs your Nomad ACL token (ACLs on): %v", err)
	}
	g, err := s.callers.As(r).Grants()
	if err != nil {
		return nil, front.Fail(front.ErrForbidden, "reading your token's grants: %v", err)
	}
	tokenName := strings.TrimSuffix(name, " ("+accessor+")")
	p := s.policies.Current()
	switch {
	case !p.MayApprove(tokenName, g):
		return nil, front.Fail(front.ErrForbidden, "%s is not one of the policy's approvers", tokenName)
	case accessor == a.RequestedAccessor || a.SamePerson(tokenName, g):
		return nil, front.Fail(front.ErrForbidden, "nobody grants or denies their own request, with any of their tokens (the same name, the name "+
			"and a suffix such as -ci, or all of an approver's roles and policies); another approver must")
	case a.State != approval.Pending:
		return nil, front.Fail(front.ErrConflict, "approval %s is %s, not pending", id, a.State)
	}
	if grant {
		// The policy may have changed since the request.
		t := p.TenantOf(a.Namespace)
		if t == nil {
			return nil, front.Fail(front.ErrForbidden, "approval %s is for namespace %q, which belongs to no tenant now", id, a.Namespace)
		}
		if err := t.CheckApproval(a.ExtraGPUs, a.Duration()); err != nil {
			return nil, front.Fail(front.ErrForbidden, "approval %s cannot be granted: %v", id, err)
		}
		if err := approval.CheckGrant(front.InForce(s.approvalStore), a, t, s.clock.Now()); err != nil {
			return nil, front.Fail(front.ErrForbidden, "approval %s cannot be granted: %v", id, err)
		}
	}
	what, result := audit.ApprovalDeny, "denied"
	if grant {
		a.Grant(who, s.clock.Now())
		what, result = audit.ApprovalGrant, "granted until "+a.ExpiresAt.Format(time.RFC3339)+": "+approvalAsks(a)
	} else {
		a.State, a.DecidedBy, a.DecidedAt = approval.Denied, who, s.clock.Now().UTC()
	}
	if err := front.Audited(s.audit, audit.Event{Who: who, What: what, ID: a.ID, Namespace: a.Namespace, Job: a.Job, Result: result}); err != nil {
		return nil, err
	}
	if ok, err := s.approvalStore.Update(r.Context(), a); err != nil || !ok {
		return nil, front.Fail(front.ErrConflict, "approval %s changed meanwhile (%v); look again", id, err)
	}
	return a, nil
}

func approvalAsks(a approval.Approval) string {
	if a.Priority > 0 {
		return fmt.Sprintf("priority %d for %s: %s", a.Priority, a.For, a.Reason)
	}
	return fmt.Sprintf("%d GPUs above the tenant's limit for %s: %s", a.ExtraGPUs, a.For, a.Reason)
}
