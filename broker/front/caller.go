package front

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadapi"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// The broker reads Nomad as the caller wherever Nomad's ACLs must decide
// what the caller may see or do. Those reads are who the caller is
// (identity, for the audit trail), its token's grants (exclusive
// enforcement, the queue), the jobs and versions a call acts on, and a plan
// that proves the caller may submit a job. Callers holds what they share
// (Nomad's address, the identity cache); Caller is it for one request.
type Callers struct {
	upstream *url.URL
	client   *http.Client
	clock    clock.Clock

	mu         sync.Mutex
	identities map[[32]byte]cachedIdentity
}

// Caller reads Nomad with one request's token.
type Caller struct {
	*Callers
	r      *http.Request
	region string // the region its reads go to ("": the agent's own)
}

// NewCallers reads Nomad at upstream through client, as each caller.
func NewCallers(upstream *url.URL, client *http.Client, clk clock.Clock) *Callers {
	return &Callers{upstream: upstream, client: client, clock: clk, identities: map[[32]byte]cachedIdentity{}}
}

// As is Nomad read as the caller of r, in the region r names (?region=, as
// Nomad forwards it): a call about another region's job reads that job.
func (cs *Callers) As(r *http.Request) Caller {
	c := Caller{Callers: cs, r: r}
	if r.URL.RawQuery != "" {
		c.region = r.URL.Query().Get("region")
	}
	return c
}

// In is the caller reading another region's jobs (decide.RegionVersions).
func (c Caller) In(region string) decide.Versions {
	c.region = region
	return c
}

// Job and StableJob are the versions a registration is prepared with
// (decide.Versions), read as the caller.
func (c Caller) Job(_ context.Context, ns, id string) (*api.Job, error) {
	job, err := c.CurrentJob(ns, id)
	if errors.Is(err, ErrNoJob) {
		return nil, nil
	}
	return job, err
}

func (c Caller) StableJob(_ context.Context, ns, id string) (*api.Job, error) {
	return c.StableVersion(ns, id)
}

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
func Token(r *http.Request) string {
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

// BodyToken makes a token sent only in the request's body (secret) the
// request's token, as Nomad takes it: it reads one from the body when no
// header carries one. The broker then names, authorizes and forwards the
// caller Nomad acts for (a token in the body alone was audited as
// "anonymous").
func BodyToken(r *http.Request, secret string) {
	// Nomad trims a header's token, not the body's: one with spaces around
	// it is refused by Nomad, and stays the broker's anonymous caller.
	if secret != "" && secret == strings.TrimSpace(secret) && Token(r) == "" {
		r.Header.Set("X-Nomad-Token", secret)
	}
}

// Identity names the caller for the audit trail: the ACL token's name and
// accessor when Nomad has ACLs on, else "anonymous". The cache is keyed by a
// hash of the secret, which is never kept.
func (c Caller) Identity() string {
	name, _, _ := c.Resolve()
	return name
}

// Resolve is identity, with the token's accessor ("" without ACLs), and an
// error for a token Nomad does not know (ACLs on) or cannot be asked about:
// such a caller is not "anonymous".
func (c Caller) Resolve() (name, accessor string, err error) {
	secret := Token(c.r)
	if secret == "" {
		return "anonymous", "", nil
	}
	key, id, ok := c.cached()
	if ok {
		return id.name, id.accessor, nil
	}
	var self struct{ AccessorID, Name string }
	name = "anonymous"
	err = c.Get("/v1/acl/token/self", "", &self)
	var le *LookupError
	switch {
	case err == nil && self.AccessorID != "":
		name, accessor = self.Name+" ("+self.AccessorID+")", self.AccessorID
	case errors.As(err, &le) && le.Status == http.StatusBadRequest:
		// ACLs are off: Nomad answers "ACL support disabled".
	case err != nil:
		return "", "", fmt.Errorf("cannot resolve the Caller's token: %w", err)
	}
	c.mu.Lock()
	if len(c.identities) >= maxIdentities {
		c.identities = map[[32]byte]cachedIdentity{}
	}
	c.identities[key] = cachedIdentity{name: name, accessor: accessor, expires: c.clock.Now().Add(identityTTL)}
	c.mu.Unlock()
	return name, accessor, nil
}

// cached is the caller's identity while it is fresh, by the hash of its token.
func (c Caller) cached() ([32]byte, cachedIdentity, bool) {
	key := sha256.Sum256([]byte(Token(c.r)))
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.identities[key]
	return key, id, ok && c.clock.Now().Before(id.expires)
}

// ErrNoJob is a lookup of a job Nomad does not have.
var ErrNoJob = errors.New("no such job")

// LookupError is Nomad's answer to a lookup the broker needed.
type LookupError struct {
	Status int
	Msg    string
}

func (e *LookupError) Error() string { return fmt.Sprintf("Nomad answered %d: %s", e.Status, e.Msg) }

// CurrentJob reads a job with the caller's token; ErrNoJob when Nomad has none.
func (c Caller) CurrentJob(ns, jobID string) (*api.Job, error) {
	var job api.Job
	if err := c.Get("/v1/job/"+url.PathEscape(jobID), ns, &job); err != nil {
		var le *LookupError
		if errors.As(err, &le) && le.Status == http.StatusNotFound {
			return nil, fmt.Errorf("job %q in namespace %q: %w", jobID, ns, ErrNoJob)
		}
		return nil, err
	}
	return &job, nil
}

// Versions reads job ns/jobID's versions, newest first, as the caller.
func (c Caller) Versions(ns, jobID string) ([]*api.Job, error) {
	var out struct{ Versions []*api.Job }
	err := c.Get("/v1/job/"+url.PathEscape(jobID)+"/versions", ns, &out)
	return out.Versions, err
}

// StableVersion is job ns/jobID's latest stable version, the one a failing
// deployment with auto_revert goes back to (nil: none, or no such job).
func (c Caller) StableVersion(ns, jobID string) (*api.Job, error) {
	versions, err := c.Versions(ns, jobID)
	var le *LookupError
	if errors.As(err, &le) && le.Status == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, v := range versions {
		if v != nil && v.Stable != nil && *v.Stable {
			return v, nil
		}
	}
	return nil, nil
}

// Get reads a Nomad API path with the caller's token headers.
func (c Caller) Get(path, ns string, out any) error {
	return c.Do(http.MethodGet, path, ns, nil, out)
}

// Do calls Nomad with the caller's token headers and decodes a 200
// answer into out (if not nil); any other answer is a *LookupError. path is
// escaped (ids through url.PathEscape), with its query if any: it is sent as
// it is.
func (c Caller) Do(method, path, ns string, body []byte, out any) error {
	u := *c.upstream
	path, query, _ := strings.Cut(path, "?")
	unescaped, err := url.PathUnescape(path)
	if err != nil {
		return fmt.Errorf("path %q: %w", path, err)
	}
	u.Path, u.RawPath, u.RawQuery = unescaped, path, query
	if ns != "" {
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += "namespace=" + url.QueryEscape(ns)
	}
	if c.region != "" {
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += "region=" + url.QueryEscape(c.region)
	}
	req, err := http.NewRequestWithContext(c.r.Context(), method, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range TokenHeaders {
		if v := c.r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return Fail(ErrNomadUnreach, "Nomad at %s is unreachable (%s %s: %v)", c.upstream.Host, method, path, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return &LookupError{Status: resp.StatusCode, Msg: strings.TrimSpace(string(msg))}
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

// maxAnswer bounds what is read of one answer of Nomad's.
const maxAnswer = 16 << 20

// TokenHeaders are the headers Nomad reads a token from, in its order.
var TokenHeaders = []string{"X-Nomad-Token", "Authorization"}

// Grants are the roles and policies of the caller's token, read with it.
func (c Caller) Grants() (policy.Grants, error) {
	if _, _, err := c.Resolve(); err != nil {
		return policy.Grants{}, err
	}
	key, id, ok := c.cached()
	if ok && id.grants != nil {
		return *id.grants, nil
	}
	g, err := nomadapi.ReadGrants(c.r.Context(), c.Getter(), "/v1/acl/token/self")
	if errors.Is(err, nomadapi.ErrNoToken) {
		return g, errors.New("your ACL token is unknown to Nomad")
	}
	if err != nil {
		return g, err
	}
	c.mu.Lock()
	if id, ok := c.identities[key]; ok {
		id.grants = &g
		c.identities[key] = id
	}
	c.mu.Unlock()
	return g, nil
}

// Getter reads Nomad paths with the caller's token.
func (c Caller) Getter() nomadapi.Getter {
	return func(_ context.Context, path string, out any) (bool, error) {
		err := c.Get(path, "", out)
		var le *LookupError
		if errors.As(err, &le) && le.Status == http.StatusNotFound {
			return false, nil
		}
		return err == nil, err
	}
}

// Plan plans job (its JSON) with the caller's token: Nomad answers it only
// to a token that may submit the job in namespace ns.
func (c Caller) Plan(ns, id string, job json.RawMessage) error {
	body, _ := json.Marshal(map[string]any{"Job": job})
	return c.Do(http.MethodPost, "/v1/job/"+url.PathEscape(id)+"/plan", ns, body, nil)
}
