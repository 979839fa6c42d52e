package server

import (
	"context"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// positionOf is an entry's 1-based place in ordered entries, 0 if absent.
func positionOf(entries []queue.Entry, id string) int {
	for i, e := range entries {
		if e.ID == id {
			return i + 1
		}
	}
	return 0
}

// estimates are the leader's start estimates for entries in admission
// order; nil on a broker that has not led a reclaim pass.
func (s *Server) estimates(ordered []queue.Entry) map[string]queue.Estimate {
	p := s.policies.Current()
	used, supply := s.usageNow(p)
	if supply == nil {
		return nil
	}
	return queue.Estimates(ordered, p, supply.Idle, used, supply.Releases, s.clock.Now())
}

// estimateOf is the estimate of entry id, of entries in admission order;
// false where there is none (the leader has not observed the cluster yet,
// or the entry is parked).
func (s *Server) estimateOf(ordered []queue.Entry, id string) (queue.Estimate, bool) {
	p := s.policies.Current()
	used, supply := s.usageNow(p)
	if supply == nil {
		return queue.Estimate{}, false
	}
	return queue.EstimateOf(ordered, id, p, supply.Idle, used, supply.Releases, s.clock.Now())
}

// place is where e, submitted now in place of entries[replaced] (-1: none),
// stands in the queue, and its estimate (false: none).
func (s *Server) place(ctx context.Context, entries []queue.Entry, e queue.Entry, replaced int) (int, queue.Estimate, bool) {
	p := s.policies.Current()
	used, supply := s.usageNow(p)
	return queue.Place(entries, e, replaced, p, used, s.decayed(ctx, p), s.clock.Now(), supply)
}

// usageNow is each tenant's GPUs now and what estimates start from (nil
// before the leader observed the cluster), from one reading of the usage.
func (s *Server) usageNow(p *policy.Policy) (map[string]float64, *queue.Supply) {
	u := s.cluster.UsageWithout(p, "", "")
	if s.forecast == nil {
		return u.UsedBy(), nil
	}
	releases, ok := s.forecast.Get()
	if !ok {
		return u.UsedBy(), nil
	}
	return u.UsedBy(), &queue.Supply{Idle: u.Idle[policy.AllGPUs], Releases: releases}
}

func estimatePtr(e queue.Estimate, ok bool) *queue.Estimate {
	if ok {
		return &e
	}
	return nil
}

func estimateIn(estimates map[string]queue.Estimate, id string) *queue.Estimate {
	e, ok := estimates[id]
	return estimatePtr(e, ok)
}

// order sorts entries in admission order under the policy and usage now.
func (s *Server) order(ctx context.Context, entries []queue.Entry) []queue.Entry {
	p := s.policies.Current()
	used, _ := s.usageNow(p)
	queue.Order(entries, p, used, s.decayed(ctx, p), s.clock.Now())
	return entries
}

// decayed is each tenant's decayed GPU-hours when fair share orders the
// queue (nil otherwise).
func (s *Server) decayed(ctx context.Context, p *policy.Policy) map[string]float64 {
	if s.fairShare == nil || !p.FairShare.Enabled {
		return nil
	}
	d, err := s.fairShare.Decayed(ctx, s.clock.Now(), p.FairShare.HalfLife)
	if err != nil {
		// Shown in the current share's order; the leader's admitter
		// orders by fair share or not at all.
		s.log.Warn("queue order: decayed GPU-hours unreadable", "error", err)
	}
	return d
}
