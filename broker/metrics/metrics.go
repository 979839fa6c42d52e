// Package metrics exposes the broker's Prometheus metrics: what the cluster
// view, the policy and the queue hold, read at each scrape, and counters of
// what the broker decided and measured. Labels are bounded: tenant, queue,
// gpu_class, node_pool, model, rule, action, state, outcome; never a job.
// The per-GPU telemetry gauges are labelled by node and gpu: as many series
// as the cluster has GPUs, and only on the leader, which samples them. The
// same come again under DCGM's names and labels (dcgm.go), with the
// holder's namespace, tenant and allocation.
package metrics

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// Cluster is what the view tells at a scrape.
type Cluster interface {
	Inventory() []cluster.NodeInventory
	Followed() (index, listings uint64)
	UsageWithout(p *policy.Policy, namespace, jobID string) admission.Usage
	Map(idleBelow float64) []cluster.MapNode
}

// Sources are what the scrape-time metrics are read from.
type Sources struct {
	Cluster  Cluster
	Policies policy.Source
	Queue    interface {
		List(ctx context.Context) ([]queue.Entry, error)
	}
	Leader interface{ IsLeader() bool }
	// PolicyState is when the policy in force was loaded, and whether the
	// last reload was refused (nil: not reported).
	PolicyState func() (loadedAt time.Time, reloadFailed bool)
	// TokenRefused is whether Nomad refuses the broker's own token now (nil:
	// not reported).
	TokenRefused func() bool
	// InBackoff is, by tenant, its jobs held back from borrowing by their
	// re-borrow backoff now (nil: not reported).
	InBackoff func() map[string]int
	// NomadConnections is how many HTTP connections the broker holds open to
	// Nomad now (nil: not reported).
	NomadConnections func() int64
	// Regions split the GPU and tenant series by region, when the broker
	// governs several (nil: not split).
	Regions Regions
}

// Metrics holds the broker's registry and counters. A nil *Metrics counts
// nothing (components built without metrics, in tests).
type Metrics struct {
	Registry   *prometheus.Registry
	admissions *prometheus.CounterVec
	decisions  *prometheus.CounterVec
	gpuSeconds *prometheus.CounterVec
	auditFails prometheus.Counter
	unreadable *prometheus.CounterVec
	queueWait  *prometheus.HistogramVec
	preempted  *prometheus.CounterVec
	lostWork   *prometheus.CounterVec
	reclaimed  *prometheus.CounterVec
	requests   *prometheus.HistogramVec
	estimates  *prometheus.HistogramVec
	allocs     *prometheus.CounterVec
	scaleUp    *prometheus.HistogramVec
	consulErrs *prometheus.CounterVec
	throttled  prometheus.Counter
	passes     *prometheus.CounterVec
	passTime   *prometheus.CounterVec
	unknown    *prometheus.CounterVec
	overLimit  *prometheus.CounterVec

	scaleMu   sync.Mutex
	scalingUp map[[2]string]scaleUp // admitted scale-ups waiting for an allocation to run

	// policies name the tenants, queues and classes a label may hold (set
	// by Observe; until then every name is Other).
	policies policy.Source
}

// Other is the label value of a tenant, queue or GPU class the policy does
// not name: a caller's text never becomes a series of its own.
const Other = "other"

// label is name as a label value: "" for none, name where known says the
// policy has it, else Other.
func (m *Metrics) label(name string, known func(*policy.Policy, string) bool) string {
	if name == "" {
		return ""
	}
	if m.policies == nil {
		return Other
	}
	if p := m.policies.Current(); p != nil && known(p, name) {
		return name
	}
	return Other
}

func (m *Metrics) tenant(name string) string {
	return m.label(name, func(p *policy.Policy, n string) bool { return p.Tenants[n] != nil })
}

func (m *Metrics) queue(name string) string {
	return m.label(name, func(p *policy.Policy, n string) bool { return p.Queues[n] != nil })
}

func (m *Metrics) class(name string) string {
	return m.label(name, func(p *policy.Policy, n string) bool { return p.Classes[n] != nil })
}

type scaleUp struct {
	at            time.Time
	tenant, queue string
}

// New registers the broker's counters, Go's and the process's; Observe
// adds what is read at each scrape.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_admissions_total",
			Help: "GPU job decisions by source (submit: a request to the broker; queue: a queued job's turn), outcome (admit, admit-borrowed, queue, reject), the rule that decided (if one did) and queue."},
			[]string{"source", "outcome", "rule", "queue"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_reclaim_decisions_total",
			Help: "Reclaim decisions by rule, action and the state they reached (proposed, dry-run, executed, failed, cancelled)."},
			[]string{"rule", "action", "state"}),
		gpuSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_gpu_seconds_total",
			Help: "GPU time held by running allocations (allocated), split into busy and idle (below usage.idle_below); tenant and queue empty for jobs the broker did not admit."},
			[]string{"tenant", "queue", "gpu_class", "state"}),
	}
	m.auditFails = prometheus.NewCounter(prometheus.CounterOpts{Name: "nomadgpu_audit_write_failures_total",
		Help: "Audit lines that could not be written (a user's request is then refused; the broker's own acts go on, logged)."})
	m.unreadable = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_kv_unreadable_total",
		Help: "Records in Consul KV that could not be read, set aside under quarantine/ (the others are read on), by kind: queue, reclaim, approvals, usage, usage-through, scaled, rightsizing."},
		[]string{"kind"})
	m.queueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nomadgpu_queue_wait_seconds",
		Help:    "Time jobs waited in the broker's queue, by queue and how the wait ended (admit, admit-borrowed, cancelled).",
		Buckets: []float64{1, 10, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600}}, []string{"queue", "outcome"})
	m.preempted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_preemptions_total",
		Help: "Allocations of borrowed jobs that Nomad preempted, as the broker observed them."}, []string{"tenant", "queue"})
	m.lostWork = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_preempted_gpu_seconds_total",
		Help: "GPU-seconds of work lost to preemption: each preempted allocation's GPUs × the time since it started."}, []string{"tenant", "queue"})
	m.reclaimed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_reclaimed_gpus_total",
		Help: "GPUs freed by executed reclaim decisions (stop, reschedule, requeue)."}, []string{"rule", "action"})
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nomadgpu_request_duration_seconds",
		Help:    "Time the broker took to answer, by class of request: register, plan, validate, scale, dispatch, revert, periodic force, stable, job write, deployment write, gpu-api, read (passed through).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"class"})
	m.estimates = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nomadgpu_queue_start_estimate_error_seconds",
		Help:    "How far a queued job's actual start was from the start estimated when it was queued (jobs with an estimate).",
		Buckets: []float64{1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}}, []string{"queue"})
	m.allocs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_allocations_total",
		Help: "What became of GPU allocations: complete, failed, lost, stopped (by a user, reclaim, an update or a drain), preempted, retried (a replacement placed)."},
		[]string{"tenant", "queue", "event"})
	m.scaleUp = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nomadgpu_scale_up_seconds",
		Help:    "From a scale-up the broker admitted to the first new allocation of that job running.",
		Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600}}, []string{"tenant", "queue"})
	m.scalingUp = map[[2]string]scaleUp{}
	m.consulErrs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_consul_errors_total",
		Help: "Requests to Consul that failed: unreachable (no answer) or server (a 5xx answer)."}, []string{"kind"})
	m.throttled = prometheus.NewCounter(prometheus.CounterOpts{Name: "nomadgpu_nomad_throttled_total",
		Help: "Nomad's 429 answers to calls through the broker (its users' and its own): the broker's address holds more connections than Nomad's limits.http_max_conns_per_client."})
	m.passes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_leader_passes_total",
		Help: "Passes the leader's loops finished, by loop (queue, reclaim) and result (ok, error): a loop whose count stops rising is stuck."},
		[]string{"loop", "result"})
	m.passTime = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_leader_pass_seconds_total",
		Help: "Time the leader's loops spent in their passes, by loop (queue, reclaim): its rate is the share of the time a loop is busy, which stays low while Nomad fails."},
		[]string{"loop"})
	m.unknown = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_unclassified_writes_total",
		Help: "Writes to Nomad's API that the broker's route table does not know, passed through (without exclusive enforcement; with it they are refused), by route pattern."},
		[]string{"route"})
	m.overLimit = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nomadgpu_tenant_over_limit_gpu_seconds_total",
		Help: "GPU-seconds a tenant held above its limit (raised by approvals in force) or above a region cap, as Nomad's allocations in its namespaces show them, admitted by the broker or not."},
		[]string{"tenant"})
	m.Registry.MustRegister(m.unknown, m.overLimit, m.admissions, m.decisions, m.gpuSeconds, m.auditFails, m.unreadable, m.queueWait, m.preempted, m.lostWork, m.reclaimed,
		m.requests, m.estimates, m.allocs, m.scaleUp, m.consulErrs, m.throttled, m.passes, m.passTime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observe has each scrape read the cluster view, the policy and the queue,
// and tenant, queue and class labels hold only the names the policy has.
func (m *Metrics) Observe(src Sources) {
	m.policies = src.Policies
	m.Registry.MustRegister(&scrape{src: src})
	m.Named(src.Policies.Current())
}

// allocEvents are what AllocEvent counts in nomadgpu_allocations_total.
var allocEvents = []string{"complete", "failed", "lost", "stopped", "preempted", "retried"}

// Named gives every counter keyed by p's names its series at 0, for every
// tenant, each of its queues and each GPU class. Then rate() and increase()
// see a series' first rise, and an alert on a tenant's first second over
// its limit fires. It is called at the start and after each
// reload; the series of names a reload removed stay at their last values.
func (m *Metrics) Named(p *policy.Policy) {
	if m == nil || p == nil {
		return
	}
	classes := slices.Collect(maps.Keys(p.Classes))
	if len(classes) == 0 {
		classes = []string{""}
	}
	for q := range p.Queues {
		for _, source := range []string{Submit, Queued} {
			for _, o := range []admission.Outcome{admission.Admit, admission.AdmitBorrowed, admission.Queue} { // a reject always names its rule
				m.admissions.WithLabelValues(source, string(o), "", q)
			}
		}
		for _, o := range []admission.Outcome{admission.Admit, admission.AdmitBorrowed, "cancelled"} {
			m.queueWait.WithLabelValues(q, string(o))
		}
	}
	for name, t := range p.Tenants {
		m.overLimit.WithLabelValues(name)
		for _, q := range t.Queues {
			m.preempted.WithLabelValues(name, q)
			m.lostWork.WithLabelValues(name, q)
			for _, e := range allocEvents {
				m.allocs.WithLabelValues(name, q, e)
			}
			for _, c := range classes {
				for _, state := range []string{"allocated", "busy", "idle"} {
					m.gpuSeconds.WithLabelValues(name, q, c, state)
				}
			}
		}
	}
}

// Loops of the leader, counted by Pass.
const (
	LoopQueue   = "queue"
	LoopReclaim = "reclaim"
)

// Pass counts a finished pass of one of the leader's loops, and the time it took.
func (m *Metrics) Pass(loop string, took time.Duration, err error) {
	if m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.passes.WithLabelValues(loop, result).Inc()
		m.passTime.WithLabelValues(loop).Add(took.Seconds())
	}
}

// Sources of admissions.
const (
	Submit = "submit"
	Queued = "queue"
	// AutoRevert: Nomad reverted a job on its own (a failed deployment).
	AutoRevert = "auto-revert"
)

// Admission counts one decision on a GPU job, from source.
func (m *Metrics) Admission(source string, d admission.Decision) {
	if m != nil {
		m.admissions.WithLabelValues(source, string(d.Outcome), d.Rule, m.queue(d.Queue)).Inc()
	}
}

// Decision counts a reclaim decision reaching state.
func (m *Metrics) Decision(rule, action, state string) {
	if m != nil {
		m.decisions.WithLabelValues(rule, action, state).Inc()
	}
}

// QueueWait observes how long a queued job waited, and how that ended.
func (m *Metrics) QueueWait(queue, outcome string, waited time.Duration) {
	if m != nil {
		m.queueWait.WithLabelValues(m.queue(queue), outcome).Observe(waited.Seconds())
	}
}

// ScaledUp notes a scale-up the broker admitted at, to time it to its first
// new allocation running.
func (m *Metrics) ScaledUp(namespace, job, tenant, queue string, at time.Time) {
	if m == nil {
		return
	}
	m.scaleMu.Lock()
	m.scalingUp[[2]string{namespace, job}] = scaleUp{at: at, tenant: tenant, queue: queue}
	m.scaleMu.Unlock()
}

// AllocEvent counts what became of a GPU allocation, and times a scale-up
// whose first new allocation runs.
func (m *Metrics) AllocEvent(e cluster.AllocEvent) {
	if m == nil {
		return
	}
	if e.Event != "running" {
		m.allocs.WithLabelValues(m.tenant(e.Tenant), m.queue(e.Queue), e.Event).Inc()
		return
	}
	key := [2]string{e.Namespace, e.Job}
	m.scaleMu.Lock()
	s, ok := m.scalingUp[key]
	delete(m.scalingUp, key)
	m.scaleMu.Unlock()
	if ok {
		m.scaleUp.WithLabelValues(m.tenant(s.tenant), m.queue(s.queue)).Observe(e.At.Sub(s.at).Seconds())
	}
}

// EstimateError observes how far a queued job's start was from its estimate.
func (m *Metrics) EstimateError(queue string, off time.Duration) {
	if m != nil {
		m.estimates.WithLabelValues(m.queue(queue)).Observe(off.Abs().Seconds())
	}
}

// Preempted counts a preempted allocation of tenant's and the GPU-seconds
// of work it lost.
func (m *Metrics) Preempted(tenant, queue string, lostGPUSeconds float64) {
	if m != nil {
		tenant, queue = m.tenant(tenant), m.queue(queue)
		m.preempted.WithLabelValues(tenant, queue).Inc()
		m.lostWork.WithLabelValues(tenant, queue).Add(lostGPUSeconds)
	}
}

// Reclaimed counts the GPUs an executed reclaim decision freed.
func (m *Metrics) Reclaimed(rule, action string, gpus int) {
	if m != nil {
		m.reclaimed.WithLabelValues(rule, action).Add(float64(gpus))
	}
}

// OverLimit adds the GPU-seconds each tenant held above its limit.
func (m *Metrics) OverLimit(byTenant map[string]float64) {
	if m == nil {
		return
	}
	for t, s := range byTenant {
		m.overLimit.WithLabelValues(m.tenant(t)).Add(s)
	}
}

// UnclassifiedWrite counts a write passed through that the broker's route
// table does not know; route is the table's pattern, never the caller's path.
func (m *Metrics) UnclassifiedWrite(route string) {
	if m != nil {
		m.unknown.WithLabelValues(route).Inc()
	}
}

// Request observes the time the broker took to answer a request of class.
func (m *Metrics) Request(class string, took time.Duration) {
	if m != nil {
		m.requests.WithLabelValues(class).Observe(took.Seconds())
	}
}

// CountingTransport counts the failed requests next (nil: Go's default)
// makes to Consul.
func (m *Metrics) CountingTransport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		switch {
		case err != nil && req.Context().Err() == nil:
			m.consulErrs.WithLabelValues("unreachable").Inc()
		case err == nil && resp.StatusCode >= 500:
			m.consulErrs.WithLabelValues("server").Inc()
		}
		return resp, err
	})
}

// NomadTransport counts Nomad's 429 answers to calls through next.
func (m *Metrics) NomadTransport(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			m.throttled.Inc()
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// KVUnreadable counts a record of kind set aside as unreadable (kind is
// the store's own name, never a key).
func (m *Metrics) KVUnreadable(kind string) {
	if m != nil {
		m.unreadable.WithLabelValues(kind).Inc()
	}
}

// AuditFailure counts an audit line that could not be written.
func (m *Metrics) AuditFailure() {
	if m != nil {
		m.auditFails.Inc()
	}
}

// GPUSeconds adds one interval's GPU time.
func (m *Metrics) GPUSeconds(by map[usage.Key]usage.Seconds) {
	if m == nil {
		return
	}
	for k, s := range by {
		tenant, queue, class := m.tenant(k.Tenant), m.queue(k.Queue), m.class(k.Class)
		m.gpuSeconds.WithLabelValues(tenant, queue, class, "allocated").Add(s.Allocated)
		m.gpuSeconds.WithLabelValues(tenant, queue, class, "busy").Add(s.Busy)
		m.gpuSeconds.WithLabelValues(tenant, queue, class, "idle").Add(s.Idle)
	}
}

// poolModel is a node pool and a GPU model.
type poolModel struct{ pool, model string }

// byPoolAndModel sums an inventory by node pool and model.
func byPoolAndModel(inventory []cluster.NodeInventory) map[poolModel]*cluster.NodeInventory {
	states := map[poolModel]*cluster.NodeInventory{}
	for _, inv := range inventory {
		k := poolModel{inv.Pool, inv.Model}
		s := states[k]
		if s == nil {
			s = &cluster.NodeInventory{Unhealthy: map[string]int{}}
			states[k] = s
		}
		s.Total += inv.Total
		s.Healthy += inv.Healthy
		s.Allocated += inv.Allocated
		s.Free += inv.Free
		for why, n := range inv.Unhealthy {
			s.Unhealthy[why] += n
		}
	}
	return states
}

// gpuStates are an inventory's GPUs by nomadgpu_gpus's state.
func gpuStates(s *cluster.NodeInventory) map[string]int {
	return map[string]int{"total": s.Total, "healthy": s.Healthy, "unhealthy": s.Total - s.Healthy, "allocated": s.Allocated, "free": s.Free}
}

// scrape reads the view, the policy and the queue at each scrape.
type scrape struct{ src Sources }

var (
	gpusDesc = prometheus.NewDesc("nomadgpu_gpus",
		"GPUs by node pool, model and state: total, healthy, unhealthy, allocated (held by running or pending allocations), free (healthy, unheld, on a schedulable node).",
		[]string{"node_pool", "model", "state"}, nil)
	unhealthyDesc = prometheus.NewDesc("nomadgpu_unhealthy_gpus",
		"Unhealthy GPUs by node pool, model and reason class: xid, ecc, lost, recovering (waiting out its hysteresis), other.",
		[]string{"node_pool", "model", "reason"}, nil)
	freePerNodeDesc = prometheus.NewDesc("nomadgpu_node_free_gpus",
		"Free GPUs per schedulable node.", nil, nil)
	fragmentedDesc = prometheus.NewDesc("nomadgpu_free_gpus_fragmented_ratio",
		"Share of free GPUs on nodes with fewer free than the most GPUs any node has (where the largest single-node request cannot go).", nil, nil)
	tenantDesc = prometheus.NewDesc("nomadgpu_tenant_gpus",
		"A tenant's GPUs: used, borrowed (of used, at the borrowing band), guaranteed, limit and over_limit (used above the limit, 0 within it), per GPU class (\"all\": every class).",
		[]string{"tenant", "gpu_class", "kind"}, nil)
	queueDesc = prometheus.NewDesc("nomadgpu_queue_depth",
		"Jobs waiting in the broker's queue.", []string{"queue"}, nil)
	viewIndexDesc = prometheus.NewDesc("nomadgpu_cluster_view_index",
		"Nomad's Raft index of the last event (or listing) the broker's cluster view applied; nomad_raft_appliedIndex minus this is how far it lags.", nil, nil)
	listingsDesc = prometheus.NewDesc("nomadgpu_cluster_view_listings_total",
		"Full listings of the cluster (at start, after the event stream broke, and every resync).", nil, nil)
	leaderDesc = prometheus.NewDesc("nomadgpu_leader",
		"1 while this broker is the leader (admits, runs the queue and reclaim).", nil, nil)
	gpuLabels = []string{"node", "gpu", "model"}
	utilDesc  = prometheus.NewDesc("nomadgpu_gpu_utilization_percent",
		"A GPU's utilisation at its last sample (the leader reads every GPU node's stats from Nomad each reclaim period).", gpuLabels, nil)
	memUsedDesc = prometheus.NewDesc("nomadgpu_gpu_memory_used_bytes",
		"A GPU's frame-buffer memory in use at its last sample.", gpuLabels, nil)
	memTotalDesc = prometheus.NewDesc("nomadgpu_gpu_memory_total_bytes",
		"A GPU's frame-buffer memory.", gpuLabels, nil)
	tempDesc = prometheus.NewDesc("nomadgpu_gpu_temperature_celsius",
		"A GPU's temperature at its last sample.", gpuLabels, nil)
	powerDesc = prometheus.NewDesc("nomadgpu_gpu_power_watts",
		"A GPU's power draw at its last sample.", gpuLabels, nil)
	priceDesc = prometheus.NewDesc("nomadgpu_gpu_price_per_hour",
		"What an allocated GPU of a class costs an hour (the policy's price_per_gpu_hour, in its currency): multiply nomadgpu_gpu_seconds_total by it for cost.",
		[]string{"gpu_class", "currency"}, nil)
	policyLoadedDesc = prometheus.NewDesc("nomadgpu_policy_loaded_timestamp",
		"When the policy in force was loaded (Unix seconds).", nil, nil)
	policyFailedDesc = prometheus.NewDesc("nomadgpu_policy_reload_failed",
		"1 when the last reload of the policy files was refused: the policy in force is older than the files.", nil, nil)
	tokenRefusedDesc = prometheus.NewDesc("nomadgpu_nomad_token_refused",
		"1 while Nomad refuses the broker's own token (deleted, expired): the leader admits nothing from the queue, and parks nothing, until it is valid again.", nil, nil)
	connsDesc = prometheus.NewDesc("nomadgpu_nomad_connections",
		"HTTP connections the broker holds open to Nomad (its users' calls, its own reads and registrations, the event stream), all from one address: keep it below Nomad's limits.http_max_conns_per_client.", nil, nil)
	backoffDesc = prometheus.NewDesc("nomadgpu_borrow_backoff_jobs",
		"Jobs held back from borrowing by their re-borrow backoff (policy borrowing { backoff, max_backoff }), by tenant.", []string{"tenant"}, nil)
	allDescs = []*prometheus.Desc{connsDesc, policyLoadedDesc, policyFailedDesc, tokenRefusedDesc, backoffDesc, priceDesc, gpusDesc, unhealthyDesc, freePerNodeDesc, fragmentedDesc, tenantDesc, queueDesc, leaderDesc, viewIndexDesc, listingsDesc,
		utilDesc, memUsedDesc, memTotalDesc, tempDesc, powerDesc}
)

const mib = 1 << 20

func (c *scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
	for _, f := range dcgmFields {
		ch <- f.desc
	}
	for _, d := range regionDescs {
		ch <- d
	}
}

func (c *scrape) Collect(ch chan<- prometheus.Metric) {
	c.gpus(ch)
	p := c.src.Policies.Current()
	nodes := c.src.Cluster.Map(p.Usage.IdleBelow)
	c.telemetry(ch, nodes)
	c.dcgm(ch, p, nodes)
	for name, class := range p.Classes {
		if class.PricePerGPUHour > 0 {
			ch <- prometheus.MustNewConstMetric(priceDesc, prometheus.GaugeValue, class.PricePerGPUHour, name, p.Currency)
		}
	}
	c.regions(ch, p)
	u := c.src.Cluster.UsageWithout(p, "", "")
	for name, t := range p.Tenants {
		tu := u.Tenants[name]
		over := policy.Quota{}
		for class, n := range t.Limit {
			over[class] = max(0, tu.Used[class]-n)
		}
		for kind, q := range map[string]policy.Quota{"used": tu.Used, "borrowed": tu.Borrowed, "guaranteed": t.Guaranteed, "limit": t.Limit, "over_limit": over} {
			ch <- prometheus.MustNewConstMetric(tenantDesc, prometheus.GaugeValue, float64(q.Total()), name, "all", kind)
			for class, n := range q {
				if class != policy.AllGPUs {
					ch <- prometheus.MustNewConstMetric(tenantDesc, prometheus.GaugeValue, float64(n), name, class, kind)
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if entries, err := c.src.Queue.List(ctx); err == nil {
		depth := map[string]int{}
		for name := range p.Queues {
			depth[name] = 0
		}
		for _, e := range entries {
			depth[e.Queue]++
		}
		for q, n := range depth {
			ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(n), q)
		}
		c.regionQueues(ch, entries)
	}
	index, listings := c.src.Cluster.Followed()
	ch <- prometheus.MustNewConstMetric(viewIndexDesc, prometheus.GaugeValue, float64(index))
	ch <- prometheus.MustNewConstMetric(listingsDesc, prometheus.CounterValue, float64(listings))
	leader := 0.0
	if c.src.Leader == nil || c.src.Leader.IsLeader() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leader)
	if c.src.PolicyState != nil {
		at, failed := c.src.PolicyState()
		ch <- prometheus.MustNewConstMetric(policyLoadedDesc, prometheus.GaugeValue, float64(at.Unix()))
		ch <- prometheus.MustNewConstMetric(policyFailedDesc, prometheus.GaugeValue, map[bool]float64{true: 1}[failed])
	}
	if c.src.InBackoff != nil {
		in := c.src.InBackoff()
		for name := range p.Tenants { // every tenant, 0 too: label values from the policy
			ch <- prometheus.MustNewConstMetric(backoffDesc, prometheus.GaugeValue, float64(in[name]), name)
		}
	}
	if c.src.TokenRefused != nil {
		ch <- prometheus.MustNewConstMetric(tokenRefusedDesc, prometheus.GaugeValue, map[bool]float64{true: 1}[c.src.TokenRefused()])
	}
	if c.src.NomadConnections != nil {
		ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(c.src.NomadConnections()))
	}
}

// telemetry reports each sampled GPU's last sample.
func (c *scrape) telemetry(ch chan<- prometheus.Metric, nodes []cluster.MapNode) {
	for _, n := range nodes {
		for _, g := range n.GPUs {
			for _, v := range []struct {
				desc  *prometheus.Desc
				value *float64
				scale float64
			}{{utilDesc, g.Utilization, 1}, {memUsedDesc, g.MemoryUsed, mib}, {memTotalDesc, g.MemoryTotal, mib}, {tempDesc, g.Temperature, 1}, {powerDesc, g.Power, 1}} {
				if v.value != nil {
					ch <- prometheus.MustNewConstMetric(v.desc, prometheus.GaugeValue, *v.value*v.scale, n.Name, g.ID, g.Model)
				}
			}
		}
	}
}

// gpus reports GPU states by pool and model, free GPUs per node and the
// fragmented share.
func (c *scrape) gpus(ch chan<- prometheus.Metric) {
	inventory := c.src.Cluster.Inventory()
	freeByNode, sizeByNode := map[string]int{}, map[string]int{}
	for _, inv := range inventory {
		sizeByNode[inv.Node] += inv.Total
		if inv.Schedulable {
			freeByNode[inv.Node] += inv.Free
		}
	}
	for k, s := range byPoolAndModel(inventory) {
		for state, n := range gpuStates(s) {
			ch <- prometheus.MustNewConstMetric(gpusDesc, prometheus.GaugeValue, float64(n), k.pool, k.model, state)
		}
		for why, n := range s.Unhealthy {
			ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, float64(n), k.pool, k.model, why)
		}
	}
	largest := 0
	for _, n := range sizeByNode {
		largest = max(largest, n)
	}
	buckets := map[float64]uint64{0: 0, 1: 0, 2: 0, 4: 0, 8: 0}
	var count uint64
	var sum float64
	free, fragmented := 0, 0
	for _, n := range freeByNode {
		count++
		sum += float64(n)
		for b := range buckets {
			if float64(n) <= b {
				buckets[b]++
			}
		}
		free += n
		if n < largest {
			fragmented += n
		}
	}
	ch <- prometheus.MustNewConstHistogram(freePerNodeDesc, count, sum, buckets)
	ratio := 0.0
	if free > 0 {
		ratio = float64(fragmented) / float64(free)
	}
	ch <- prometheus.MustNewConstMetric(fragmentedDesc, prometheus.GaugeValue, ratio)
}
