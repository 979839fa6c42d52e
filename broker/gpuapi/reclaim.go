package gpuapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/consulkv"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Decisions are the reclaim decision records.
type Decisions interface {
	List(ctx context.Context) ([]reclaim.Record, error)
	Get(ctx context.Context, id string) (reclaim.Record, error)
	// Update writes a record if it has not changed since read.
	Update(ctx context.Context, r reclaim.Record) (bool, error)
}

// reclaimList serves GET /v1/gpu/reclaim: the decisions in namespaces the
// caller may read, newest first.
func (s *API) reclaimList(_ http.ResponseWriter, r *http.Request) (any, error) {
	recs, err := s.decisions.List(r.Context())
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	out := []reclaim.Record{}
	readable := map[string]bool{}
	for _, rec := range recs {
		if s.access.MayRead(r, rec.Namespace, readable) {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProposedAt.After(out[j].ProposedAt) })
	return out, nil
}

// SetAside lists the records of Consul KV set aside as unreadable.
type SetAside interface {
	SetAside(ctx context.Context) ([]consulkv.SetAsideRecord, error)
}

// setAsideList serves the records set aside as unreadable (keys and sizes,
// never their values) to an operator: with ACLs, a token that may read
// Nomad's operator settings.
func (s *API) setAsideList(_ http.ResponseWriter, r *http.Request) (any, error) {
	if s.acls && s.callers.As(r).Get("/v1/operator/scheduler/configuration", "", &struct{}{}) != nil {
		return nil, front.Fail(front.ErrForbidden, "the records set aside are an operator's to read: a token with operator read")
	}
	recs, err := s.setAside.SetAside(r.Context())
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	return recs, nil
}

// reclaimDecision serves GET and DELETE (cancel) /v1/gpu/reclaim/<id>.
func (s *API) reclaimDecision(r *http.Request, id, who string) (any, error) {
	if !queue.ValidID(id) {
		return nil, front.Fail(front.ErrBadRequest, "%q is not a reclaim decision id (a UUID, as `gpu-broker reclaim list` shows)", id)
	}
	rec, err := s.decisions.Get(r.Context(), id)
	if err == nil && !s.access.MayRead(r, rec.Namespace, map[string]bool{}) {
		err = reclaim.ErrNotFound // what the caller may not see does not exist for it
	}
	switch {
	case errors.Is(err, reclaim.ErrNotFound):
		return nil, front.Fail(front.ErrNotFound, "no reclaim decision %q", id)
	case err != nil:
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	switch r.Method {
	case http.MethodGet:
		return rec, nil
	case http.MethodDelete:
		if !s.access.MayWriteJob(r, rec.Namespace, rec.Job) {
			return nil, front.Fail(front.ErrForbidden, "only a token that may write job %q in namespace %q may cancel reclaim decision %s", rec.Job, rec.Namespace, id)
		}
		if rec.State != reclaim.Proposed || !rec.ActingSince.IsZero() {
			return nil, front.Fail(front.ErrConflict, "reclaim decision %s is %s%s: only a proposed decision not yet being carried out can be cancelled",
				id, rec.State, map[bool]string{true: " (being carried out)", false: ""}[!rec.ActingSince.IsZero() && rec.State == reclaim.Proposed])
		}
		event := audit.Event{Who: who, What: audit.ReclaimCancel, ID: id, Namespace: rec.Namespace, Job: rec.Job, Tenant: rec.Tenant,
			Queue: rec.Queue, Rule: rec.Rule, Result: "cancelled"}
		if err := front.Audited(s.audit, event); err != nil {
			return nil, err
		}
		rec.State, rec.Result = reclaim.Cancelled, "cancelled by "+who
		if ok, err := s.decisions.Update(r.Context(), rec); err != nil || !ok {
			event.Result = fmt.Sprintf("not cancelled: changed meanwhile (%v)", err)
			s.audit.Write(event)
			return nil, front.Fail(front.ErrConflict, "reclaim decision %s changed meanwhile (%v); look again", id, err)
		}
		s.metrics.Decision(rec.Rule, string(rec.Action), string(rec.State))
		s.log.Info("reclaim decision cancelled", "id", id, "rule", rec.Rule, "job", rec.Job, "namespace", rec.Namespace, "by", who)
		return rec, nil
	default:
		return nil, notAllowed(r)
	}
}
