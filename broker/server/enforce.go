package server

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// With exclusive enforcement only the broker's token may write jobs in a
// tenant's namespaces (Nomad itself refuses the users'), so the broker is the
// only door: it lets the tenant's submitters through and writes for them with
// its own token. Reads always go to Nomad with the caller's own token.

// writeAuth is a request's answer to "who writes?": set once per request,
// read wherever the request is sent on to Nomad.
type writeAuth struct{ asBroker bool }

type writeAuthKey struct{}

func withWriteAuth(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), writeAuthKey{}, &writeAuth{}))
}

// writesAsBroker reports whether the broker writes this request to Nomad with
// its own token.
func writesAsBroker(r *http.Request) bool {
	a, _ := r.Context().Value(writeAuthKey{}).(*writeAuth)
	return a != nil && a.asBroker
}

// authorize lets a job write (what) in namespace ns go on, or refuses it (403). With
// exclusive enforcement in a tenant's namespace, the caller's token must hold
// one of the tenant's submitters, and the broker then writes with its own
// token; elsewhere the caller's token goes to Nomad, whose ACLs decide.
func (s *Server) authorize(r *http.Request, what, ns string) error {
	if !s.exclusive {
		return nil
	}
	t := s.policies.Current().TenantOf(ns)
	if t == nil {
		return nil
	}
	if front.Token(r) == "" {
		return front.Fail(front.ErrForbidden, "%s in namespace %q refused: send a Nomad ACL token (tenant %s's jobs are written by the broker for its submitters)", what, ns, t.Name)
	}
	g, err := s.callers.As(r).Grants()
	if err != nil {
		return front.Fail(front.ErrForbidden, "%s in namespace %q refused: %v", what, ns, err)
	}
	if !t.MaySubmit(g) {
		names := make([]string, len(t.Submitters))
		for i, sub := range t.Submitters {
			names[i] = sub.String()
		}
		return front.Fail(front.ErrForbidden, "%s in namespace %q refused: jobs of tenant %s are written by the broker for its submitters (%s), "+
			"and your token holds none of them", what, ns, t.Name, strings.Join(names, ", "))
	}
	if a, ok := r.Context().Value(writeAuthKey{}).(*writeAuth); ok {
		a.asBroker = true
	}
	s.log.Info("job write for a submitter", "call", what, "namespace", ns, "tenant", t.Name, "by", s.callers.As(r).Identity())
	return nil
}

// authorizeDeployment is authorize for a write on a deployment, in the
// deployment's own namespace (Nomad checks that one, whatever the query
// says), read with the caller's token.
func (s *Server) authorizeDeployment(r *http.Request, ns, id string) error {
	if !s.exclusive {
		return nil
	}
	var d struct{ Namespace string }
	if err := s.callers.As(r).Get("/v1/deployment/"+url.PathEscape(id), ns, &d); err != nil {
		return lookupFailed(err, "deployment write", id)
	}
	return s.authorize(r, "deployment write", d.Namespace)
}

// setWriter puts the token Nomad acts on for req: the broker's own when it
// writes for a submitter, else the caller's as sent.
func (s *Server) setWriter(r, req *http.Request) {
	if !writesAsBroker(r) {
		return
	}
	for _, h := range front.TokenHeaders {
		req.Header.Del(h)
	}
	if s.token == nil {
		return
	}
	if t := s.token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
}
