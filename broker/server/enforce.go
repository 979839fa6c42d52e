package server

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
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

// authorize lets a job write (what) in namespace ns go on, or answers 403. With
// exclusive enforcement in a tenant's namespace, the caller's token must hold
// one of the tenant's submitters, and the broker then writes with its own
// token; elsewhere the caller's token goes to Nomad, whose ACLs decide.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, what, ns string) bool {
	if !s.exclusive {
		return true
	}
	t := s.policies.Current().TenantOf(ns)
	if t == nil {
		return true
	}
	if token(r) == "" {
		writeError(w, fail(errForbidden, "%s in namespace %q refused: send a Nomad ACL token (tenant %s's jobs are written by the broker for its submitters)", what, ns, t.Name))
		return false
	}
	g, err := s.grants(r)
	if err != nil {
		writeError(w, fail(errForbidden, "%s in namespace %q refused: %v", what, ns, err))
		return false
	}
	if !t.MaySubmit(g) {
		names := make([]string, len(t.Submitters))
		for i, sub := range t.Submitters {
			names[i] = sub.String()
		}
		writeError(w, fail(errForbidden, "%s in namespace %q refused: jobs of tenant %s are written by the broker for its submitters (%s), "+
			"and your token holds none of them", what, ns, t.Name, strings.Join(names, ", ")))
		return false
	}
	if a, ok := r.Context().Value(writeAuthKey{}).(*writeAuth); ok {
		a.asBroker = true
	}
	s.log.Info("job write for a submitter", "call", what, "namespace", ns, "tenant", t.Name, "by", s.identity(r))
	return true
}

// authorizeDeployment is authorize for a write on a deployment, in the
// deployment's own namespace (Nomad checks that one, whatever the query
// says), read with the caller's token.
func (s *Server) authorizeDeployment(w http.ResponseWriter, r *http.Request, ns, id string) bool {
	if !s.exclusive {
		return true
	}
	var d struct{ Namespace string }
	if err := s.get(r, "/v1/deployment/"+url.PathEscape(id), ns, &d); err != nil {
		s.lookupFailed(w, err, "deployment write", id)
		return false
	}
	return s.authorize(w, r, "deployment write", d.Namespace)
}

// grants are the roles and policies of the caller's token, read with it.
func (s *Server) grants(r *http.Request) (policy.Grants, error) {
	if _, _, err := s.resolve(r); err != nil {
		return policy.Grants{}, err
	}
	key, c, ok := s.cached(r)
	if ok && c.grants != nil {
		return *c.grants, nil
	}
	g, err := nomadapi.ReadGrants(r.Context(), s.callerGetter(r), "/v1/acl/token/self")
	if errors.Is(err, nomadapi.ErrNoToken) {
		return g, errors.New("your ACL token is unknown to Nomad")
	}
	if err != nil {
		return g, err
	}
	s.idMu.Lock()
	if c, ok := s.identities[key]; ok {
		c.grants = &g
		s.identities[key] = c
	}
	s.idMu.Unlock()
	return g, nil
}

// callerGetter reads Nomad paths with the caller's token.
func (s *Server) callerGetter(r *http.Request) nomadapi.Getter {
	return func(_ context.Context, path string, out any) (bool, error) {
		err := s.get(r, path, "", out)
		var le *lookupError
		if errors.As(err, &le) && le.status == http.StatusNotFound {
			return false, nil
		}
		return err == nil, err
	}
}

// setWriter puts the token Nomad acts on for req: the broker's own when it
// writes for a submitter, else the caller's as sent.
func (s *Server) setWriter(r, req *http.Request) {
	if !writesAsBroker(r) {
		return
	}
	for _, h := range tokenHeaders {
		req.Header.Del(h)
	}
	if s.token == nil {
		return
	}
	if t := s.token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
}
