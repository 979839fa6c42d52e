package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

// Snapshot is a full listing: nodes, live jobs, active deployments (and the
// versions they would revert to), allocations (those holding GPUs at least), and the index the event stream
// resumes after.
type Snapshot struct {
	Nodes       []*api.Node
	Jobs        []*api.Job
	Deployments []*api.Deployment
	// Stable are the latest stable versions of the jobs whose active
	// deployment reverts to them on failure (auto_revert).
	Stable []*api.Job
	// Failed are the failed deployments: those that rolled their job back
	// tell a listing what the event stream told before it (SetRollbacks).
	Failed []*api.Deployment
	Allocs []*api.Allocation
	// Ended are the jobs with the broker's stamp that Nomad stopped, or
	// that finished (batch), which Jobs leaves out: a stop the event stream
	// did not tell before the listing replaced it is recorded so.
	Ended []*api.Job
	Index uint64
}

// Source is what the view is kept from: a full listing, then events after its index.
type Source interface {
	List(ctx context.Context) (Snapshot, error)
	Events(ctx context.Context, index uint64) (<-chan *Events, error)
}

// Events is one frame of Nomad's event stream (Err: the stream broke).
type Events struct {
	Index  uint64
	Events []Event
	Err    error `json:"-"`
}

// Event is one event, its payload decoded with its frame, in one pass,
// into its api type by its JSON names. (The api's own event decoder goes
// through maps and mapstructure: several times slower, and blind to JSON
// tags, so it loses device attributes, spelled Int, Bool… for fields
// IntVal, BoolVal…. Keeping each payload as raw JSON to decode after had
// the frame's bytes scanned four times, most of an event's cost.)
type Event struct {
	Topic   api.Topic
	Type    string
	Index   uint64
	Payload Payload
}

// Payload is an event's object: the one its topic names is set.
type Payload struct {
	Node       *api.Node
	Job        *api.Job
	Deployment *api.Deployment
	Allocation *eventAlloc
	Evaluation *eventEval
}

// eventEval is what the view reads of an evaluation: its job (the stream
// carries one for every evaluation; only a purge's is acted on).
type eventEval struct{ Namespace, JobID string }

// missing is the error of an event without its topic's object.
func (e *Event) missing(key string) error {
	return fmt.Errorf("decode %s event: no %s in it", e.Topic, key)
}

// eventAlloc is an allocation as its event carries it, less the job Nomad
// puts in every allocation event: the view has the job from its own events,
// and decoding it again was most of what an allocation event cost.
type eventAlloc struct {
	api.Allocation
	Job skipped
}

// skipped is a JSON value read past, not decoded.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

// errResync ends one pass of following for a full listing.
var errResync = errors.New("periodic resync")

// Follow lists everything once, then applies Nomad's events from that index
// on. When the stream breaks it lists everything again, so that a missed
// event does not leave the view wrong. It lists again on every tick of
// resync too. Nomad v1.6 sends no Job event for a purge (only its
// deregistration's evaluation, which the view reads), and none when an
// allocation is collected: a listing is what drops anything missed. A
// listing tells what the stream it replaced would have (Reset). It returns
// when ctx ends.
func (v *View) Follow(ctx context.Context, src Source, log hclog.Logger, resync <-chan time.Time) {
	backoff := time.Second
	for ctx.Err() == nil {
		listed, err := v.followOnce(ctx, src, resync)
		if ctx.Err() != nil {
			return
		}
		if listed {
			// The failures before it are over: a stream that breaks
			// days after an outage waits a second, not the outage's
			// backoff.
			backoff = time.Second
		}
		if errors.Is(err, errResync) {
			continue
		}
		v.unreached(err)
		log.Warn("cluster view: event stream broke, resyncing", "error", err, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-v.clock.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// followOnce lists everything, then follows the events until the stream
// breaks or resync ticks; listed says the listing got through.
func (v *View) followOnce(ctx context.Context, src Source, resync <-chan time.Time) (listed bool, _ error) {
	snap, err := src.List(ctx)
	if err != nil {
		return false, fmt.Errorf("list cluster: %w", err)
	}
	v.Reset(snap)
	v.reached()
	v.relisted.Add(1)
	v.index.Store(snap.Index)
	// The stream ends with this pass: a resync opens a new one.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := src.Events(ctx, snap.Index+1)
	if err != nil {
		return true, fmt.Errorf("open event stream: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-resync:
			return true, errResync
		case batch, ok := <-events:
			if !ok {
				return true, fmt.Errorf("event stream closed")
			}
			if batch.Err != nil {
				return true, batch.Err
			}
			var reverts []Revert
			if err := v.applyBatch(batch.Events, &reverts); err != nil {
				return true, err
			}
			// Told once the batch is applied: Nomad's revert of the job
			// comes in the same one.
			for _, rv := range reverts {
				if v.reverted != nil {
					v.reverted(rv)
				}
			}
			if batch.Index > v.index.Load() {
				v.index.Store(batch.Index)
			}
		}
	}
}

// apply applies one event (applyBatch).
func (v *View) apply(e *Event, reverts *[]Revert) error {
	return v.applyBatch([]Event{*e}, reverts)
}

// applyBatch applies one frame's events at once, adding to reverts the
// reverts they tell of: a decision never sees half of a frame (a failed
// deployment without the job Nomad reverted in the same change).
func (v *View) applyBatch(events []Event, reverts *[]Revert) error {
	changes := make([]func() bool, 0, len(events))
	for i := range events {
		c, err := v.change(&events[i], reverts)
		if err != nil {
			return err
		}
		if c != nil {
			changes = append(changes, c)
		}
	}
	if len(changes) == 0 {
		return nil
	}
	changed := false
	v.mu.Lock()
	for _, c := range changes {
		changed = c() || changed
	}
	v.mu.Unlock()
	if changed {
		v.notify()
	}
	return nil
}

// change decodes an event into what it changes in the view, to run under
// its lock, which reports whether decisions could see a difference (nil:
// nothing to change).
func (v *View) change(e *Event, reverts *[]Revert) (func() bool, error) {
	switch e.Topic {
	case api.TopicNode:
		n := e.Payload.Node
		if n == nil {
			return nil, e.missing("Node")
		}
		if e.Type == "NodeDeregistration" {
			return func() bool { v.forgetNode(n.ID); return true }, nil
		}
		return func() bool { v.observeNode(n, v.nodes[n.ID]); return true }, nil
	case api.TopicJob:
		j := e.Payload.Job
		if j == nil || j.ID == nil {
			return nil, e.missing("Job")
		}
		if e.Type == "JobDeregistered" || e.Type == "JobBatchDeregistered" {
			return func() bool { v.forgetPurged(nomadjob.Namespace(j), *j.ID, e.Index); return true }, nil
		}
		return func() bool { v.observeJob(j); return true }, nil
	case api.TopicDeployment:
		d := e.Payload.Deployment
		if d == nil {
			return nil, e.missing("Deployment")
		}
		if rv, ok := rolledBack(d); ok {
			rv.Region = v.region
			*reverts = append(*reverts, rv)
		}
		return func() bool { v.observeDeployment(d); return true }, nil
	case api.TopicAllocation:
		if e.Payload.Allocation == nil {
			return nil, e.missing("Allocation")
		}
		a := &e.Payload.Allocation.Allocation
		return func() bool { return v.observeAlloc(a, true) }, nil
	case api.TopicEvaluation:
		// A purge (or the garbage collector's) sends no Job event, only
		// the evaluation it creates, with the deregistration's type: the
		// job is stopped or gone either way, and holds nothing any more.
		if e.Type != "JobDeregistered" && e.Type != "JobBatchDeregistered" {
			return nil, nil
		}
		ev := e.Payload.Evaluation
		if ev == nil {
			return nil, e.missing("Evaluation")
		}
		return func() bool { v.forgetPurged(ev.Namespace, ev.JobID, e.Index); return true }, nil
	}
	return nil, nil
}

// Followed is how far the view follows Nomad: the index of the last event
// (or listing) it applied, and how many full listings it made.
func (v *View) Followed() (index, listings uint64) { return v.index.Load(), v.relisted.Load() }
