package server

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
)

// Approvals are the approval records, and the snapshot admission reads.
type Approvals interface {
	Create(ctx context.Context, a approval.Approval) (bool, error)
	Update(ctx context.Context, a approval.Approval) (bool, error)
	Get(ctx context.Context, id string) (approval.Approval, error)
	List(ctx context.Context) ([]approval.Approval, error)
	Current() []approval.Approval
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
func (s *Server) approvalList(w http.ResponseWriter, r *http.Request) {
	all, err := s.approvalStore.List(r.Context())
	if err != nil {
		writeError(w, fail(errUnavailable, "%v", err))
		return
	}
	out := []approval.Approval{}
	readable := map[string]bool{}
	for _, a := range all {
		if s.mayRead(r, a.Namespace, readable) {
			out = append(out, a)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) readApproval(w http.ResponseWriter, r *http.Request, id string) (approval.Approval, bool) {
	a, err := s.approvalStore.Get(r.Context(), id)
	switch {
	case errors.Is(err, approval.ErrNotFound) || (err == nil && !s.mayRead(r, a.Namespace, map[string]bool{})):
		writeError(w, fail(errNotFound, "no approval %q", id))
		return a, false
	case err != nil:
		writeError(w, fail(errUnavailable, "%v", err))
		return a, false
	}
	return a, true
}

// requestApproval records a pending request by a caller who may read the
// job's namespace.
func (s *Server) requestApproval(w http.ResponseWriter, r *http.Request, who string) {
	var req ApprovalRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		writeError(w, fail(errBadRequest, "approval request: %v", err))
		return
	}
	name, accessor, _ := s.as(r).resolve()
	identity := name
	var grants []string
	if accessor != "" {
		g, err := s.as(r).grants()
		if err != nil {
			writeError(w, fail(errForbidden, "reading your token's grants: %v", err))
			return
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
		writeError(w, fail(errBadRequest, "approval request: %v", err))
		return
	}
	if err := approval.CheckPending(s.approvals(), identity, a.Namespace); err != nil {
		writeError(w, fail(errTooMany, "approval request: %v", err))
		return
	}
	t := s.policies.Current().TenantOf(a.Namespace)
	if t == nil {
		writeError(w, fail(errBadRequest, "approval request: namespace %q belongs to no tenant", a.Namespace))
		return
	}
	if err := t.CheckApproval(a.ExtraGPUs, a.Duration()); err != nil {
		writeError(w, fail(errBadRequest, "approval request: %v", err))
		return
	}
	if !s.mayRead(r, a.Namespace, map[string]bool{}) {
		writeError(w, fail(errForbidden, "your token may not read namespace %q", a.Namespace))
		return
	}
	if !s.audited(w, audit.Event{Who: who, What: audit.ApprovalAsk, ID: a.ID, Namespace: a.Namespace, Job: a.Job, Result: approvalAsks(a)}) {
		return
	}
	if ok, err := s.approvalStore.Create(r.Context(), a); err != nil || !ok {
		writeError(w, fail(errUnavailable, "approval request not recorded: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// decideApproval grants or denies a pending request: only an approver the
// policy names, and never the one who asked.
func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request, id string, grant bool, who string) {
	a, ok := s.readApproval(w, r, id)
	if !ok {
		return
	}
	name, accessor, err := s.as(r).resolve()
	if err != nil || accessor == "" {
		writeError(w, fail(errForbidden, "granting or denying an approval needs your Nomad ACL token (ACLs on): %v", err))
		return
	}
	g, err := s.as(r).grants()
	if err != nil {
		writeError(w, fail(errForbidden, "reading your token's grants: %v", err))
		return
	}
	tokenName := strings.TrimSuffix(name, " ("+accessor+")")
	p := s.policies.Current()
	switch {
	case !p.MayApprove(tokenName, g):
		writeError(w, fail(errForbidden, "%s is not one of the policy's approvers", tokenName))
		return
	case accessor == a.RequestedAccessor || a.SamePerson(tokenName, g):
		writeError(w, fail(errForbidden, "nobody grants or denies their own request, with any of their tokens (the same name, the name "+
			"and a suffix such as -ci, or all of an approver's roles and policies); another approver must"))
		return
	case a.State != approval.Pending:
		writeError(w, fail(errConflict, "approval %s is %s, not pending", id, a.State))
		return
	}
	if grant {
		// The policy may have changed since the request.
		t := p.TenantOf(a.Namespace)
		if t == nil {
			writeError(w, fail(errForbidden, "approval %s is for namespace %q, which belongs to no tenant now", id, a.Namespace))
			return
		}
		if err := t.CheckApproval(a.ExtraGPUs, a.Duration()); err != nil {
			writeError(w, fail(errForbidden, "approval %s cannot be granted: %v", id, err))
			return
		}
		if err := approval.CheckGrant(s.approvals(), a, t, s.clock.Now()); err != nil {
			writeError(w, fail(errForbidden, "approval %s cannot be granted: %v", id, err))
			return
		}
	}
	what, result := audit.ApprovalDeny, "denied"
	if grant {
		a.Grant(who, s.clock.Now())
		what, result = audit.ApprovalGrant, "granted until "+a.ExpiresAt.Format(time.RFC3339)+": "+approvalAsks(a)
	} else {
		a.State, a.DecidedBy, a.DecidedAt = approval.Denied, who, s.clock.Now().UTC()
	}
	if !s.audited(w, audit.Event{Who: who, What: what, ID: a.ID, Namespace: a.Namespace, Job: a.Job, Result: result}) {
		return
	}
	if ok, err := s.approvalStore.Update(r.Context(), a); err != nil || !ok {
		writeError(w, fail(errConflict, "approval %s changed meanwhile (%v); look again", id, err))
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func approvalAsks(a approval.Approval) string {
	if a.Priority > 0 {
		return fmt.Sprintf("priority %d for %s: %s", a.Priority, a.For, a.Reason)
	}
	return fmt.Sprintf("%d GPUs above the tenant's limit for %s: %s", a.ExtraGPUs, a.For, a.Reason)
}
