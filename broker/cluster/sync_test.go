package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// listings hands out one snapshot per List call (the last one repeats) and an
// event stream that never says anything, as when a job is purged.
type listings struct {
	mu    sync.Mutex
	snaps []Snapshot
	lists int
}

func (l *listings) List(context.Context) (Snapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.snaps[min(l.lists, len(l.snaps)-1)]
	l.lists++
	return s, nil
}

func (l *listings) Events(ctx context.Context, _ uint64) (<-chan *Events, error) {
	return make(chan *Events), nil
}

func TestResyncDropsAPurgedJob(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	node := testbuild.Node("n", testbuild.H100, 8, 0)
	src := &listings{snaps: []Snapshot{
		{Nodes: []*api.Node{node}, Jobs: []*api.Job{testbuild.Job("vision", "a").Group("g", 1, 4, "gpu").Build()}},
		{Nodes: []*api.Node{node}}, // purged: no event ever said so
	}}
	v := NewView(nil)
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Follow(ctx, src, hclog.NewNullLogger(), tick)
	waitUsage := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for v.Usage(p).Tenants["vision"].Used.Total() != want {
			if time.Now().After(deadline) {
				t.Fatalf("vision uses %g GPUs, want %g", v.Usage(p).Tenants["vision"].Used.Total(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUsage(4)
	tick <- time.Now()
	waitUsage(0)
}

// A purge is told by its evaluation alone: the job holds nothing from then
// on. One with the broker's stamp is a stop for the leader to record at
// the purge's index (P1: its stored JSON registered again straight in
// Nomad verified). Other evaluations change nothing.
func TestAPurgesEvaluationDropsTheJob(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	v := NewView(func(j *api.Job) bool { return j.ID != nil && *j.ID == "a" })
	stamped := testbuild.Job("vision", "a").Group("g", 1, 4, "gpu").Build()
	stamped.Meta[nomadjob.MetaAdmission], stamped.Meta[nomadjob.MetaTenant] = "v5:sig", "vision"
	v.Reset(Snapshot{Nodes: []*api.Node{testbuild.Node("n", testbuild.H100, 8, 0)},
		Jobs: []*api.Job{stamped, testbuild.Job("vision", "b").Group("g", 1, 2, "gpu").Build()}})
	eval := func(typ, id string) *Event {
		return decodedEvent(t, api.TopicEvaluation, typ, 42, "Evaluation", api.Evaluation{ID: "e", Namespace: "vision", JobID: id, TriggeredBy: "job-deregister"})
	}
	for _, typ := range []string{"EvaluationUpdated", "PlanResult"} {
		if err := v.apply(eval(typ, "a"), new([]Revert)); err != nil || v.Usage(p).Tenants["vision"].Used.Total() != 6 {
			t.Errorf("after a %s event: %v, vision uses %g", typ, err, v.Usage(p).Tenants["vision"].Used.Total())
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := v.apply(eval("JobDeregistered", id), new([]Revert)); err != nil {
			t.Fatal(err)
		}
	}
	if used := v.Usage(p).Tenants["vision"].Used.Total(); used != 0 {
		t.Errorf("after the purges' evaluations, vision uses %g", used)
	}
	if got := v.StoppedAdmitted(); len(got) != 1 || got[[2]string{"vision", "a"}] != 42 {
		t.Errorf("stops to record after the purges: %v, want the stamped job's at the purge's index", got)
	}
}

// A listing that replaces the event stream keeps the stops the stream told
// that the leader has not recorded (a purged job is in no listing), for an
// hour. It reads those of the jobs it lists as ended with a stamp: the
// stopped one, and the batch job that finished. A job with the broker's
// stamp that it lists no more was purged before it, its event not told.
func TestAListingKeepsTheStopsNotRecorded(t *testing.T) {
	now := time.Now()
	v := NewView(func(*api.Job) bool { return true })
	v.SetClock(clock.Func(func() time.Time { return now }))
	stamped := func(b *testbuild.JobBuilder) *api.Job {
		j := b.Build()
		j.Meta[nomadjob.MetaAdmission], j.Meta[nomadjob.MetaTenant] = "v5:sig", "vision"
		return j
	}
	v.Reset(Snapshot{Jobs: []*api.Job{stamped(testbuild.Job("vision", "purged").Group("g", 1, 1, "gpu").ModifyIndex(3)),
		stamped(testbuild.Job("vision", "vanished").Group("g", 1, 1, "gpu").ModifyIndex(4)),
		testbuild.Job("vision", "unstamped-vanished").Group("g", 1, 1, "gpu").ModifyIndex(5).Build()}})
	v.forgetPurged("vision", "purged", 40)
	v.Reset(Snapshot{Index: 50, Ended: []*api.Job{
		stamped(testbuild.Job("vision", "stopped").Group("g", 1, 1, "gpu").ModifyIndex(41).Stopped()),
		stamped(testbuild.Job("vision", "done").Group("g", 1, 1, "gpu").Type(api.JobTypeBatch).ModifyIndex(42).Dead()),
		stamped(testbuild.Job("vision", "failed").Group("g", 1, 1, "gpu").ModifyIndex(43).Dead()),
		testbuild.Job("vision", "unstamped").Group("g", 1, 1, "gpu").ModifyIndex(44).Stopped().Build(),
	}})
	want := map[[2]string]uint64{{"vision", "purged"}: 40, {"vision", "stopped"}: 41, {"vision", "done"}: 42, {"vision", "vanished"}: 50}
	if got := v.StoppedAdmitted(); !maps.Equal(got, want) {
		t.Errorf("stops to record after the listing: %v, want %v", got, want)
	}
	now = now.Add(unrecordedStopKept + time.Second)
	v.Reset(Snapshot{})
	if got := v.StoppedAdmitted(); len(got) != 0 {
		t.Errorf("an hour on, with nothing of them listed: %v, want none (a follower records none)", got)
	}
}

// A listing that replaced the stream tells the reverts whose failed
// deployment is newer than the last event applied: the stream would have
// told them. Older ones, and a first listing's, were told or are history.
func TestAListingTellsTheRevertsTheStreamDidNot(t *testing.T) {
	v := NewView(nil)
	var told []string
	v.SetReverts(func(rv Revert) { told = append(told, rv.JobID) })
	failed := func(job string, index uint64) *api.Deployment {
		return &api.Deployment{ID: "d-" + job, Namespace: "vision", JobID: job, Status: api.DeploymentStatusFailed, ModifyIndex: index,
			StatusDescription: "Failed due to progress deadline - rolling back to job version 0"}
	}
	v.Reset(Snapshot{Failed: []*api.Deployment{failed("old", 10)}, Index: 20})
	if len(told) != 0 {
		t.Fatalf("a first listing told %v", told)
	}
	v.index.Store(20)
	v.Reset(Snapshot{Failed: []*api.Deployment{failed("old", 10), failed("web", 25)}, Index: 30})
	if !slices.Equal(told, []string{"web"}) {
		t.Errorf("told %v, want web's revert alone", told)
	}
}

// A node event keeps its device groups' attributes (a shared group's
// replicas), which the api's own event decoder (mapstructure) drops.
func TestNodeEventsKeepDeviceAttributes(t *testing.T) {
	p := testbuild.Policy(t, visionPolicy)
	node := testbuild.SharedGPUs(testbuild.Node("n", testbuild.H100, 6, 0), testbuild.H100, 2, 4)
	v := NewView(nil)
	if err := v.apply(decodedEvent(t, api.TopicNode, "NodeRegistration", 1, "Node", node), new([]Revert)); err != nil {
		t.Fatal(err)
	}
	if u := v.Usage(p); u.Replicas[testbuild.H100+" (shared)"] != 4 || u.MaxAlloc["h100"] != 8 {
		t.Errorf("from the event: replicas %v, max per node %v; want 4 replicas, 8 GPUs", u.Replicas, u.MaxAlloc)
	}
}

// The view keeps the live jobs that would use GPUs they do not ask for; a
// stopped or forgotten one it drops.
func TestTheViewKeepsJobsUsingGPUsTheyDoNotAskFor(t *testing.T) {
	v := NewView(nil)
	sneaky := testbuild.Job("vision", "sneaky").Build()
	sneaky.TaskGroups = []*api.TaskGroup{{Name: ptr("g"), Tasks: []*api.Task{{Name: "t", Env: map[string]string{"CUDA_VISIBLE_DEVICES": "0"}}}}}
	v.ObserveJob(sneaky)
	v.ObserveJob(testbuild.Job("vision", "plain").Build())
	if got := v.UndeclaredJobs(); len(got) != 1 || got[[2]string{"vision", "sneaky"}] == "" {
		t.Fatalf("undeclared: %v", got)
	}
	stopped := *sneaky
	stopped.Stop = ptr(true)
	v.ObserveJob(&stopped)
	if got := v.UndeclaredJobs(); len(got) != 0 {
		t.Errorf("a stopped job is still kept: %v", got)
	}
}

// flaky is a region that cannot be listed for its first fails calls.
type flaky struct {
	listings
	fails int
}

func (f *flaky) List(ctx context.Context) (Snapshot, error) {
	f.mu.Lock()
	failing := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if failing {
		return Snapshot{}, errors.New("no path to region")
	}
	return f.listings.List(ctx)
}

// A region the view cannot list is unreachable from the first failure, with
// the error, until a listing gets through.
func TestAViewSaysSinceWhenItsRegionIsUnreachable(t *testing.T) {
	at := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	src := &flaky{listings: listings{snaps: []Snapshot{{Nodes: []*api.Node{testbuild.Node("n", testbuild.H100, 8, 0)}}}}, fails: 1}
	v := NewView(nil)
	v.SetClock(clock.Func(func() time.Time { return at }))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Follow(ctx, src, hclog.NewNullLogger(), make(chan time.Time))
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	wait("unreachable after the listing failed", func() bool {
		since, why := v.Unreachable()
		return since.Equal(at) && strings.Contains(why, "no path to region")
	})
	wait("followed again once a listing got through (after a second's backoff)", func() bool {
		since, _ := v.Unreachable()
		return since.IsZero() && v.Synced()
	})
}

// breaking lists (after its failures) and then breaks the stream at once.
type breaking struct{ flaky }

func (*breaking) Events(context.Context, uint64) (<-chan *Events, error) {
	ch := make(chan *Events)
	close(ch)
	return ch, nil
}

// waits is a clock that records how long each wait is, ends the first n at
// once and never ends the others.
type waits struct {
	mu  sync.Mutex
	n   int
	got []time.Duration
}

func (w *waits) Now() time.Time { return time.Time{} }

func (w *waits) After(d time.Duration) <-chan time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, d)
	if len(w.got) > w.n {
		return nil
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

// The backoff between attempts grows while listings fail, and starts again
// from a second once one gets through: a stream that breaks after a good
// listing is not kept waiting by the failures before it.
func TestTheBackoffStartsAgainOnceAListingGetsThrough(t *testing.T) {
	src := &breaking{flaky{listings: listings{snaps: []Snapshot{{Nodes: []*api.Node{testbuild.Node("n", testbuild.H100, 8, 0)}}}}, fails: 3}}
	v := NewView(nil)
	w := &waits{n: 5}
	v.SetClock(w)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Follow(ctx, src, hclog.NewNullLogger(), make(chan time.Time))
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, time.Second, time.Second, time.Second}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		w.mu.Lock()
		got := slices.Clone(w.got)
		w.mu.Unlock()
		if len(got) >= len(want) {
			if !slices.Equal(got, want) {
				t.Fatalf("waits between attempts %v, want %v", got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waits between attempts %v, want %v", got, want)
		}
	}
}

// decodedEvent is one event as the view gets it from Nomad's stream: its
// payload v (under key), sent in a frame of its own as JSON and read back.
func decodedEvent(t testing.TB, topic api.Topic, typ string, index uint64, key string, v any) *Event {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"Index": index, "Events": []map[string]any{
		{"Topic": topic, "Type": typ, "Index": index, "Payload": map[string]any{key: v}}}})
	if err != nil {
		t.Fatal(err)
	}
	var frame Events
	if err := json.Unmarshal(raw, &frame); err != nil || len(frame.Events) != 1 {
		t.Fatalf("the frame read back: %v, %d events", err, len(frame.Events))
	}
	return &frame.Events[0]
}
