// Package gpuapi is the broker's own API under /v1/gpu/: the queue, the
// usage and its reports, approvals, reclaim decisions, regions, the audit
// trail and the GPU map. It answers as the caller may read, as Nomad's ACLs
// say; what it shares with the gate is in package front.
package gpuapi

import (
	"context"
	"net/http"
	"net/url"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policystore"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Cluster is what the API shows of the cluster.
type Cluster interface {
	front.Usage
	// Map and Followed serve the GPU map.
	Map(idleBelow float64) []cluster.MapNode
	Followed() (index, listings uint64)
}

// Regions are the Nomad regions the broker governs (cluster.Regions).
type Regions interface {
	// Governs reports whether region, as a request names it, is one.
	Governs(region string) bool
	Status() []cluster.RegionStatus
	// Names are the regions governed, the broker's own first.
	Names() []string
	// SetDrained sets the regions no new work goes to, region → who and when.
	SetDrained(drained map[string]string)
}

// Drains records which regions are drained, for every broker (consulkv.Drains).
type Drains interface {
	// Set drains region, by saying who and when, or resumes it (by ""),
	// and returns the drained regions now.
	Set(ctx context.Context, region, by string) (map[string]string, error)
}

// StoredProfiles are the right-sizing profiles as the leader last wrote them.
type StoredProfiles interface {
	List(ctx context.Context) ([]usage.Profile, error)
}

// Rollups are the daily GPU-hour rollups.
type Rollups interface {
	Days(ctx context.Context, from, to string) ([]usage.Rollup, error)
}

// API serves /v1/gpu/.
type API struct {
	log           hclog.Logger
	policies      policy.Source
	cluster       Cluster
	queue         front.Queue
	decisions     Decisions
	stored        StoredProfiles
	metrics       *metrics.Metrics
	rollups       Rollups
	fairShare     front.FairShare
	audit         *audit.Log
	approvalStore Approvals
	preemptions   admission.Preemptions
	setAside      SetAside
	policyStatus  func() policystore.Status
	healthy       func() string
	synced        func() bool
	forecast      *queue.Forecast
	region        string
	regions       Regions
	drains        Drains
	acls          bool
	exclusive     bool
	clock         clock.Clock
	newID         func() string
	callers       *front.Callers
	desk          *front.Desk
	access        *front.Access
	api           http.Handler // its routes, behind serveGPU's token check
}

// Options are what an API is built from; Clock and NewID default to the
// real ones. A store left nil leaves its endpoints unserved (404).
type Options struct {
	Log      hclog.Logger
	Nomad    string // the address Nomad is read at, as the caller
	Client   *http.Client
	Policies policy.Source
	Cluster  Cluster
	Queue    front.Queue
	// Decisions are the reclaim decision records.
	Decisions Decisions
	// RightSizing lists the leader's right-sizing profiles.
	RightSizing StoredProfiles
	Metrics     *metrics.Metrics
	Rollups     Rollups         // the usage report's days
	FairShare   front.FairShare // nil: the queue is shown by current share
	Audit       *audit.Log
	Approvals   Approvals
	// Preemptions are jobs' preemptions while borrowed: the queue shows
	// their re-borrow backoff.
	Preemptions admission.Preemptions
	SetAside    SetAside // the records of Consul KV set aside as unreadable
	// PolicyStatus is the policy in force and how its last reload went.
	PolicyStatus func() policystore.Status
	// Unhealthy says why the broker cannot do its work ("": it can), for
	// GET /v1/gpu/health (nil: always healthy).
	Unhealthy func() string
	// Synced reports whether the cluster view has listed Nomad once (nil:
	// taken as listed): until then the queue's order is not shown.
	Synced   func() bool
	Forecast *queue.Forecast // running jobs' ends, for queue estimates (nil: none)
	Region   string          // the broker's own Nomad region ("" or "global": Nomad's default)
	Regions  Regions         // nil: /v1/gpu/regions not served
	Drains   Drains          // nil: regions are not drained
	ACLs     bool            // Nomad enforces ACLs: the API then needs a valid token
	// Exclusive enforcement: in a tenant's namespace only its submitters
	// may write its jobs, and so cancel what they did not queue.
	Exclusive bool
	Clock     clock.Clock
	NewID     func() string
}

// New returns the API reading Nomad at o.Nomad as each caller.
func New(o Options) (*API, error) {
	u, err := url.Parse(o.Nomad)
	if err != nil {
		return nil, err
	}
	s := &API{log: o.Log, policies: o.Policies, cluster: o.Cluster, queue: o.Queue, decisions: o.Decisions, stored: o.RightSizing,
		metrics: o.Metrics, rollups: o.Rollups, fairShare: o.FairShare, audit: o.Audit, approvalStore: o.Approvals,
		preemptions: o.Preemptions, setAside: o.SetAside, policyStatus: o.PolicyStatus, healthy: o.Unhealthy, synced: o.Synced,
		forecast: o.Forecast, region: o.Region, regions: o.Regions, drains: o.Drains, acls: o.ACLs, exclusive: o.Exclusive,
		clock: o.Clock, newID: o.NewID}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	if s.clock == nil {
		s.clock = clock.Real
	}
	if s.newID == nil {
		s.newID = queue.NewID
	}
	if s.region == "" {
		s.region = api.GlobalRegion
	}
	client := o.Client
	if client == nil {
		client = &http.Client{}
	}
	s.callers = front.NewCallers(u, client, s.clock)
	s.desk = &front.Desk{Queue: s.queue, Policies: s.policies, Usage: s.cluster, Forecast: s.forecast, FairShare: s.fairShare,
		Clock: s.clock, Log: s.log, Audit: s.audit, Metrics: s.metrics, Synced: s.synced}
	s.access = &front.Access{ACLs: s.acls, Exclusive: s.exclusive, Policies: s.policies, Callers: s.callers}
	s.api = s.gpuAPI()
	return s, nil
}

// Handler serves /v1/gpu/.
func (s *API) Handler() http.Handler { return http.HandlerFunc(s.serveGPU) }
