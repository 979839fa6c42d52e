package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/sim"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// TenantUsage is one row of GET /v1/gpu/usage.
type TenantUsage struct {
	// GPUs; a time-sliced replica counts as its share of one.
	Tenant     string  `json:"tenant"`
	Used       float64 `json:"used"`
	Borrowed   float64 `json:"borrowed"`
	Guaranteed float64 `json:"guaranteed"`
	Limit      float64 `json:"limit"`
	Queued     float64 `json:"queued"`
	// Budget is its GPU-hour budget in the current period, if it has one.
	Budget *usage.BudgetState `json:"budget,omitempty"`
}

// QueuedJob is an entry of GET /v1/gpu/queue, with its place in admission order.
type QueuedJob struct {
	Position int `json:"position"`
	// Estimate is when it is expected to start (the leader's estimate;
	// absent on another broker).
	Estimate *queue.Estimate `json:"estimate,omitempty"`
	queue.Entry
}

func (s *Server) serveGPU(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/v1/gpu/")
	who, _, err := s.resolve(r)
	if s.acls && (err != nil || token(r) == "") {
		if err == nil {
			err = errors.New("no token given")
		}
		writeError(w, http.StatusForbidden, "nomad-gpu: the broker's API needs a valid Nomad ACL token: %v", err)
		return
	}
	switch {
	case path == "usage" && r.Method == http.MethodGet && r.URL.Query().Has("from"):
		s.usageReport(w, r)
	case path == "usage" && r.Method == http.MethodGet:
		s.usage(w, r)
	case path == "nodes" && r.Method == http.MethodGet:
		s.gpuMap(w, r)
	case path == "queue" && r.Method == http.MethodGet:
		entries, err := s.ordered(r)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
			return
		}
		out := []QueuedJob{}
		readable := map[string]bool{}
		estimates := s.estimates(entries)
		for i, e := range entries {
			if s.mayRead(r, e.Namespace, readable) {
				e.Request = nil // the request body is its submitter's alone
				out = append(out, QueuedJob{Position: i + 1, Entry: e, Estimate: estimateOf(estimates, e.ID)})
			}
		}
		writeJSON(w, http.StatusOK, out)
	case strings.HasPrefix(path, "queue/"):
		s.queueEntry(w, r, strings.TrimPrefix(path, "queue/"), who)
	case s.approvalStore != nil && (path == "approvals" || strings.HasPrefix(path, "approvals/")):
		s.approvals(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "approvals"), "/"), who)
	case path == "audit" && r.Method == http.MethodGet:
		s.auditTrail(w, r)
	case s.stored != nil && path == "trace" && r.Method == http.MethodGet:
		s.trace(w, r)
	case s.stored != nil && path == "rightsizing" && r.Method == http.MethodGet:
		s.rightSizing(w, r)
	case s.decisions != nil && path == "reclaim" && r.Method == http.MethodGet:
		s.reclaimList(w, r)
	case s.decisions != nil && strings.HasPrefix(path, "reclaim/"):
		s.reclaimDecision(w, r, strings.TrimPrefix(path, "reclaim/"), who)
	default:
		writeError(w, http.StatusNotFound, "nomad-gpu: no such endpoint %s %s", r.Method, r.URL.Path)
	}
}

// UsageReport is GET /v1/gpu/usage?from=&to=&by=: GPU-hours and cost of
// the days from From up to (not including) To.
type UsageReport struct {
	From     string            `json:"from"`
	To       string            `json:"to"`
	By       string            `json:"by"`
	Currency string            `json:"currency"`
	Rows     []usage.ReportRow `json:"rows"`
}

// usageReport reports GPU-hours from the daily rollups. With ACLs a caller
// sees the tenants with a namespace it may read, and not the time of jobs
// the broker did not admit (they have no tenant).
func (s *Server) usageReport(w http.ResponseWriter, r *http.Request) {
	if s.rollups == nil {
		writeError(w, http.StatusNotFound, "nomad-gpu: this broker keeps no usage history")
		return
	}
	q := r.URL.Query()
	rep := UsageReport{From: q.Get("from"), To: q.Get("to"), By: q.Get("by")}
	from, err := time.Parse(usage.DayFormat, rep.From)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nomad-gpu: from=%q is not a day (YYYY-MM-DD)", rep.From)
		return
	}
	to := s.now().UTC().AddDate(0, 0, 1) // through today
	if rep.To != "" {
		if to, err = time.Parse(usage.DayFormat, rep.To); err != nil {
			writeError(w, http.StatusBadRequest, "nomad-gpu: to=%q is not a day (YYYY-MM-DD)", rep.To)
			return
		}
	}
	rep.To = to.Format(usage.DayFormat)
	if !to.After(from) {
		writeError(w, http.StatusBadRequest, "nomad-gpu: to (%s) must come after from (%s): the period runs from 'from' up to, not including, 'to'", rep.To, rep.From)
		return
	}
	switch rep.By {
	case "":
		rep.By = usage.ByTenant
	case usage.ByTenant, usage.ByQueue, usage.ByClass:
	default:
		writeError(w, http.StatusBadRequest, "nomad-gpu: by=%q: report by tenant, queue or class", rep.By)
		return
	}
	days, err := s.rollups.Days(r.Context(), rep.From, to.AddDate(0, 0, -1).Format(usage.DayFormat))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	p := s.policies.Current()
	if s.acls {
		readable, tenants := map[string]bool{}, map[string]bool{}
		for name, t := range p.Tenants {
			for _, ns := range t.Namespaces {
				if s.mayRead(r, ns, readable) {
					tenants[name] = true
					break
				}
			}
		}
		for i := range days {
			rows := days[i].Rows[:0:0]
			for _, row := range days[i].Rows {
				if tenants[row.Tenant] {
					rows = append(rows, row)
				}
			}
			days[i].Rows = rows
		}
	}
	rep.Currency = p.Currency
	rep.Rows = usage.Report(days, rep.By, func(class string) float64 {
		if c := p.Classes[class]; c != nil {
			return c.PricePerGPUHour
		}
		return 0
	})
	writeJSON(w, http.StatusOK, rep)
}

// auditTrail reads the audit trail: ?since= (a duration back from now,
// default 24h), &tenant=, &job=; with ACLs, the events of namespaces the
// caller may read (and those of no namespace: policy reloads).
func (s *Server) auditTrail(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, ok := sinceParam(w, r, 24*time.Hour)
	if !ok {
		return
	}
	tenant, job := q.Get("tenant"), q.Get("job")
	readable := map[string]bool{}
	events, err := s.audit.Read(s.now().Add(-since), func(e audit.Event) bool {
		return (tenant == "" || e.Tenant == tenant) && (job == "" || e.Job == job) &&
			(e.Namespace == "" || s.mayRead(r, e.Namespace, readable))
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	if events == nil {
		events = []audit.Event{}
	}
	writeJSON(w, http.StatusOK, events)
}

// trace serves GET /v1/gpu/trace?since=168h: the GPU jobs the broker
// recorded since then as a simulator trace (JSON lines, see sim.Job), for
// `gpu-broker simulate -trace`: "what would last week have looked like
// under another policy?". Each job's GPUs, run time and idleness come from
// its usage profile, its submission from the audit trail (or its first
// sample, when the trail has no admission of it).
func (s *Server) trace(w http.ResponseWriter, r *http.Request) {
	since, ok := sinceParam(w, r, 7*24*time.Hour)
	if !ok {
		return
	}
	from := s.now().Add(-since)
	profiles, err := s.stored.List(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	readable := map[string]bool{}
	submitted := map[[2]string]time.Time{}
	events, err := s.audit.Read(from, func(e audit.Event) bool {
		return e.What == audit.Admission && s.mayRead(r, e.Namespace, readable)
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	for _, e := range events {
		k := [2]string{e.Namespace, e.Job}
		if at, ok := submitted[k]; !ok || e.Time.Before(at) {
			submitted[k] = e.Time
		}
	}
	period := s.policies.Current().ReclaimSettings.Period // between two samples
	var jobs []sim.Job
	var at []time.Time
	for _, p := range profiles {
		if p.Last.Before(from) || p.Asked == 0 || !s.mayRead(r, p.Namespace, readable) {
			continue
		}
		t, ok := submitted[[2]string{p.Namespace, p.Job}]
		if !ok || t.After(p.First) {
			t = p.First
		}
		at = append(at, t)
		jobs = append(jobs, sim.Job{ID: p.Namespace + "/" + p.Job, Namespace: p.Namespace, Queue: p.Queue, GPUs: p.Asked,
			Duration: math.Max(1, math.Round((p.Last.Sub(p.First) + period).Seconds())), Idle: p.BusyAt(0.95) == 0, Outcome: "completed"})
	}
	if len(at) > 0 {
		start := slices.MinFunc(at, time.Time.Compare)
		for i := range jobs {
			jobs[i].Submit = math.Round(at[i].Sub(start).Seconds())
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Submit < jobs[j].Submit })
	w.Header().Set("Content-Type", "application/x-ndjson")
	if err := sim.WriteTrace(w, jobs); err != nil {
		s.log.Warn("trace: writing the answer failed", "error", err)
	}
}

// sinceParam reads the request's since= (a positive duration; def when
// absent); false when it answered 400.
func sinceParam(w http.ResponseWriter, r *http.Request, def time.Duration) (time.Duration, bool) {
	v := r.URL.Query().Get("since")
	if v == "" {
		return def, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		writeError(w, http.StatusBadRequest, "nomad-gpu: since=%q is not a duration such as %gh", v, def.Hours())
		return 0, false
	}
	return d, true
}

// RightSizing is one row of GET /v1/gpu/rightsizing: a job that kept under
// half of its GPUs busy.
type RightSizing struct {
	Tenant    string    `json:"tenant"`
	Namespace string    `json:"namespace"`
	Job       string    `json:"job"`
	Queue     string    `json:"queue"`
	Asked     int       `json:"asked"`
	BusyP50   int       `json:"busy_p50"`
	BusyP95   int       `json:"busy_p95"`
	Samples   int64     `json:"samples"`
	Since     time.Time `json:"since"`
	Last      time.Time `json:"last_sample"`
}

// DefaultRightSizingTop is how many jobs per tenant GET /v1/gpu/rightsizing
// lists unless ?top= says otherwise.
const DefaultRightSizingTop = 5

// rightSizing lists each tenant's worst over-asking jobs (?top=N per
// tenant, 0 all) that the caller may read.
func (s *Server) rightSizing(w http.ResponseWriter, r *http.Request) {
	top := DefaultRightSizingTop
	if v := r.URL.Query().Get("top"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "nomad-gpu: top=%q is not a count of jobs per tenant", v)
			return
		}
		top = n
	}
	all, err := s.stored.List(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	readable := map[string]bool{}
	mine := all[:0]
	for _, p := range all {
		if s.mayRead(r, p.Namespace, readable) {
			mine = append(mine, p)
		}
	}
	out := []RightSizing{}
	for _, p := range usage.Worst(mine, top) {
		out = append(out, RightSizing{Tenant: p.Tenant, Namespace: p.Namespace, Job: p.Job, Queue: p.Queue, Asked: p.Asked,
			BusyP50: p.BusyAt(0.5), BusyP95: p.BusyAt(0.95), Samples: p.Samples(), Since: p.First, Last: p.Last})
	}
	writeJSON(w, http.StatusOK, out)
}

// mayRead reports whether the caller may read namespace ns (any capability
// there lets Nomad show the namespace); always with ACLs off.
func (s *Server) mayRead(r *http.Request, ns string, cache map[string]bool) bool {
	if !s.acls {
		return true
	}
	ok, seen := cache[ns]
	if !seen {
		ok = s.get(r, "/v1/namespace/"+url.PathEscape(ns), "", &struct{}{}) == nil
		cache[ns] = ok
	}
	return ok
}

// mayCancel reports whether the caller may cancel a queued job: its
// submitter, or anyone who may write that job in its namespace.
func (s *Server) mayCancel(r *http.Request, e queue.Entry, who string) bool {
	if !s.acls || (who == e.SubmittedBy && who != "anonymous") {
		return true
	}
	var req struct{ Job json.RawMessage }
	return json.Unmarshal(e.Request, &req) == nil && s.mayWrite(r, e.Namespace, e.JobID, req.Job)
}

func (s *Server) queueEntry(w http.ResponseWriter, r *http.Request, id, who string) {
	if !queue.ValidID(id) {
		writeError(w, http.StatusBadRequest, "nomad-gpu: %q is not a queue id (a UUID, as `gpu-broker queue list` shows)", id)
		return
	}
	e, err := s.queue.Get(r.Context(), id)
	if errors.Is(err, queue.ErrNotFound) || (err == nil && !s.mayRead(r, e.Namespace, map[string]bool{})) {
		writeError(w, http.StatusNotFound, "nomad-gpu: no queued job %q (admitted, cancelled or never queued)", id)
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
		return
	}
	switch r.Method {
	case http.MethodGet:
		if s.acls && who != e.SubmittedBy {
			e.Request = nil
		}
		entries, err := s.ordered(r)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
			return
		}
		writeJSON(w, http.StatusOK, QueuedJob{Position: positionOf(entries, id), Entry: e, Estimate: estimateOf(s.estimates(entries), id)})
	case http.MethodDelete:
		if !s.mayCancel(r, e, who) {
			writeError(w, http.StatusForbidden, "nomad-gpu: only its submitter, or a token that may submit job %q in namespace %q, may cancel queued job %s",
				e.JobID, e.Namespace, id)
			return
		}
		event := audit.Event{Who: who, What: audit.QueueCancel, ID: id, Namespace: e.Namespace, Job: e.JobID, Tenant: e.Tenant,
			Queue: e.Queue, Result: "cancelled"}
		if !s.audited(w, event) {
			return
		}
		ok, err := s.queue.Remove(r.Context(), e)
		if err != nil || !ok {
			event.Result = fmt.Sprintf("not cancelled: changed or admitted meanwhile (%v)", err)
			s.audit.Write(event)
			writeError(w, http.StatusConflict, "nomad-gpu: queued job %q changed or was admitted meanwhile: %v", id, err)
			return
		}
		s.metrics.QueueWait(e.Queue, "cancelled", s.now().Sub(e.SubmittedAt))
		s.log.Info("queue: cancelled", "id", id, "job", e.JobID, "namespace", e.Namespace, "by", who)
		writeJSON(w, http.StatusOK, e)
	default:
		writeError(w, http.StatusMethodNotAllowed, "nomad-gpu: %s not allowed on %s", r.Method, r.URL.Path)
	}
}

// estimates are the leader's start estimates for entries in admission
// order; nil on a broker that has not led a reclaim pass.
func (s *Server) estimates(ordered []queue.Entry) map[string]queue.Estimate {
	if s.forecast == nil {
		return nil
	}
	releases, ok := s.forecast.Get()
	if !ok {
		return nil
	}
	p := s.policies.Current()
	u := s.cluster.UsageWithout(p, "", "")
	return queue.Estimates(ordered, p, u.Idle[policy.AllGPUs], u.UsedBy(), releases, s.now())
}

func estimateOf(estimates map[string]queue.Estimate, id string) *queue.Estimate {
	if e, ok := estimates[id]; ok {
		return &e
	}
	return nil
}

// ordered lists the queue in admission order.
func (s *Server) ordered(r *http.Request) ([]queue.Entry, error) {
	entries, err := s.queue.List(r.Context())
	if err != nil {
		return nil, err
	}
	return s.order(r.Context(), entries), nil
}

// order sorts entries in admission order under the policy and usage now.
func (s *Server) order(ctx context.Context, entries []queue.Entry) []queue.Entry {
	p := s.policies.Current()
	u := s.cluster.UsageWithout(p, "", "")
	used := u.UsedBy()
	var decayed map[string]float64
	if s.fairShare != nil && p.FairShare.Enabled {
		d, err := s.fairShare.Decayed(ctx, s.now(), p.FairShare.HalfLife)
		if err != nil {
			// Shown in the current share's order; the leader's admitter
			// orders by fair share or not at all.
			s.log.Warn("queue order: decayed GPU-hours unreadable", "error", err)
		}
		decayed = d
	}
	queue.Order(entries, p, used, decayed, s.now())
	return entries
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	p := s.policies.Current()
	u := s.cluster.UsageWithout(p, "", "")
	queued := map[string]float64{}
	if entries, err := s.queue.List(r.Context()); err == nil {
		for _, e := range entries {
			queued[e.Tenant] += e.Demand
		}
	}
	var budgets map[string]usage.BudgetState
	if s.rollups != nil {
		now := s.now()
		days, err := s.rollups.Days(r.Context(), usage.EarliestPeriodStart(now).Format(usage.DayFormat), now.UTC().Format(usage.DayFormat))
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "nomad-gpu: %v", err)
			return
		}
		budgets = usage.Budgets(p, days, now)
	}
	out := make([]TenantUsage, 0, len(p.Tenants))
	for name, t := range p.Tenants {
		tu := u.Tenants[name]
		row := TenantUsage{Tenant: name, Used: tu.Used[policy.AllGPUs], Borrowed: tu.Borrowed[policy.AllGPUs],
			Guaranteed: t.Guaranteed.Total(), Limit: t.Limit.Total(), Queued: queued[name]}
		if b, ok := budgets[name]; ok {
			row.Budget = &b
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	writeJSON(w, http.StatusOK, out)
}
