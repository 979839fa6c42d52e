package front

import (
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// Access is what a caller may read and write, as Nomad's ACLs say: the
// gate and the broker's API ask it the same way.
type Access struct {
	ACLs bool // Nomad enforces ACLs (off: everyone may do anything)
	// Exclusive enforcement: in a tenant's namespace only its submitters
	// write jobs.
	Exclusive bool
	Policies  policy.Source
	Callers   *Callers
}

// MayRead reports whether the caller may read namespace ns (any capability
// there lets Nomad show the namespace); always with ACLs off.
func (a *Access) MayRead(r *http.Request, ns string, cache map[string]bool) bool {
	if !a.ACLs {
		return true
	}
	ok, seen := cache[ns]
	if !seen {
		ok = a.Callers.As(r).Get("/v1/namespace/"+url.PathEscape(ns), "", &struct{}{}) == nil
		cache[ns] = ok
	}
	return ok
}

// MayCancel reports whether the caller may cancel a queued job: its
// submitter, or anyone who may write that job in its namespace.
func (a *Access) MayCancel(r *http.Request, e queue.Entry, who string) bool {
	if !a.ACLs || (who == e.SubmittedBy && who != "anonymous") {
		return true
	}
	var req struct{ Job json.RawMessage }
	body, err := e.Body()
	return err == nil && json.Unmarshal(body, &req) == nil && a.MayWrite(r, e.Namespace, e.JobID, req.Job)
}

// MayWriteJob is MayWrite for the job as Nomad has it, read as the caller.
func (a *Access) MayWriteJob(r *http.Request, ns, id string) bool {
	if !a.ACLs {
		return true
	}
	var job json.RawMessage
	if a.Callers.As(r).Get("/v1/job/"+url.PathEscape(id), ns, &job) != nil {
		return false
	}
	return a.MayWrite(r, ns, id, job)
}

// MayWrite reports whether the caller may write job id (its JSON) in
// namespace ns: with exclusive enforcement in a tenant's namespace, as one of
// its submitters; otherwise as Nomad says for a plan with the caller's token.
func (a *Access) MayWrite(r *http.Request, ns, id string, job json.RawMessage) bool {
	if !a.ACLs {
		return true
	}
	if t := a.Policies.Current().TenantOf(ns); a.Exclusive && t != nil {
		g, err := a.Callers.As(r).Grants()
		return err == nil && t.MaySubmit(g)
	}
	return a.Callers.As(r).Plan(ns, id, job) == nil
}

// Approvals are the approvals in force (consulkv.Approvals), which raise a
// job's limit or band.
type Approvals interface {
	Current() []approval.Approval
}

// InForce are the approvals in force in store (none without one).
func InForce(store Approvals) []approval.Approval {
	if store == nil {
		return nil
	}
	return store.Current()
}
