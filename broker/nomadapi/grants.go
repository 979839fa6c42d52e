package nomadapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Getter reads a Nomad API path into out with some token; found is false
// when Nomad answers 404.
type Getter func(ctx context.Context, path string, out any) (found bool, err error)

// ErrNoToken is a token Nomad does not have (any more) or that expired.
var ErrNoToken = errors.New("the ACL token no longer exists")

// ReadGrants reads the ACL token at tokenPath ("/v1/acl/token/self" with the
// caller's token, or "/v1/acl/token/<accessor>" with a management token), its
// roles and its policies. Their version changes whenever the token, one of its
// roles or one of their policies changes: a capability Nomad confirmed under
// one version still holds while the version is the same.
func ReadGrants(ctx context.Context, get Getter, tokenPath string) (policy.Grants, error) {
	var tok struct {
		AccessorID     string
		Type           string
		Policies       []string
		Roles          []struct{ ID, Name string }
		ExpirationTime *time.Time
		ModifyIndex    uint64
	}
	found, err := get(ctx, tokenPath, &tok)
	if err != nil {
		return policy.Grants{}, err
	}
	if !found {
		return policy.Grants{}, ErrNoToken
	}
	if tok.ExpirationTime != nil && !tok.ExpirationTime.After(time.Now()) {
		return policy.Grants{}, fmt.Errorf("%w: it expired at %s", ErrNoToken, tok.ExpirationTime.UTC().Format(time.RFC3339))
	}
	g := policy.Grants{Management: tok.Type == "management"}
	parts := []string{fmt.Sprintf("token %s@%d %s", tok.AccessorID, tok.ModifyIndex, tok.Type)}
	policies := map[string]bool{}
	for _, p := range tok.Policies {
		policies[p] = true
	}
	for _, link := range tok.Roles {
		var role struct {
			Name        string
			Policies    []struct{ Name string }
			ModifyIndex uint64
		}
		found, err := get(ctx, "/v1/acl/role/"+url.PathEscape(link.ID), &role)
		if err != nil {
			return policy.Grants{}, fmt.Errorf("read ACL role %s: %w", link.Name, err)
		}
		if !found {
			parts = append(parts, "role "+link.ID+" deleted") // it grants nothing any more
			continue
		}
		g.Roles = append(g.Roles, role.Name)
		parts = append(parts, fmt.Sprintf("role %s@%d", role.Name, role.ModifyIndex))
		for _, p := range role.Policies {
			policies[p.Name] = true
		}
	}
	for p := range policies {
		var pol struct{ ModifyIndex uint64 }
		found, err := get(ctx, "/v1/acl/policy/"+url.PathEscape(p), &pol)
		if err != nil {
			return policy.Grants{}, fmt.Errorf("read ACL policy %s: %w", p, err)
		}
		if !found {
			parts = append(parts, "policy "+p+" deleted")
			continue
		}
		g.Policies = append(g.Policies, p)
		parts = append(parts, fmt.Sprintf("policy %s@%d", p, pol.ModifyIndex))
	}
	sort.Strings(g.Roles)
	sort.Strings(g.Policies)
	sort.Strings(parts[1:])
	sum := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	g.Version = hex.EncodeToString(sum[:16])
	return g, nil
}
