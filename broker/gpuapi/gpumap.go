package gpuapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/front"
)

// GPUMap is GET /v1/gpu/nodes: every node with GPUs, and what each GPU is
// doing. Index is the Nomad index the broker's view had applied.
type GPUMap struct {
	Index uint64 `json:"index"`
	// IdleBelow is the utilisation (percent) under which a held GPU is idle.
	IdleBelow float64           `json:"idle_below"`
	Nodes     []cluster.MapNode `json:"nodes"`
}

// Blocking queries on the map and the queue wait at most this long (Nomad's
// default is five minutes; the map's telemetry and the queue's estimates
// change without a new index, so they are read again sooner).
const (
	maxMapWait = 30 * time.Second
	mapPoll    = 200 * time.Millisecond
)

// gpuMap serves the GPU map. As a Nomad blocking query: with ?index=N it
// answers once the view has applied an index above N, or after ?wait=
// (default and at most 30s). With ACLs the caller needs node read (asked
// of Nomad for one node), and sees who holds a GPU only in namespaces it may
// read.
func (s *API) gpuMap(w http.ResponseWriter, r *http.Request) (any, error) {
	if err := blockingQuery(r, func() uint64 { index, _ := s.cluster.Followed(); return index }); err != nil {
		return nil, err
	}
	p := s.policies.Current()
	index, _ := s.cluster.Followed()
	m := GPUMap{Index: index, IdleBelow: p.Usage.IdleBelow, Nodes: s.cluster.Map(p.Usage.IdleBelow)}
	if s.acls && len(m.Nodes) > 0 {
		if err := s.callers.As(r).Get("/v1/node/"+url.PathEscape(m.Nodes[0].ID), "", nil); err != nil {
			return nil, front.Fail(front.ErrForbidden, "the GPU map needs a token that may read nodes: %v", err)
		}
		readable := map[string]bool{}
		for _, n := range m.Nodes {
			for i, g := range n.GPUs {
				if g.Namespace != "" && !s.access.MayRead(r, g.Namespace, readable) {
					h := &n.GPUs[i] // its state stays; who holds it does not show
					h.Namespace, h.Job, h.Alloc, h.Tenant, h.Queue, h.Borrowed = "", "", "", "", "", false
				}
			}
		}
	}
	w.Header().Set("X-Nomad-Index", fmt.Sprint(index))
	return m, nil
}

// blockingQuery is a Nomad blocking query's wait: with ?index=N it returns
// once current is above N, or after ?wait= (default and at most
// maxMapWait), or when the caller goes; an error names a bad parameter.
func blockingQuery(r *http.Request, current func() uint64) error {
	q := r.URL.Query()
	if !q.Has("index") {
		return nil
	}
	after, err := strconv.ParseUint(q.Get("index"), 10, 64)
	if err != nil {
		return front.Fail(front.ErrBadRequest, "index=%q is not a Nomad index", q.Get("index"))
	}
	wait := maxMapWait
	if q.Has("wait") {
		if wait, err = time.ParseDuration(q.Get("wait")); err != nil || wait <= 0 {
			return front.Fail(front.ErrBadRequest, "wait=%q is not a duration (as 10s or 1m)", q.Get("wait"))
		}
		wait = min(wait, maxMapWait)
	}
	if after == 0 { // as Nomad: index 0 does not block
		return nil
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(mapPoll)
	defer tick.Stop()
	for {
		if current() > after {
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-deadline.C:
			return nil
		case <-tick.C:
		}
	}
}
