package server

import (
	"net/http"
	"time"
)

// identityTTL is how long a token's identity is reused before asking Nomad again.
const identityTTL = 30 * time.Second

type cachedIdentity struct {
	name    string
	expires time.Time
}

// identity names the caller for the audit trail: the ACL token's name and
// accessor when Nomad has ACLs on, else "anonymous". The secret is never kept.
func (s *Server) identity(r *http.Request) string {
	token := r.Header.Get("X-Nomad-Token")
	if token == "" {
		return "anonymous"
	}
	now := s.now()
	s.idMu.Lock()
	c, ok := s.identities[token]
	s.idMu.Unlock()
	if ok && now.Before(c.expires) {
		return c.name
	}
	var self struct{ AccessorID, Name string }
	name := "anonymous"
	if err := s.get(r, "/v1/acl/token/self", "", &self); err == nil && self.AccessorID != "" {
		name = self.Name + " (" + self.AccessorID + ")"
	}
	s.idMu.Lock()
	s.identities[token] = cachedIdentity{name: name, expires: now.Add(identityTTL)}
	s.idMu.Unlock()
	return name
}
