package server

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// identityTTL is how long a token's identity is reused before asking Nomad again.
const identityTTL = 30 * time.Second

// maxIdentities bounds the identity cache: past it, the cache starts over.
const maxIdentities = 10_000

type cachedIdentity struct {
	name, accessor string
	grants         *policy.Grants // read when first needed
	expires        time.Time
}

// token is the caller's ACL token as Nomad reads it: X-Nomad-Token, else an
// "Authorization: Bearer" header.
func token(r *http.Request) string {
	if t := strings.TrimSpace(r.Header.Get("X-Nomad-Token")); t != "" {
		return t
	}
	scheme, value, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	value, _, _ = strings.Cut(strings.TrimSpace(value), " ")
	return value
}

// identity names the caller for the audit trail: the ACL token's name and
// accessor when Nomad has ACLs on, else "anonymous". The cache is keyed by a
// hash of the secret, which is never kept.
func (s *Server) identity(r *http.Request) string {
	name, _, _ := s.resolve(r)
	return name
}

// resolve is identity, with the token's accessor ("" without ACLs), and an
// error for a token Nomad does not know (ACLs on) or cannot be asked about:
// such a caller is not "anonymous".
func (s *Server) resolve(r *http.Request) (name, accessor string, err error) {
	secret := token(r)
	if secret == "" {
		return "anonymous", "", nil
	}
	key, c, ok := s.cached(r)
	if ok {
		return c.name, c.accessor, nil
	}
	var self struct{ AccessorID, Name string }
	name = "anonymous"
	err = s.get(r, "/v1/acl/token/self", "", &self)
	var le *lookupError
	switch {
	case err == nil && self.AccessorID != "":
		name, accessor = self.Name+" ("+self.AccessorID+")", self.AccessorID
	case errors.As(err, &le) && le.status == http.StatusBadRequest:
		// ACLs are off: Nomad answers "ACL support disabled".
	case err != nil:
		return "", "", fmt.Errorf("cannot resolve the caller's token: %w", err)
	}
	s.idMu.Lock()
	if len(s.identities) >= maxIdentities {
		s.identities = map[[32]byte]cachedIdentity{}
	}
	s.identities[key] = cachedIdentity{name: name, accessor: accessor, expires: s.now().Add(identityTTL)}
	s.idMu.Unlock()
	return name, accessor, nil
}

// cached is the caller's identity while it is fresh, by the hash of its token.
func (s *Server) cached(r *http.Request) ([32]byte, cachedIdentity, bool) {
	key := sha256.Sum256([]byte(token(r)))
	s.idMu.Lock()
	defer s.idMu.Unlock()
	c, ok := s.identities[key]
	return key, c, ok && s.now().Before(c.expires)
}
