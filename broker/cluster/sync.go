package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Snapshot is a full listing: nodes, live jobs, active deployments,
// allocations (those holding GPUs at least), and the index the event stream
// resumes after.
type Snapshot struct {
	Nodes       []*api.Node
	Jobs        []*api.Job
	Deployments []*api.Deployment
	Allocs      []*api.Allocation
	Index       uint64
}

// Source is what the view is kept from: a full listing, then events after its index.
type Source interface {
	List(ctx context.Context) (Snapshot, error)
	Events(ctx context.Context, index uint64) (<-chan *api.Events, error)
}

// errResync ends one pass of following for a full listing.
var errResync = errors.New("periodic resync")

// Follow lists everything once, then applies Nomad's events from that index on;
// when the stream breaks it lists everything again (a missed event must not leave
// the view wrong), and so it does on every tick of resync: Nomad v1.6 sends no
// event when a job is purged or an allocation collected, so only a listing
// drops them. It returns when ctx ends.
func (v *View) Follow(ctx context.Context, src Source, log hclog.Logger, resync <-chan time.Time) {
	backoff := time.Second
	for ctx.Err() == nil {
		err := v.followOnce(ctx, src, resync)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errResync) {
			backoff = time.Second
			continue
		}
		log.Warn("cluster view: event stream broke, resyncing", "error", err, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (v *View) followOnce(ctx context.Context, src Source, resync <-chan time.Time) error {
	snap, err := src.List(ctx)
	if err != nil {
		return fmt.Errorf("list cluster: %w", err)
	}
	v.Reset(snap)
	v.relisted.Add(1)
	v.index.Store(snap.Index)
	events, err := src.Events(ctx, snap.Index+1)
	if err != nil {
		return fmt.Errorf("open event stream: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-resync:
			return errResync
		case batch, ok := <-events:
			if !ok {
				return fmt.Errorf("event stream closed")
			}
			if batch.Err != nil {
				return batch.Err
			}
			for i := range batch.Events {
				if err := v.apply(&batch.Events[i]); err != nil {
					return err
				}
			}
			if batch.Index > v.index.Load() {
				v.index.Store(batch.Index)
			}
		}
	}
}

func (v *View) apply(e *api.Event) error {
	switch e.Topic {
	case api.TopicNode:
		n, err := eventNode(e)
		if err != nil || n == nil {
			return fmt.Errorf("decode node event: %v", err)
		}
		if e.Type == "NodeDeregistration" {
			v.ForgetNode(n.ID)
		} else {
			v.ObserveNode(n)
		}
	case api.TopicJob:
		j, err := e.Job()
		if err != nil || j == nil {
			return fmt.Errorf("decode job event: %v", err)
		}
		if e.Type == "JobDeregistered" || e.Type == "JobBatchDeregistered" {
			v.ForgetJob(nomadjob.Namespace(j), *j.ID)
		} else {
			v.ObserveJob(j)
		}
	case api.TopicDeployment:
		d, err := e.Deployment()
		if err != nil || d == nil {
			return fmt.Errorf("decode deployment event: %v", err)
		}
		v.ObserveDeployment(d)
	case api.TopicAllocation:
		a, err := e.Allocation()
		if err != nil || a == nil {
			return fmt.Errorf("decode allocation event: %v", err)
		}
		v.ObserveAlloc(a)
	}
	return nil
}

// Followed is how far the view follows Nomad: the index of the last event
// (or listing) it applied, and how many full listings it made.
func (v *View) Followed() (index, listings uint64) { return v.index.Load(), v.relisted.Load() }

// eventNode decodes a node event as Nomad wrote it, by its JSON names. The
// api's own decoder (mapstructure) ignores JSON tags, and so loses every
// device attribute: their fields are IntVal, BoolVal…, written Int, Bool….
func eventNode(e *api.Event) (*api.Node, error) {
	raw, err := json.Marshal(e.Payload["Node"])
	if err != nil {
		return nil, err
	}
	var n *api.Node
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	return n, nil
}
