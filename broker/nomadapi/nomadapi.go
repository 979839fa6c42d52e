// Package nomadapi is the broker's adapter to Nomad's HTTP API. It lists and
// follows the cluster (snapshot and event stream), and reads the agent's
// region and ACLs, jobs, and ACL tokens' grants. It registers the jobs the
// broker admits from its queue, sets the scheduler's preemption and
// re-evaluates blocked jobs. For reclaim, its Observer reads allocations and
// each node's GPU stats, and it stops jobs and allocations.
package nomadapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/internal/jsondoc"
)

// Client talks to Nomad with the broker's own token, which SetToken
// replaces while calls are in flight.
type Client struct {
	cur     atomic.Pointer[session]
	cfg     api.Config // what each session's API client is built from
	address string
	http    *http.Client
	refused atomic.Bool // Nomad's last answer to the broker's token was 403
	clock   atomic.Pointer[nomadClock]
	conns   *Conns // nil: a caller's own HTTP client, not counted
	// StreamIdle is how long the event stream may stay silent before it is
	// taken for broken (a half-open connection): Nomad sends a heartbeat
	// every 10 s. 0: DefaultStreamIdle.
	StreamIdle time.Duration
	regions    map[string]*Client // the other regions' (SetRegions)
}

// DefaultStreamIdle is three of Nomad's event stream heartbeats.
const DefaultStreamIdle = 30 * time.Second

var _ cluster.Source = (*Client)(nil)

// New returns a client for address with token.
func New(address, token string, tls *api.TLSConfig) (*Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.SecretID = address, token
	if tls != nil {
		cfg.TLSConfig = tls
	}
	if _, err := api.NewClient(cfg); err != nil {
		return nil, fmt.Errorf("nomad client for %s: %w", address, err)
	}
	hc, conns := cfg.HttpClient, (*Conns)(nil)
	if hc == nil {
		// ConfigureTLS sets up the transport it is given: give it one.
		t := http.DefaultTransport.(*http.Transport).Clone()
		conns = &Conns{}
		t.DialContext = conns.dial((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
		// Every user's call goes to this one agent: keep connections for
		// many at once (the default keeps 2, so the rest dial anew).
		t.MaxIdleConnsPerHost = 256
		// The broker reads Nomad's answers to registrations: asking for gzip
		// would have Nomad compress what the broker decompresses at once.
		// (Passed-through calls keep the caller's own Accept-Encoding.)
		t.DisableCompression = true
		hc = &http.Client{Transport: t}
		if tls != nil {
			if err := api.ConfigureTLS(hc, tls); err != nil {
				return nil, fmt.Errorf("nomad TLS: %w", err)
			}
		}
		// The API client's calls (listings, the event stream) share the
		// connections, and are counted with them.
		cfg.HttpClient = hc
	}
	c := &Client{cfg: *cfg, address: address, http: hc, conns: conns}
	if err := c.SetToken(token); err != nil {
		return nil, err
	}
	return c, nil
}

// session is the broker's token and an API client that sends it.
type session struct {
	api   *api.Client
	token string
}

// SetToken makes token the one every later call sends (the operator
// replaced a revoked or expiring token): calls in flight keep the old one.
func (c *Client) SetToken(token string) error {
	cfg := c.cfg
	cfg.SecretID = token
	a, err := api.NewClient(&cfg)
	if err != nil {
		return fmt.Errorf("nomad client for %s: %w", c.address, err)
	}
	if old := c.cur.Swap(&session{api: a, token: token}); old != nil {
		old.api.Close()
	}
	return nil
}

// Token is the token calls send now.
func (c *Client) Token() string { return c.cur.Load().token }

func (c *Client) nomad() *api.Client { return c.cur.Load().api }

// nomadClock is Nomad's time as its last answer said (its Date header) and
// this process's monotonic time when it came.
type nomadClock struct{ nomad, local time.Time }

// nomadClockFresh is how long one reading of Nomad's clock is used: the
// event stream's every resync and every read or registration give another.
const nomadClockFresh = 10 * time.Minute

// heard reads Nomad's clock from resp's Date header (whole seconds: the
// half second is added).
func (c *Client) heard(resp *http.Response) {
	if at, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		c.clock.Store(&nomadClock{nomad: at.Add(500 * time.Millisecond), local: time.Now()})
	}
}

// NomadNow is Nomad's time now, to the second: its last reading of Nomad's
// clock plus the time since by this process's monotonic clock, so that a
// step of this machine's clock changes nothing. false when no reading is
// fresh (Nomad has not answered for nomadClockFresh).
func (c *Client) NomadNow() (time.Time, bool) {
	k := c.clock.Load()
	if k == nil || time.Since(k.local) > nomadClockFresh {
		return time.Time{}, false
	}
	return k.nomad.Add(time.Since(k.local)), true
}

// TokenRefused reports whether Nomad refused the broker's own token at the
// last call that reached it (a listing, the event stream, a read or a
// registration): the token was deleted or expired.
func (c *Client) TokenRefused() bool { return c.refused.Load() }

// Unhealthy says why the broker cannot do its work through this client
// ("": it can), for GET /v1/gpu/health.
func (c *Client) Unhealthy() string {
	if c.TokenRefused() {
		return "Nomad refuses the broker's own token: nothing is admitted from the queue until it is valid again " +
			"(write a valid one to nomad.token_file and send the broker SIGHUP, or set nomad.token and restart it)"
	}
	return ""
}

// saw records what err says of the broker's token and returns it: a 403 is
// the token's (the broker's token may do anything), an answer is proof of a
// valid token; an error that never reached Nomad says nothing.
func (c *Client) saw(err error) error {
	var ue api.UnexpectedResponseError
	var tr interface{ TokenRefused() bool }
	switch {
	case err == nil:
		c.refused.Store(false)
	case errors.As(err, &tr) && tr.TokenRefused(), errors.As(err, &ue) && ue.StatusCode() == http.StatusForbidden:
		c.refused.Store(true)
	}
	return err
}

// Conns counts the broker's connections to Nomad, all of which come from
// one address: Nomad answers 429 to an address holding more than its
// limits.http_max_conns_per_client (100 by default).
type Conns struct{ open atomic.Int64 }

// Open is how many connections to Nomad are open now.
func (c *Conns) Open() int64 { return c.open.Load() }

// dial counts each connection dial opens until it is closed.
func (c *Conns) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.open.Add(1)
		return &countedConn{Conn: conn, open: &c.open}, nil
	}
}

type countedConn struct {
	net.Conn
	once sync.Once
	open *atomic.Int64
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// Connections counts the broker's connections to Nomad (nil when New was
// given an HTTP client of the caller's).
func (c *Client) Connections() *Conns { return c.conns }

// HTTPClient is the HTTP client configured for Nomad (TLS included).
func (c *Client) HTTPClient() *http.Client { return c.http }

// List returns every node, every live job, every active deployment and
// every allocation (all namespaces) with the index the event stream should
// resume after.
func (c *Client) List(ctx context.Context) (snap cluster.Snapshot, err error) {
	defer func() { c.saw(err) }()
	nodes, jobs, ended, nodesAt, jobsAt, err := c.list(ctx)
	if err != nil {
		return cluster.Snapshot{}, err
	}
	index := max(nodesAt, jobsAt)
	// Only what the view keeps: allocations that hold GPUs or are about to,
	// and those Nomad preempted. Nomad keeps ended ones for hours, and a
	// listing of them all grew with the cluster's history (2,500 of them
	// after a 10-minute soak), the broker's memory with it.
	stubs, meta, err := c.nomad().Allocations().List((&api.QueryOptions{Namespace: "*", Params: map[string]string{"resources": "true"},
		Filter: liveOrPreempted}).WithContext(ctx))
	if err != nil {
		return cluster.Snapshot{}, fmt.Errorf("list allocations: %w", err)
	}
	if jobs, ended, err = c.jobsOfAllocs(ctx, jobs, ended, jobsAt, stubs); err != nil {
		return cluster.Snapshot{}, err
	}
	allocs := make([]*api.Allocation, 0, len(stubs))
	for _, s := range stubs {
		allocs = append(allocs, &api.Allocation{ID: s.ID, Namespace: s.Namespace, JobID: s.JobID, TaskGroup: s.TaskGroup,
			NodeID: s.NodeID, DesiredStatus: s.DesiredStatus, ClientStatus: s.ClientStatus,
			PreemptedByAllocation: s.PreemptedByAllocation, AllocatedResources: s.AllocatedResources, TaskStates: s.TaskStates,
			CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex})
	}
	index = max(index, meta.LastIndex)
	// The listings are read one after another, and the stream resumes after
	// the last index they saw. A job, node or deployment that changed between
	// its listing and the allocations' would come neither as listed nor as an
	// event (jobs: jobsOfAllocs). Read after the allocations, nodes and
	// deployments are at least as new; what changed after that comes again
	// as events, from index, and their own indexes are left out of it.
	if nodes, _, err = c.nodesSince(ctx, nodes); err != nil {
		return cluster.Snapshot{}, err
	}
	all := (&api.QueryOptions{Namespace: "*"}).WithContext(ctx)
	deps, _, err := c.nomad().Deployments().List(all)
	if err != nil {
		return cluster.Snapshot{}, fmt.Errorf("list deployments: %w", err)
	}
	var active, failed []*api.Deployment
	var stable []*api.Job
	listed := make(map[[2]string]bool, len(jobs))
	for _, j := range jobs {
		listed[[2]string{nomadjob.Namespace(j), *j.ID}] = true
	}
	for _, d := range deps {
		switch d.Status {
		case api.DeploymentStatusFailed:
			failed = append(failed, d)
		case api.DeploymentStatusSuccessful, api.DeploymentStatusCancelled:
		default:
			active = append(active, d)
			if !autoReverts(d) {
				continue
			}
			j, err := c.StableJob(ctx, d.Namespace, d.JobID)
			if err != nil {
				return cluster.Snapshot{}, err
			}
			if j == nil {
				continue
			}
			stable = append(stable, j)
			if jobs, err = c.revertible(ctx, jobs, listed, d); err != nil {
				return cluster.Snapshot{}, err
			}
		}
	}
	return cluster.Snapshot{Nodes: nodes, Jobs: jobs, Deployments: active, Stable: stable, Failed: failed, Allocs: allocs, Ended: ended, Index: index}, nil
}

// nodesSince is nodes as Nomad lists them now, with the listing's index:
// those changed since they were read (nodes), or new, read; those gone,
// dropped.
func (c *Client) nodesSince(ctx context.Context, nodes []*api.Node) ([]*api.Node, uint64, error) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	stubs, meta, err := c.nomad().Nodes().List(q)
	if err != nil {
		return nil, 0, fmt.Errorf("list nodes: %w", err)
	}
	read := make(map[string]*api.Node, len(nodes))
	for _, n := range nodes {
		read[n.ID] = n
	}
	out := make([]*api.Node, 0, len(stubs))
	for _, s := range stubs {
		n := read[s.ID]
		if n == nil || n.ModifyIndex < s.ModifyIndex {
			if n, _, err = c.nomad().Nodes().Info(s.ID, q); err != nil {
				return nil, 0, fmt.Errorf("read node %s: %w", s.ID, err)
			}
		}
		out = append(out, n)
	}
	return out, meta.LastIndex, nil
}

// jobsOfAllocs is jobs with some read again: the job of each allocation
// changed since the jobs were listed (at index jobsAt) that the listing
// lacks, or has at an older version. Such a job came neither as listed nor
// as an event (List), and its allocation counted as held beside it until the
// next listing. One found stopped or dead since joins ended if it has the
// broker's stamp.
func (c *Client) jobsOfAllocs(ctx context.Context, jobs, ended []*api.Job, jobsAt uint64, stubs []*api.AllocationListStub) (_, _ []*api.Job, _ error) {
	at := make(map[[2]string]int, len(jobs))
	for i, j := range jobs {
		at[[2]string{nomadjob.Namespace(j), *j.ID}] = i
	}
	drop := map[int]bool{}
	read := map[[2]string]bool{} // jobs read that the listing lacks: once each, whatever their allocations
	for _, s := range stubs {
		if s.ModifyIndex <= jobsAt {
			continue // its job's change, if any, came before the jobs' listing
		}
		k := [2]string{s.Namespace, s.JobID}
		i, listed := at[k]
		if listed && (drop[i] || jobs[i].Version == nil || *jobs[i].Version >= s.JobVersion) || !listed && read[k] {
			continue
		}
		read[k] = !listed
		j, _, err := c.nomad().Jobs().Info(s.JobID, (&api.QueryOptions{Namespace: s.Namespace}).WithContext(ctx))
		if err != nil && !isNotFound(err) {
			return nil, nil, fmt.Errorf("read job %s/%s: %w", s.Namespace, s.JobID, err)
		}
		live := err == nil && j.ID != nil && nomadjob.Live(j)
		if err == nil && !live && j.Meta[nomadjob.MetaAdmission] != "" {
			ended = append(ended, j)
		}
		switch {
		case listed && live:
			jobs[i] = j
		case listed:
			drop[i] = true // stopped or purged since, as list leaves such jobs out
		case live:
			at[k] = len(jobs)
			jobs = append(jobs, j)
		}
	}
	if len(drop) == 0 {
		return jobs, ended, nil
	}
	kept := jobs[:0]
	for i, j := range jobs {
		if !drop[i] {
			kept = append(kept, j)
		}
	}
	return kept, ended, nil
}

// revertible is jobs with the job of d, an active deployment that reverts
// on failure, read if the listing left it out as dead (every allocation of
// the new version failed). The view keeps such a job at its stable version
// when an event tells of it; a listing without it counted nothing of it
// until its next event, and a queue pass in between took its GPUs.
func (c *Client) revertible(ctx context.Context, jobs []*api.Job, listed map[[2]string]bool, d *api.Deployment) ([]*api.Job, error) {
	key := [2]string{d.Namespace, d.JobID}
	if listed[key] {
		return jobs, nil
	}
	j, _, err := c.nomad().Jobs().Info(d.JobID, (&api.QueryOptions{Namespace: d.Namespace}).WithContext(ctx))
	switch {
	case isNotFound(err):
		return jobs, nil
	case err != nil:
		return nil, fmt.Errorf("read job %s/%s: %w", d.Namespace, d.JobID, err)
	case j.ID == nil || j.Stop != nil && *j.Stop:
		return jobs, nil
	}
	listed[key] = true
	return append(jobs, j), nil
}

// liveOrPreempted is the listing's filter (Nomad's go-bexpr over its
// allocation stubs).
const liveOrPreempted = `ClientStatus == "pending" or ClientStatus == "running" or PreemptedByAllocation != ""`

func autoReverts(d *api.Deployment) bool {
	for _, g := range d.TaskGroups {
		if g != nil && g.AutoRevert {
			return true
		}
	}
	return false
}

// StableJob is the latest version of job namespace/id that Nomad marks
// stable, the one a failing deployment with auto_revert goes back to (nil:
// none, or no such job).
func (c *Client) StableJob(ctx context.Context, namespace, id string) (*api.Job, error) {
	versions, _, _, err := c.nomad().Jobs().Versions(id, false, (&api.QueryOptions{Namespace: namespace}).WithContext(ctx))
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read versions of job %s/%s: %w", namespace, id, err)
	}
	for _, v := range versions { // newest first
		if v != nil && v.Stable != nil && *v.Stable {
			return v, nil
		}
	}
	return nil, nil
}

// list reads the nodes and the live jobs, and of the others the stubs of
// those with the broker's stamp (ended: Snapshot.Ended).
func (c *Client) list(ctx context.Context) (_ []*api.Node, jobs, ended []*api.Job, nodesAt, jobsAt uint64, _ error) {
	nodes, nodesAt, err := c.nodesSince(ctx, nil)
	if err != nil {
		return nil, nil, nil, 0, 0, err
	}
	// With each job's meta: the stamp of one that ended is read from it.
	all := (&api.QueryOptions{Namespace: "*", Params: map[string]string{"meta": "true"}}).WithContext(ctx)
	jobStubs, meta, err := c.nomad().Jobs().List(all)
	if err != nil {
		return nil, nil, nil, 0, 0, fmt.Errorf("list jobs: %w", err)
	}
	jobsAt = meta.LastIndex
	for _, s := range jobStubs {
		if s.Stop || nomadjob.Dead(s.Status, s.ModifyIndex, s.JobModifyIndex) {
			if s.Meta[nomadjob.MetaAdmission] != "" {
				ended = append(ended, &api.Job{ID: &s.ID, Namespace: &s.Namespace, Type: &s.Type, Status: &s.Status, Stop: &s.Stop,
					ModifyIndex: &s.ModifyIndex, JobModifyIndex: &s.JobModifyIndex, Meta: s.Meta})
			}
			continue
		}
		j, _, err := c.nomad().Jobs().Info(s.ID, (&api.QueryOptions{Namespace: s.Namespace}).WithContext(ctx))
		if err != nil {
			return nil, nil, nil, 0, 0, fmt.Errorf("read job %s/%s: %w", s.Namespace, s.ID, err)
		}
		jobs = append(jobs, j)
	}
	return nodes, jobs, ended, nodesAt, jobsAt, nil
}

// Events streams node, job, deployment, allocation and evaluation events of
// every namespace from index (a purge is told by its evaluation only).
func (c *Client) Events(ctx context.Context, index uint64) (_ <-chan *cluster.Events, err error) {
	defer func() { c.saw(err) }()
	q := url.Values{"index": {strconv.FormatUint(index, 10)}, "namespace": {"*"}}
	for _, t := range []api.Topic{api.TopicNode, api.TopicJob, api.TopicDeployment, api.TopicAllocation, api.TopicEvaluation} {
		q.Add("topic", string(t)+":*")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.address, "/")+"/v1/event/stream?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if t := c.Token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("event stream: %w", err)
	}
	c.heard(resp)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusForbidden {
			return nil, &TokenError{Op: "event stream", Msg: strings.TrimSpace(string(body))}
		}
		return nil, fmt.Errorf("event stream: Nomad answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	idle := c.StreamIdle
	if idle == 0 {
		idle = DefaultStreamIdle
	}
	out := make(chan *cluster.Events, 16)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		// A connection that went half-open sends nothing, not even an
		// error: closing the body ends the read that waits on it.
		var silent atomic.Bool
		watchdog := time.AfterFunc(idle, func() {
			silent.Store(true)
			resp.Body.Close()
		})
		defer watchdog.Stop()
		frames := cluster.NewFrames(resp.Body)
		for {
			frame := &cluster.Events{}
			if err := frames.Next(frame); err != nil {
				if silent.Load() {
					err = fmt.Errorf("no event and no heartbeat from Nomad for %s", idle)
				}
				frame = &cluster.Events{Err: fmt.Errorf("event stream: %w", err)}
			} else if watchdog.Reset(idle); frame.Index == 0 && len(frame.Events) == 0 {
				continue // Nomad's heartbeat, {}
			}
			select {
			case out <- frame:
			case <-ctx.Done():
				return
			}
			if frame.Err != nil {
				return
			}
		}
	}()
	return out, nil
}

// Agent is the region of the Nomad agent the broker talks to and whether it
// enforces ACLs, asked until the agent answers or ctx ends (Nomad may still
// be starting).
func (c *Client) Agent(ctx context.Context) (region string, acls bool, err error) {
	for {
		self, err := c.nomad().Agent().Self()
		if err == nil {
			region = api.GlobalRegion
			if r, ok := self.Config["Region"].(string); ok && r != "" {
				region = r
			}
			if acl, ok := self.Config["ACL"].(map[string]any); ok {
				acls, _ = acl["Enabled"].(bool)
			}
			return region, acls, nil
		}
		select {
		case <-ctx.Done():
			return "", false, fmt.Errorf("ask Nomad for its region: %w", err)
		case <-time.After(time.Second):
		}
	}
}

// Job returns the job Nomad has, or nil if none.
func (c *Client) Job(ctx context.Context, namespace, id string) (*api.Job, error) {
	j, _, err := c.nomad().Jobs().Info(id, (&api.QueryOptions{Namespace: namespace}).WithContext(ctx))
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read job %s/%s: %w", namespace, id, err)
	}
	return j, nil
}

// JobDoc returns the job Nomad has as Nomad sent it, every field kept (those
// of a newer Nomad than the broker knows too), and as read; nil if none.
func (c *Client) JobDoc(ctx context.Context, namespace, id string) (*jsondoc.Doc, *api.Job, error) {
	var raw json.RawMessage
	found, err := c.get(ctx, "/v1/job/"+url.PathEscape(id)+"?namespace="+url.QueryEscape(namespace), &raw)
	if err != nil || !found {
		return nil, nil, err
	}
	var job api.Job
	doc, err := jsondoc.Parse(raw, &job)
	if err != nil {
		return nil, nil, fmt.Errorf("read job %s/%s: %w", namespace, id, err)
	}
	return doc, &job, nil
}

// isNotFound reports whether Nomad answered 404.
func isNotFound(err error) bool {
	var ue api.UnexpectedResponseError
	return errors.As(err, &ue) && ue.StatusCode() == http.StatusNotFound
}

// Gone reports whether Nomad no longer has job namespace/id (purged, or
// collected as garbage).
func (c *Client) Gone(ctx context.Context, namespace, id string) (bool, error) {
	j, err := c.Job(ctx, namespace, id)
	return err == nil && j == nil, err
}

// Grants reads the grants of the ACL token with accessor (the broker's
// token must be a management token: Nomad shows other tokens to no one else);
// exists is false when it no longer exists or expired.
func (c *Client) Grants(ctx context.Context, accessor string) (policy.Grants, bool, error) {
	g, err := ReadGrants(ctx, c.get, "/v1/acl/token/"+url.PathEscape(accessor))
	if errors.Is(err, ErrNoToken) {
		return g, false, nil
	}
	return g, err == nil, err
}

// get reads path with the broker's token.
func (c *Client) get(ctx context.Context, path string, out any) (_ bool, err error) {
	defer func() { c.saw(err) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.address+path, nil)
	if err != nil {
		return false, err
	}
	if t := c.Token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", path, err)
	}
	c.heard(resp)
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return false, fmt.Errorf("GET %s: %w", path, err)
		}
		return true, nil
	case http.StatusNotFound:
		return false, nil
	case http.StatusForbidden:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return false, &TokenError{Op: "GET " + path, Msg: string(bytes.TrimSpace(msg))}
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return false, fmt.Errorf("GET %s: Nomad answered %d: %s", path, resp.StatusCode, bytes.TrimSpace(msg))
	}
}

// TokenError is Nomad's 403 to a read made with the broker's own token: the
// token was deleted or expired, or is not a management token.
type TokenError struct{ Op, Msg string }

func (e *TokenError) Error() string {
	return fmt.Sprintf("%s: Nomad refuses the broker's own token (403): %s", e.Op, e.Msg)
}

// TokenRefused is always true: what the admitter asks of any error.
func (e *TokenError) TokenRefused() bool { return true }

// Register sends a job register request body (as a user would) to Nomad and
// returns the job's new JobModifyIndex.
func (c *Client) Register(ctx context.Context, namespace string, body []byte) (_ uint64, err error) {
	defer func() { c.saw(err) }()
	u := c.address + "/v1/jobs?namespace=" + url.QueryEscape(namespace)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	if t := c.Token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("register job: %w", err)
	}
	c.heard(resp)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, &RegisterError{Status: resp.StatusCode, Msg: string(bytes.TrimSpace(msg))}
	}
	var out api.JobRegisterResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("register job: Nomad's answer: %w", err)
	}
	return out.JobModifyIndex, nil
}

// RegisterAt registers job (its JSON) only if Nomad's version of it is
// still the one at index (EnforceIndex). So a write of the broker's own on
// a running job (a sub-band move, a promotion, a re-pin) never overwrites a
// version made meanwhile. It returns the job's new JobModifyIndex.
func (c *Client) RegisterAt(ctx context.Context, namespace string, job []byte, index uint64) (uint64, error) {
	return c.Register(ctx, namespace, fmt.Appendf(nil, `{"Job":%s,"EnforceIndex":true,"JobModifyIndex":%d}`, job, index))
}

// Registered reports whether Nomad already has job namespace/id exactly as
// the register request body would make it (Nomad's own plan finds no
// difference), and the job's JobModifyIndex. A registration whose answer was
// lost is then not sent again: each sending is another evaluation.
func (c *Client) Registered(ctx context.Context, namespace, id string, body []byte) (_ uint64, _ bool, err error) {
	defer func() { c.saw(err) }()
	var reg struct {
		Job            json.RawMessage
		PolicyOverride bool
	}
	if err := json.Unmarshal(body, &reg); err != nil {
		return 0, false, fmt.Errorf("plan job %s/%s: %w", namespace, id, err)
	}
	plan, err := json.Marshal(map[string]any{"Job": reg.Job, "Diff": true, "PolicyOverride": reg.PolicyOverride})
	if err != nil {
		return 0, false, err
	}
	u := c.address + "/v1/job/" + url.PathEscape(id) + "/plan?namespace=" + url.QueryEscape(namespace)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(plan))
	if err != nil {
		return 0, false, err
	}
	if t := c.Token(); t != "" {
		req.Header.Set("X-Nomad-Token", t)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("plan job %s/%s: %w", namespace, id, err)
	}
	c.heard(resp)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, false, &RegisterError{Op: "plan job", Status: resp.StatusCode, Msg: string(bytes.TrimSpace(msg))}
	}
	var out api.JobPlanResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, false, fmt.Errorf("plan job %s/%s: Nomad's answer: %w", namespace, id, err)
	}
	return out.JobModifyIndex, out.Diff != nil && out.Diff.Type == "None" && out.JobModifyIndex != 0, nil
}

// RegisterError is Nomad's answer to a registration it did not take.
type RegisterError struct {
	Op     string // "" is "register job"
	Status int
	Msg    string
}

func (e *RegisterError) Error() string {
	op := e.Op
	if op == "" {
		op = "register job"
	}
	return fmt.Sprintf("%s: Nomad answered %d: %s", op, e.Status, e.Msg)
}

// Refused reports whether Nomad refused the job itself (4xx): sending it
// again unchanged cannot succeed. 408 and 429 are not the job's: Nomad did
// not read it in time, or the broker's address holds more connections than
// http_max_conns_per_client. The next pass sends it again (a queued job was
// parked for them, and stayed parked).
func (e *RegisterError) Refused() bool {
	switch e.Status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	}
	return e.Status >= 400 && e.Status < 500 && !e.TokenRefused()
}

// Throttled reports whether Nomad refused the connection's address more
// connections (429): the broker sends fewer at once until it passes.
func (e *RegisterError) Throttled() bool { return e.Status == http.StatusTooManyRequests }

// TokenRefused reports whether Nomad refused the broker's own token: the
// broker registers with a management token, which may write any job, so a
// 403 is the token's (deleted, expired), never the job's.
func (e *RegisterError) TokenRefused() bool { return e.Status == http.StatusForbidden }

// SetPreemption switches Nomad's preemption for batch and service jobs,
// keeping the rest of the scheduler configuration; it reports whether it had
// to change anything.
func (c *Client) SetPreemption(ctx context.Context, batch, service bool) (bool, error) {
	cur, _, err := c.nomad().Operator().SchedulerGetConfiguration((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("read scheduler configuration: %w", err)
	}
	cfg := cur.SchedulerConfig
	if cfg.PreemptionConfig.BatchSchedulerEnabled == batch && cfg.PreemptionConfig.ServiceSchedulerEnabled == service {
		return false, nil
	}
	cfg.PreemptionConfig.BatchSchedulerEnabled = batch
	cfg.PreemptionConfig.ServiceSchedulerEnabled = service
	if _, _, err := c.nomad().Operator().SchedulerSetConfiguration(cfg, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return false, fmt.Errorf("set scheduler preemption: %w", err)
	}
	return true, nil
}

// ReevaluateBlocked asks Nomad to evaluate again every job with a blocked
// evaluation. Nomad v1.6 unblocks evaluations when node capacity or status
// changes, but not when a device turns healthy again: the broker does it when it
// sees healthy GPUs come back. It returns how many jobs it re-evaluated.
func (c *Client) ReevaluateBlocked(ctx context.Context) (int, error) {
	evals, _, err := c.nomad().Evaluations().List((&api.QueryOptions{Namespace: "*", Filter: `Status == "blocked"`}).WithContext(ctx))
	if err != nil {
		return 0, fmt.Errorf("list blocked evaluations: %w", err)
	}
	seen := map[[2]string]bool{}
	for _, e := range evals {
		key := [2]string{e.Namespace, e.JobID}
		if seen[key] {
			continue
		}
		seen[key] = true
		if _, _, err := c.nomad().Jobs().ForceEvaluate(e.JobID, (&api.WriteOptions{Namespace: e.Namespace}).WithContext(ctx)); err != nil {
			return len(seen) - 1, fmt.Errorf("re-evaluate job %s/%s: %w", e.Namespace, e.JobID, err)
		}
	}
	return len(seen), nil
}

// placementWait bounds how long PlacedNothing waits for the evaluations
// of a registration to finish.
const placementWait = 10 * time.Second

// PlacedNothing tells, once Nomad's evaluations of the version of job
// namespace/id registered at index have finished, why Nomad placed nothing
// for it. It is "" when Nomad placed an allocation, waits for room in a
// blocked evaluation, or did not finish its evaluations within
// placementWait (it may still place). A requeued job registered again must
// never end there silently.
func (c *Client) PlacedNothing(ctx context.Context, namespace, id string, index uint64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, placementWait)
	defer cancel()
	q := (&api.QueryOptions{Namespace: namespace}).WithContext(ctx)
	for {
		evals, _, err := c.nomad().Jobs().Evaluations(id, q)
		if err != nil {
			if ctx.Err() != nil {
				return "", nil
			}
			return "", fmt.Errorf("read the evaluations of %s/%s: %w", namespace, id, err)
		}
		done, why := evaluated(evals, index)
		if done {
			if why == "" {
				return "", nil
			}
			allocs, _, err := c.nomad().Jobs().Allocations(id, true, q)
			if err != nil {
				return "", fmt.Errorf("read the allocations of %s/%s: %w", namespace, id, err)
			}
			for _, a := range allocs {
				if a.CreateIndex >= index {
					return "", nil
				}
			}
			return why, nil
		}
		select {
		case <-ctx.Done():
			return "", nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// evaluated reports whether the evaluations of the version registered at
// index have all finished, and, if none of them waits for room, what they
// say of the placements they could not make.
func evaluated(evals []*api.Evaluation, index uint64) (done bool, why string) {
	seen := false
	var failed []string
	for _, ev := range evals {
		if ev == nil || ev.JobModifyIndex < index {
			continue
		}
		seen = true
		switch {
		case ev.Status == api.EvalStatusPending || ev.Status == api.EvalStatusBlocked:
			return ev.Status == api.EvalStatusBlocked, "" // waiting for room: it places later
		case ev.BlockedEval != "":
			return true, ""
		}
		for tg, m := range ev.FailedTGAllocs {
			if m != nil {
				failed = append(failed, fmt.Sprintf("group %q: %d filtered, %d exhausted", tg, m.NodesFiltered, m.NodesExhausted))
			}
		}
	}
	if !seen {
		return false, ""
	}
	why = "its evaluation finished without placing an allocation"
	if len(failed) > 0 {
		sort.Strings(failed)
		why += " (" + strings.Join(failed, "; ") + ")"
	}
	return true, why
}

// NewInRegion is a client for Nomad region region through address (an agent
// of that region, or of a region federated with it, which forwards): every
// call it makes, the API client's and its own, names the region.
func NewInRegion(region, address, token string, tls *api.TLSConfig) (*Client, error) {
	c, err := New(address, token, tls)
	if err != nil {
		return nil, err
	}
	c.cfg.Region = region
	c.http.Transport = regionTransport{next: c.http.Transport, region: region}
	if err := c.SetToken(token); err != nil {
		return nil, err
	}
	return c, nil
}

// regionTransport adds ?region= to every request that names none.
type regionTransport struct {
	next   http.RoundTripper
	region string
}

func (t regionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Has("region") {
		return t.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	if r.URL.RawQuery != "" {
		r.URL.RawQuery += "&"
	}
	r.URL.RawQuery += "region=" + url.QueryEscape(t.region)
	return t.next.RoundTrip(r)
}

// SetRegions gives the clients of the other regions the broker governs, by
// name (set before the client is used): Region returns them.
func (c *Client) SetRegions(regions map[string]*Client) { c.regions = regions }

// Region is the client of a region: that region's, this one for its own or
// one not set.
func (c *Client) Region(region string) *Client {
	if r, ok := c.regions[region]; ok {
		return r
	}
	return c
}
