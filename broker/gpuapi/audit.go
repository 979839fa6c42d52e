package gpuapi

import (
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
	"github.com/nomad-gpu/nomad-gpu/broker/sim"
)

// auditTrail reads a page of the audit trail: ?since= (a duration back
// from now, default 24h) or ?cursor= (a page's next, from its header
// X-Nomad-Gpu-Next-Cursor), &limit= (default and most: audit.MaxPage),
// &tenant=, &job=. With ACLs it reads the events of namespaces the caller
// may read, and those of no namespace (policy reloads). It reads the trail a line at
// a time, so that no trail size makes it hold more than a page.
func (s *API) auditTrail(w http.ResponseWriter, r *http.Request) (any, error) {
	q := r.URL.Query()
	since, err := sinceParam(r, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	from := audit.Cursor{Since: s.clock.Now().Add(-since)}
	if c := q.Get("cursor"); c != "" {
		var err error
		if from, err = audit.ParseCursor(c); err != nil {
			return nil, front.Fail(front.ErrBadRequest, "%v", err)
		}
	}
	limit := audit.MaxPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > audit.MaxPage {
			return nil, front.Fail(front.ErrBadRequest, "limit=%q is not a number of events from 1 to %d", v, audit.MaxPage)
		}
		limit = n
	}
	tenant, job := q.Get("tenant"), q.Get("job")
	readable := map[string]bool{}
	events, next, more, err := s.audit.Page(from, limit, func(e audit.Event) bool {
		return (tenant == "" || e.Tenant == tenant) && (job == "" || e.Job == job) &&
			(e.Namespace == "" || s.access.MayRead(r, e.Namespace, readable))
	})
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	if events == nil {
		events = []audit.Event{}
	}
	if more {
		w.Header().Set(NextCursorHeader, next.String())
	}
	return events, nil
}

// NextCursorHeader carries, on a page of the audit trail that has more
// after it, the cursor of the next page.
const NextCursorHeader = "X-Nomad-Gpu-Next-Cursor"

// trace serves GET /v1/gpu/trace?since=168h: the GPU jobs the broker
// recorded since then as a simulator trace (JSON lines, see sim.Job), for
// `gpu-broker simulate -trace`: "what would last week have looked like
// under another policy?". Each job's GPUs, run time and idleness come from
// its usage profile, its submission from the audit trail (or its first
// sample, when the trail has no admission of it).
func (s *API) trace(_ http.ResponseWriter, r *http.Request) (any, error) {
	since, err := sinceParam(r, 7*24*time.Hour)
	if err != nil {
		return nil, err
	}
	from := s.clock.Now().Add(-since)
	profiles, err := s.stored.List(r.Context())
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	readable := map[string]bool{}
	submitted := map[[2]string]time.Time{}
	err = s.audit.Scan(from, func(e audit.Event) bool {
		k := [2]string{e.Namespace, e.Job}
		if at, ok := submitted[k]; e.What == audit.Admission && (!ok || e.Time.Before(at)) && s.access.MayRead(r, e.Namespace, readable) {
			submitted[k] = e.Time
		}
		return true
	})
	if err != nil {
		return nil, front.Fail(front.ErrUnavailable, "%v", err)
	}
	period := s.policies.Current().ReclaimSettings.Period // between two samples
	var jobs []sim.Job
	var at []time.Time
	for _, p := range profiles {
		if p.Last.Before(from) || p.Asked == 0 || !s.access.MayRead(r, p.Namespace, readable) {
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
	return traceAnswer(jobs), nil
}

// traceAnswer is a trace as GET /v1/gpu/trace answers it: JSON lines.
type traceAnswer []sim.Job

func (t traceAnswer) WriteAnswer(w http.ResponseWriter) error {
	w.Header().Set("Content-Type", "application/x-ndjson")
	return sim.WriteTrace(w, t)
}

// sinceParam reads the request's since= (a positive duration; def when
// absent).
func sinceParam(r *http.Request, def time.Duration) (time.Duration, error) {
	v := r.URL.Query().Get("since")
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, front.Fail(front.ErrBadRequest, "since=%q is not a duration such as %gh", v, def.Hours())
	}
	return d, nil
}
