package consulkv_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/consulkv"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
	"github.com/nomad-gpu/nomad-gpu/broker/usage"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// TestStores runs every store against one real Consul agent, each under a
// prefix of its own, in parallel.
func TestStores(t *testing.T) {
	agent := testcluster.StartConsul(t)
	client, err := consul.NewClient(&consul.Config{Address: agent.Addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("queue: entries keep their version, and a stale one is neither removed nor parked", func(t *testing.T) {
		t.Parallel()
		q := consulkv.NewQueue(client.KV(), "queue-test/", nil)
		e := queue.Entry{ID: queue.NewID(), JobID: "train", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 2, Request: json.RawMessage(`{}`)}
		if err := q.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
		got, err := q.Get(ctx, e.ID)
		if err != nil || got.JobID != "train" || got.ModifyIndex == 0 {
			t.Fatalf("get: %+v %v", got, err)
		}
		if ok, err := q.Park(ctx, got, "no such tenant", time.Now()); !ok || err != nil {
			t.Fatalf("park: %v %v", ok, err)
		}
		if ok, err := q.Remove(ctx, got); ok || err != nil {
			t.Errorf("a stale entry was removed: %v %v", ok, err)
		}
		all, err := q.List(ctx)
		if err != nil || len(all) != 1 || all[0].Parked != "no such tenant" {
			t.Fatalf("list: %+v %v", all, err)
		}
		// The leader claims an entry before registering it: not one that
		// changed since it was read, and the claimed one at its new version.
		if _, ok, err := q.Claim(ctx, got, time.Now()); ok || err != nil {
			t.Errorf("a stale entry was claimed: %v %v", ok, err)
		}
		claimed, ok, err := q.Claim(ctx, all[0], time.Now())
		if !ok || err != nil || claimed.Admitting.IsZero() || claimed.ModifyIndex == all[0].ModifyIndex {
			t.Fatalf("claim: %+v %v %v", claimed, ok, err)
		}
		if ok, err := q.Remove(ctx, all[0]); ok || err != nil {
			t.Errorf("an entry claimed since it was read was removed: %v %v", ok, err)
		}
		if ok, err := q.Remove(ctx, claimed); !ok || err != nil {
			t.Errorf("remove: %v %v", ok, err)
		}
		for _, id := range []string{"../reclaim/x", queue.NewID()} {
			if _, err := q.Get(ctx, id); !errors.Is(err, queue.ErrNotFound) {
				t.Errorf("get %q: %v", id, err)
			}
		}
		// A request at the most a policy allows fits one Consul value (its
		// default limit, 512 KiB, the entry's fields included); one Consul
		// refuses is ErrTooLarge.
		request := func(size int) []byte {
			r := []byte(`{"Job":{"Meta":{"pad":""}}}`)
			return append(r[:len(r)-4], append(bytes.Repeat([]byte("x"), size-len(r)), r[len(r)-4:]...)...)
		}
		big := queue.Entry{ID: queue.NewID(), JobID: strings.Repeat("j", 1000), Namespace: "vision", Tenant: "vision", Queue: "training",
			Reason: strings.Repeat("r", 1000), SubmittedBy: strings.Repeat("s", 1000), Request: request(policy.MaxQueuedRequestBytes)}
		if err := q.Put(ctx, big); err != nil || len(big.Request) != policy.MaxQueuedRequestBytes {
			t.Errorf("a request of max_queued_request_bytes' most (%d bytes): %v", len(big.Request), err)
		}
		// Kept compressed, a request is too large for Consul once it
		// compresses to more than its value limit: random bytes do not.
		noise := make([]byte, 600<<10)
		rand.Read(noise)
		big.ID, big.Request = queue.NewID(), []byte(`{"Job":{"Meta":{"pad":"`+base64.StdEncoding.EncodeToString(noise)+`"}}}`)
		if err := q.Put(ctx, big); !errors.Is(err, queue.ErrTooLarge) {
			t.Errorf("a request of 800 KiB of noise: %v, want ErrTooLarge", err)
		}
	})

	t.Run("queue: while followed, List reads a copy: the writer's writes at once, another broker's within a blocking query", func(t *testing.T) {
		t.Parallel()
		const prefix = "queue-copy-test/"
		var told atomic.Int32
		aside := consulkv.NewAside(client, prefix, func(consulkv.Unreadable) { told.Add(1) })
		writer, other := consulkv.NewQueue(client.KV(), prefix, aside), consulkv.NewQueue(client.KV(), prefix, aside)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go writer.Follow(fctx)
		go other.Follow(fctx)
		testcluster.WaitFor(t, 10*time.Second, "both following", func() error {
			if writer.Index() == 0 || other.Index() == 0 {
				return fmt.Errorf("index %d, %d", writer.Index(), other.Index())
			}
			return nil
		})
		ids := func(q *consulkv.Queue) string {
			all, err := q.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range all {
				out = append(out, e.JobID+map[bool]string{true: "(parked)"}[e.Parked != ""]+map[bool]string{true: "(claimed)"}[!e.Admitting.IsZero()])
			}
			sort.Strings(out)
			return strings.Join(out, " ")
		}
		a := queue.Entry{ID: "00000000-0000-4000-8000-00000000000a", JobID: "a", Namespace: "vision", Request: json.RawMessage(`{}`)}
		b := queue.Entry{ID: "00000000-0000-4000-8000-00000000000b", JobID: "b", Namespace: "vision", Request: json.RawMessage(`{}`)}
		for _, e := range []queue.Entry{b, a} {
			if err := writer.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if got := ids(writer); got != "a b" {
			t.Errorf("the writer's list at once: %q", got)
		}
		eventually := func(q *consulkv.Queue, want string) {
			t.Helper()
			testcluster.WaitFor(t, 10*time.Second, "the copy: "+want, func() error {
				if got := ids(q); got != want {
					return fmt.Errorf("%q", got)
				}
				return nil
			})
		}
		eventually(other, "a b")
		// Changes from the other broker's copy: checked against their version.
		read, _ := other.List(ctx)
		sort.Slice(read, func(i, j int) bool { return read[i].JobID < read[j].JobID })
		claimed, ok, err := other.Claim(ctx, read[0], time.Now())
		if !ok || err != nil {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if ok, err := other.Park(ctx, read[1], "no such tenant", time.Now()); !ok || err != nil {
			t.Fatalf("park: %v %v", ok, err)
		}
		if got := ids(other); got != "a(claimed) b(parked)" {
			t.Errorf("the other's list at once: %q", got)
		}
		eventually(writer, "a(claimed) b(parked)")
		if ok, _ := writer.Remove(ctx, read[0]); ok {
			t.Error("removed from a version older than the claim")
		}
		if ok, err := other.Remove(ctx, claimed); !ok || err != nil {
			t.Fatalf("remove: %v %v", ok, err)
		}
		if got := ids(other); got != "b(parked)" {
			t.Errorf("the remover's list at once: %q", got)
		}
		// A hand edit that cannot be read is set aside and stops nothing.
		if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue/" + queue.NewID(), Value: []byte("{")}, nil); err != nil {
			t.Fatal(err)
		}
		c := queue.Entry{ID: "00000000-0000-4000-8000-00000000000c", JobID: "c", Namespace: "vision", Request: json.RawMessage(`{}`)}
		if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue/" + c.ID, Value: []byte(`{"id":"` + c.ID + `","job_id":"c","namespace":"vision","request":{}}`)}, nil); err != nil {
			t.Fatal(err)
		}
		eventually(writer, "b(parked) c")
		eventually(other, "b(parked) c")
		if told.Load() == 0 {
			t.Error("the unreadable entry was not set aside")
		}
		// Not followed: read from Consul.
		stop()
		testcluster.WaitFor(t, 10*time.Second, "following to stop", func() error {
			if writer.Index() != 0 {
				return fmt.Errorf("index %d", writer.Index())
			}
			return nil
		})
		client.KV().Delete(prefix+"queue/"+c.ID, nil)
		if got := ids(writer); got != "b(parked)" {
			t.Errorf("unfollowed, read from Consul: %q", got)
		}
	})

	t.Run("preemption counts: once per decision, read from the copy, pruned after a quiet time", func(t *testing.T) {
		t.Parallel()
		b := consulkv.NewBackoffs(client.KV(), "backoff-test/", nil)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go b.Follow(fctx)
		at := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
		for i, c := range []struct {
			decision string
			want     int
		}{{"d1", 1}, {"d1", 1}, {"d2", 2}} { // d1 carried out twice: counted once
			if n, err := b.Preempted(ctx, "team/a", "train", c.decision, at.Add(time.Duration(i)*time.Minute)); err != nil || n != c.want {
				t.Fatalf("preemption %d (%s): count %d, %v; want %d", i, c.decision, n, err, c.want)
			}
		}
		if n, last := b.Preemptions("team/a", "train"); n != 2 || !last.Equal(at.Add(2*time.Minute)) {
			t.Errorf("the copy: %d, last %s", n, last)
		}
		if n, _ := b.Preemptions("team", "a/train"); n != 0 {
			t.Errorf("another job's count: %d", n)
		}
		b.Preempted(ctx, "vision", "other", "d3", at.Add(time.Hour))
		b.Preempted(ctx, "vision", "queued", "d4", at)
		// Quiet for 90 minutes after the last: the first is forgotten, the
		// other not yet, the one still queued or running not at all.
		live := func(ns, job string) bool { return ns == "vision" && job == "queued" }
		deleted, err := b.Prune(ctx, at.Add(2*time.Minute+90*time.Minute), func(int) time.Duration { return 90 * time.Minute }, live)
		if err != nil || deleted != 1 {
			t.Fatalf("pruned %d, %v", deleted, err)
		}
		if n, _ := b.Preemptions("team/a", "train"); n != 0 {
			t.Errorf("pruned, still counted %d", n)
		}
		if n, _ := b.Preemptions("vision", "other"); n != 1 {
			t.Errorf("not quiet long enough, yet forgotten: %d", n)
		}
		if n, _ := b.Preemptions("vision", "queued"); n != 1 {
			t.Errorf("still live, yet forgotten: %d", n)
		}
	})

	t.Run("reclaim decisions: created once, updated only from the version read", func(t *testing.T) {
		t.Parallel()
		d := consulkv.NewDecisions(client.KV(), "decisions-test/", nil)
		r := reclaim.Record{ID: queue.NewID(), Rule: "idle", State: reclaim.Proposed}
		if ok, err := d.Create(ctx, r); !ok || err != nil {
			t.Fatalf("create: %v %v", ok, err)
		}
		if ok, _ := d.Create(ctx, r); ok {
			t.Error("created twice")
		}
		read, err := d.Get(ctx, r.ID)
		if err != nil || read.ModifyIndex == 0 {
			t.Fatalf("get: %+v %v", read, err)
		}
		read.State = reclaim.Executed
		if ok, err := d.Update(ctx, read); !ok || err != nil {
			t.Fatalf("update: %v %v", ok, err)
		}
		if ok, _ := d.Update(ctx, read); ok {
			t.Error("updated from a stale version")
		}
		if ok, _ := d.Delete(ctx, read); ok {
			t.Error("deleted from a stale version")
		}
		all, err := d.List(ctx)
		if err != nil || len(all) != 1 || all[0].State != reclaim.Executed {
			t.Fatalf("list: %+v %v", all, err)
		}
		if ok, err := d.Delete(ctx, all[0]); !ok || err != nil {
			t.Errorf("delete: %v %v", ok, err)
		}
		if _, err := d.Get(ctx, r.ID); !errors.Is(err, reclaim.ErrNotFound) {
			t.Errorf("get after delete: %v", err)
		}
	})

	t.Run("approvals: the writer sees its write at once, a follower within a blocking query", func(t *testing.T) {
		t.Parallel()
		writer, follower := consulkv.NewApprovals(client.KV(), "approvals-test/", nil), consulkv.NewApprovals(client.KV(), "approvals-test/", nil)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go follower.Follow(fctx)
		now := time.Now()
		late := approval.Approval{ID: queue.NewID(), Namespace: "vision", Job: "b", Reason: "r", ExtraGPUs: 1, For: "1h", State: approval.Pending, RequestedAt: now}
		early := late
		early.ID, early.Job, early.RequestedAt = queue.NewID(), "a", now.Add(-time.Hour)
		for _, a := range []approval.Approval{late, early} {
			if ok, err := writer.Create(ctx, a); !ok || err != nil {
				t.Fatalf("create: %v %v", ok, err)
			}
		}
		if len(writer.Current()) != 2 {
			t.Errorf("the writer's snapshot: %+v", writer.Current())
		}
		testcluster.WaitFor(t, 10*time.Second, "the follower's snapshot", func() error {
			if n := len(follower.Current()); n != 2 {
				return fmt.Errorf("%d approvals", n)
			}
			return nil
		})
		all, err := writer.List(ctx)
		if err != nil || len(all) != 2 || all[0].Job != "a" {
			t.Fatalf("list, oldest request first: %+v %v", all, err)
		}
		got, err := writer.Get(ctx, late.ID)
		if err != nil {
			t.Fatal(err)
		}
		got.Grant("ops", now)
		if ok, err := writer.Update(ctx, got); !ok || err != nil {
			t.Fatalf("update: %v %v", ok, err)
		}
		if ok, _ := writer.Update(ctx, got); ok {
			t.Error("updated from a stale version")
		}
	})

	t.Run("scale grants: namespaces, job ids with slashes and regions stay apart", func(t *testing.T) {
		t.Parallel()
		s := consulkv.NewScales(client.KV(), "scales-test/", "east", nil)
		a := nomadjob.ScaleGrant{Stamp: "a", Admitted: map[string]int{"g": 2}}
		b := nomadjob.ScaleGrant{Stamp: "b", Admitted: map[string]int{"g": 3}}
		w := nomadjob.ScaleGrant{Stamp: "w", Admitted: map[string]int{"g": 1}}
		ref := func(region, ns, job string) nomadjob.Ref { return nomadjob.Ref{Region: region, Namespace: ns, ID: job} }
		for r, g := range map[nomadjob.Ref]nomadjob.ScaleGrant{ref("", "team/a", "train"): a, ref("east", "team", "a/train"): b,
			ref("west", "team/a", "train"): w} {
			if err := s.Put(ctx, r, g); err != nil {
				t.Fatal(err)
			}
		}
		// One written before grants were keyed by region is the home region's.
		if _, err := client.KV().Put(&consul.KVPair{Key: "scales-test/scaled/team/legacy", Value: []byte(`{"stamp":"l"}`)}, nil); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			ref   nomadjob.Ref
			stamp string
		}{{ref("east", "team/a", "train"), "a"}, {ref("global", "team", "a/train"), "b"}, {ref("west", "team/a", "train"), "w"},
			{ref("", "team", "legacy"), "l"}, {ref("west", "team", "legacy"), ""}, {ref("", "team", "none"), ""}} {
			g, ok, err := s.Get(ctx, c.ref)
			if err != nil || ok != (c.stamp != "") || g.Stamp != c.stamp {
				t.Errorf("%+v: %+v %v %v, want stamp %q", c.ref, g, ok, err, c.stamp)
			}
		}
		// Prune deletes the grants of the jobs Nomad no longer has, and a key
		// no grant could be under; one it cannot look up stays.
		if _, err := client.KV().Put(&consul.KVPair{Key: "scales-test/scaled/stray", Value: []byte("{}")}, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, ref("", "team", "unknown"), b); err != nil {
			t.Fatal(err)
		}
		var asked []nomadjob.Ref
		gone := func(_ context.Context, job nomadjob.Ref) (bool, error) {
			asked = append(asked, job)
			if job.ID == "unknown" {
				return false, errors.New("nomad unreachable")
			}
			return job.Region == "west" || job.ID == "legacy", nil
		}
		if n, err := s.Prune(ctx, gone); n != 3 || err == nil {
			t.Errorf("prune: %d deleted (want 3: west's grant, the legacy one and the stray key), %v (want the lookup's error)", n, err)
		}
		if !slices.Contains(asked, ref("", "team", "legacy")) || !slices.Contains(asked, ref("east", "team", "a/train")) {
			t.Errorf("prune asked of %+v: want the legacy grant's job in no region, the others in theirs", asked)
		}
		for _, c := range []struct {
			ref  nomadjob.Ref
			kept bool
		}{{ref("west", "team/a", "train"), false}, {ref("east", "team/a", "train"), true}, {ref("east", "team", "a/train"), true},
			{ref("east", "team", "unknown"), true}, {ref("east", "team", "legacy"), false}} {
			if _, ok, err := s.Get(ctx, c.ref); ok != c.kept || err != nil {
				t.Errorf("%+v after the prune: kept %t, want %t (%v)", c.ref, ok, c.kept, err)
			}
		}
	})

	// D4: a stop in west is not a stop of east's job of the same id; a
	// record from before records were keyed by region is the home region's,
	// and goes with the job's own.
	t.Run("stopped and written records: by region", func(t *testing.T) {
		t.Parallel()
		st := consulkv.NewStops(client.KV(), "stops-test/", "east", nil)
		wr := consulkv.NewRegistrations(client.KV(), "stops-test/", "east", nil)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go st.Follow(fctx)
		west := nomadjob.Ref{Region: "west", Namespace: "team", ID: "train"}
		east := nomadjob.Ref{Region: "east", Namespace: "team", ID: "train"}
		if err := st.Put(ctx, west, nomadjob.Stopped{Index: 9}); err != nil {
			t.Fatal(err)
		}
		if err := wr.Put(ctx, east, nomadjob.Registered{Index: 7}); err != nil {
			t.Fatal(err)
		}
		if _, ok := st.Get(east); ok {
			t.Errorf("west's stop reads as east's")
		}
		if r, ok := wr.Get(nomadjob.Ref{Namespace: "team", ID: "train"}); !ok || r.Index != 7 {
			t.Errorf("east's write, asked for in the home region: %+v %v", r, ok)
		}
		if _, err := client.KV().Put(&consul.KVPair{Key: "stops-test/stopped/team/old", Value: []byte(`{"stopped_at_index":3}`)}, nil); err != nil {
			t.Fatal(err)
		}
		old := nomadjob.Ref{Namespace: "team", ID: "old"}
		testcluster.WaitFor(t, 10*time.Second, "the record from before regions in the copy", func() error {
			if r, ok := st.Get(old); !ok || r.Index != 3 {
				return fmt.Errorf("%+v %v", r, ok)
			}
			return nil
		})
		if _, ok := st.Get(old.In("west")); ok {
			t.Errorf("a record from before regions reads as west's")
		}
		if err := st.Delete(ctx, old); err != nil {
			t.Fatal(err)
		}
		if p, _, _ := client.KV().Get("stops-test/stopped/team/old", nil); p != nil {
			t.Errorf("deleting the job's record left the one from before regions, which would read as the job's again")
		}
	})

	t.Run("profiles: more than one transaction's worth written and removed", func(t *testing.T) {
		t.Parallel()
		p := consulkv.NewProfiles(client, "profiles-test/", nil)
		var ps []usage.Profile
		for i := 0; i < 150; i++ {
			ps = append(ps, usage.Profile{Namespace: "vision", Job: fmt.Sprintf("team/job-%d", i), Asked: 2})
		}
		if left, err := p.Put(ctx, ps); err != nil || len(left) != 0 {
			t.Fatalf("put: %d left, %v", len(left), err)
		}
		got, err := p.List(ctx)
		if err != nil || len(got) != 150 {
			t.Fatalf("list: %d %v", len(got), err)
		}
		if left, err := p.Delete(ctx, ps[:100]); err != nil || len(left) != 0 {
			t.Fatalf("delete: %d left, %v", len(left), err)
		}
		if got, _ := p.List(ctx); len(got) != 50 {
			t.Errorf("after delete: %d", len(got))
		}
	})

	t.Run("rollups: days and the mark move together, once", func(t *testing.T) {
		t.Parallel()
		r := consulkv.NewRollups(client, "rollups-test/", nil)
		m, index, err := r.Mark(ctx)
		if err != nil || index != 0 || !m.Through.IsZero() {
			t.Fatalf("no mark yet: %+v %d %v", m, index, err)
		}
		through := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
		days := []usage.Rollup{{Day: "2026-11-28"}, {Day: "2026-11-29"}, {Day: "2026-11-30"}}
		if ok, err := r.Commit(ctx, 0, usage.Mark{Through: through}, days); !ok || err != nil {
			t.Fatalf("commit: %v %v", ok, err)
		}
		if ok, _ := r.Commit(ctx, 0, usage.Mark{Through: through.Add(time.Hour)}, days); ok {
			t.Error("a second leader committed from the same mark")
		}
		m, index, err = r.Mark(ctx)
		if err != nil || index == 0 || !m.Through.Equal(through) {
			t.Fatalf("mark: %+v %d %v", m, index, err)
		}
		got, err := r.Days(ctx, "2026-11-29", "2026-11-30")
		if err != nil || len(got) != 2 || got[0].Day != "2026-11-29" {
			t.Fatalf("days: %+v %v", got, err)
		}
		if err := r.DeleteBefore(ctx, "2026-11-29"); err != nil {
			t.Fatal(err)
		}
		if d, err := r.Day(ctx, "2026-11-28"); err != nil || d.Day != "2026-11-28" || len(d.Rows) != 0 {
			t.Errorf("a deleted day reads empty: %+v %v", d, err)
		}
		if got, _ := r.Days(ctx, "2026-01-01", "2026-12-31"); len(got) != 2 {
			t.Errorf("after delete: %+v", got)
		}
	})

	// One record that cannot be read (a hand edit) is set aside under
	// quarantine/, told of, and stops none of the others of its kind.
	t.Run("a record that cannot be read is set aside, and the others are read", func(t *testing.T) {
		t.Parallel()
		const prefix = "aside-test/"
		var mu sync.Mutex
		told := map[string]string{}
		aside := consulkv.NewAside(client, prefix, func(u consulkv.Unreadable) {
			mu.Lock()
			defer mu.Unlock()
			told[u.Kind] = u.MovedTo
		})
		garbage := func(key string) {
			t.Helper()
			if _, err := client.KV().Put(&consul.KVPair{Key: prefix + key, Value: []byte(`{"id": "half`)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		q := consulkv.NewQueue(client.KV(), prefix, aside)
		e := queue.Entry{ID: queue.NewID(), JobID: "train", Namespace: "vision", Request: json.RawMessage(`{"Job":{"ID":"train"}}`)}
		q.Put(ctx, e)
		bad := queue.NewID()
		garbage("queue/" + bad)
		if got, err := q.List(ctx); err != nil || len(got) != 1 || got[0].ID != e.ID {
			t.Errorf("queue: %+v %v", got, err)
		}
		garbage("queue/" + bad)
		if _, err := q.Get(ctx, bad); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("queue get of a garbage entry: %v", err)
		}

		d := consulkv.NewDecisions(client.KV(), prefix, aside)
		d.Create(ctx, reclaim.Record{ID: queue.NewID(), Rule: "idle"})
		garbage("reclaim/" + queue.NewID())
		if got, err := d.List(ctx); err != nil || len(got) != 1 {
			t.Errorf("reclaim: %+v %v", got, err)
		}

		a := consulkv.NewApprovals(client.KV(), prefix, aside)
		a.Create(ctx, approval.Approval{ID: queue.NewID(), Namespace: "vision"})
		garbage("approvals/" + queue.NewID())
		if got, err := a.List(ctx); err != nil || len(got) != 1 {
			t.Errorf("approvals: %+v %v", got, err)
		}

		r := consulkv.NewRollups(client, prefix, aside)
		r.Commit(ctx, 0, usage.Mark{}, []usage.Rollup{{Day: "2026-11-29"}})
		garbage("usage/2026-11-30")
		if got, err := r.Days(ctx, "2026-11-01", "2026-11-30"); err != nil || len(got) != 1 {
			t.Errorf("usage: %+v %v", got, err)
		}
		garbage("usage-through")
		if m, index, err := r.Mark(ctx); err != nil || index != 0 || !m.Through.IsZero() {
			t.Errorf("a garbage mark reads as none: %+v %d %v", m, index, err)
		}
		if ok, err := r.Commit(ctx, 0, usage.Mark{Through: time.Now()}, nil); !ok || err != nil {
			t.Errorf("counting goes on after a garbage mark: %v %v", ok, err)
		}

		s := consulkv.NewScales(client.KV(), prefix, "east", aside)
		garbage("scaled/east/team/train")
		if _, ok, err := s.Get(ctx, nomadjob.Ref{Namespace: "team", ID: "train"}); ok || err != nil {
			t.Errorf("a garbage grant reads as none: %v %v", ok, err)
		}
		p := consulkv.NewProfiles(client, prefix, aside)
		garbage("rightsizing/team/train")
		if got, err := p.List(ctx); err != nil || len(got) != 0 {
			t.Errorf("rightsizing: %+v %v", got, err)
		}

		mu.Lock()
		defer mu.Unlock()
		for _, kind := range []string{"queue", "reclaim", "approvals", "usage", "usage-through", "scaled", "rightsizing"} {
			if !strings.HasPrefix(told[kind], prefix+"quarantine/"+kind+"/") {
				t.Errorf("%s: told %q", kind, told[kind])
			}
		}
		held, err := aside.SetAside(ctx)
		if err != nil || len(held) != 7 { // the queue's garbage entry twice, under one key
			t.Errorf("set aside: %+v %v", held, err)
		}
	})

	// A queued job's request, most of its entry's bytes, is kept under
	// queue-body/ and read once: every change in the queue makes Consul send
	// each broker the queue's directory again.
	t.Run("queue: while the copy is not current, List reads the requests of changed entries only", func(t *testing.T) {
		t.Parallel()
		const prefix = "stale-copy-test/"
		// The broker's Consul client goes through a proxy that counts the
		// reads of requests.
		var bodyReads atomic.Int32
		target, _ := url.Parse("http://" + agent.Addr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/"+prefix+"queue-body/") {
				bodyReads.Add(1)
			}
			proxy.ServeHTTP(w, r)
		}))
		defer counted.Close()
		via, err := consul.NewClient(&consul.Config{Address: strings.TrimPrefix(counted.URL, "http://")})
		if err != nil {
			t.Fatal(err)
		}
		q := consulkv.NewQueue(via.KV(), prefix, nil)
		other := consulkv.NewQueue(client.KV(), prefix, nil)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go q.Follow(fctx)
		var kept []string
		for range 20 {
			e := queue.Entry{ID: queue.NewID(), JobID: "train", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1,
				Request: json.RawMessage(`{"Job":{"ID":"train"}}`)}
			if err := q.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
			kept = append(kept, e.ID)
		}
		testcluster.WaitFor(t, 10*time.Second, "the copy to hold the 20", func() error {
			if all, _ := q.List(ctx); q.Index() == 0 || len(all) != 20 {
				return fmt.Errorf("index %d, %d entries", q.Index(), len(all))
			}
			return nil
		})
		stop()
		testcluster.WaitFor(t, 10*time.Second, "following to stop", func() error {
			if q.Index() != 0 {
				return fmt.Errorf("index %d", q.Index())
			}
			return nil
		})
		// Meanwhile another broker queues one and parks one of the 20.
		added := queue.Entry{ID: queue.NewID(), JobID: "added", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 1,
			Request: json.RawMessage(`{"Job":{"ID":"added"}}`)}
		if err := other.Put(ctx, added); err != nil {
			t.Fatal(err)
		}
		if ok, err := other.Park(ctx, mustGet(t, other, kept[0]), "no such tenant", time.Now()); !ok || err != nil {
			t.Fatalf("park: %v %v", ok, err)
		}
		bodyReads.Store(0)
		all, err := q.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]queue.Entry{}
		for _, e := range all {
			byID[e.ID] = e
		}
		if len(all) != 21 || byID[added.ID].JobID != "added" || byID[kept[0]].Parked != "no such tenant" {
			t.Errorf("listed %d entries (want 21), the other's new one %+v, its parked one parked %q", len(all), byID[added.ID], byID[kept[0]].Parked)
		}
		for _, id := range kept {
			if r, err := byID[id].Body(); err != nil || !bytes.Contains(r, []byte(`"train"`)) {
				t.Errorf("entry %s listed without its request: %q %v", id, r, err)
			}
		}
		if n := bodyReads.Load(); n != 2 {
			t.Errorf("%d requests read, want 2: those of the two entries that changed", n)
		}
	})

	t.Run("queue: each request is kept apart, and goes with its entry", func(t *testing.T) {
		t.Parallel()
		const prefix = "split-test/"
		aside, told := recordedAside(client, prefix)
		q := consulkv.NewQueue(client.KV(), prefix, aside)
		raw := func(key string) []byte {
			t.Helper()
			p, _, err := client.KV().Get(prefix+key, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p == nil {
				return nil
			}
			return p.Value
		}
		request := json.RawMessage(`{"Job":{"ID":"train","Meta":{"pad":"` + strings.Repeat("x", 20000) + `"}}}`)
		e := queue.Entry{ID: queue.NewID(), JobID: "train", Namespace: "vision", Tenant: "vision", Queue: "training", Demand: 2, Request: request}
		if err := q.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
		if rec := raw("queue/" + e.ID); bytes.Contains(rec, []byte(`"request"`)) || !bytes.Contains(rec, []byte(fmt.Sprintf(`"request_bytes":%d`, len(request)))) || len(rec) > 1000 {
			t.Errorf("the entry's record holds its request, or not its size: %d bytes: %.200s", len(rec), rec)
		}
		// Kept compressed: a Consul server holds each byte in its state
		// store, its raft log and its heap's headroom.
		if p, _, err := client.KV().Get(prefix+"queue-body/"+e.ID, nil); err != nil || p == nil || p.Flags != 1 || len(p.Value) >= len(request)/10 {
			t.Errorf("queue-body/%s: %+v %v, want the request gzip-compressed (flags 1)", e.ID, p, err)
		} else if zr, err := gzip.NewReader(bytes.NewReader(p.Value)); err != nil {
			t.Error(err)
		} else if got, err := io.ReadAll(zr); err != nil || !bytes.Equal(got, request) {
			t.Errorf("queue-body/%s decompresses to %.60s (%v), not the request", e.ID, got, err)
		}
		got, err := q.Get(ctx, e.ID)
		if body, berr := got.Body(); err != nil || berr != nil || !bytes.Equal(body, request) || got.Size() != len(request) {
			t.Fatalf("get: %.60s (%d bytes) %v %v", body, got.Size(), err, berr)
		}
		// An entry written before requests were kept apart reads as it was,
		// and stays whole when it changes.
		inline := queue.Entry{ID: queue.NewID(), JobID: "old", Namespace: "vision", Request: json.RawMessage(`{"Job":{"ID":"old"}}`)}
		b, _ := json.Marshal(inline)
		if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue/" + inline.ID, Value: b}, nil); err != nil {
			t.Fatal(err)
		}
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go q.Follow(fctx)
		testcluster.WaitFor(t, 10*time.Second, "the copy", func() error {
			all, err := q.List(ctx)
			if err != nil || q.Index() == 0 || len(all) != 2 {
				return fmt.Errorf("%d entries, index %d: %v", len(all), q.Index(), err)
			}
			for _, a := range all {
				body, err := a.Body()
				if want := map[string]json.RawMessage{e.ID: request, inline.ID: inline.Request}[a.ID]; err != nil || !bytes.Equal(body, want) {
					return fmt.Errorf("%s listed with %.60s (%v)", a.ID, body, err)
				}
				if a.ID == e.ID && (a.Request != nil || len(a.Packed) >= len(request)/10) {
					return fmt.Errorf("the copy holds %s's request as %d bytes, %d packed: not compressed", a.ID, len(a.Request), len(a.Packed))
				}
			}
			return nil
		})
		all, _ := q.List(ctx)
		for _, a := range all {
			if ok, err := q.Park(ctx, a, "parked", time.Now()); !ok || err != nil {
				t.Fatalf("park %s: %v %v", a.ID, ok, err)
			}
		}
		if rec := raw("queue/" + e.ID); bytes.Contains(rec, []byte(`"request"`)) || !bytes.Contains(rec, []byte(`"parked"`)) {
			t.Errorf("parked, the entry's record took its request in: %.200s", rec)
		}
		if rec := raw("queue/" + inline.ID); !bytes.Contains(rec, []byte(`"request":{"Job"`)) {
			t.Errorf("parked, an entry written whole lost its request: %s", rec)
		}
		claimed, ok, err := q.Claim(ctx, mustGet(t, q, e.ID), time.Now())
		if body, _ := claimed.Body(); !ok || err != nil || !bytes.Equal(body, request) {
			t.Errorf("claimed without its request: %v %v %.60s", ok, err, body)
		}
		if ok, err := q.Remove(ctx, claimed); !ok || err != nil {
			t.Fatalf("remove: %v %v", ok, err)
		}
		if rec, body := raw("queue/"+e.ID), raw("queue-body/"+e.ID); rec != nil || body != nil {
			t.Errorf("removed, the entry left %d bytes and its request %d", len(rec), len(body))
		}

		// An entry whose request is gone is set aside, and stops nothing.
		lost := queue.Entry{ID: queue.NewID(), JobID: "lost", Namespace: "vision", Request: json.RawMessage(`{"Job":{"ID":"lost"}}`)}
		if err := q.Put(ctx, lost); err != nil {
			t.Fatal(err)
		}
		if _, err := client.KV().Delete(prefix+"queue-body/"+lost.ID, nil); err != nil {
			t.Fatal(err)
		}
		fresh := consulkv.NewQueue(client.KV(), prefix, aside)
		if got, err := fresh.List(ctx); err != nil || len(got) != 1 || got[0].ID != inline.ID {
			t.Errorf("listed with a request gone: %+v %v", got, err)
		}
		if got := told(); len(got) == 0 || !strings.Contains(got[0], lost.ID) || !strings.Contains(got[0], "missing") {
			t.Errorf("told: %q", got)
		}

		// Every key written has an owner: a request no entry owns (its
		// entry's write failed, or a delete after it) goes at the second
		// prune that finds it so; one whose entry is set aside stays.
		keep := queue.Entry{ID: queue.NewID(), JobID: "keep", Namespace: "vision", Request: json.RawMessage(`{"Job":{"ID":"keep"}}`)}
		if err := q.Put(ctx, keep); err != nil {
			t.Fatal(err)
		}
		orphan := queue.NewID()
		if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue-body/" + orphan, Value: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue-body/" + lost.ID, Value: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
		for i, want := range []int{0, 1, 0} {
			if n, err := q.PruneRequests(ctx); n != want || err != nil {
				t.Errorf("prune %d: %d deleted, want %d (%v)", i+1, n, want, err)
			}
		}
		if raw("queue-body/"+orphan) != nil || raw("queue-body/"+keep.ID) == nil || raw("queue-body/"+lost.ID) == nil {
			t.Errorf("after the prunes: the orphan %t, a queued entry's %t, a set-aside entry's %t",
				raw("queue-body/"+orphan) != nil, raw("queue-body/"+keep.ID) != nil, raw("queue-body/"+lost.ID) != nil)
		}
	})

	// A queue entry that decodes but is not one the broker wrote (null, {},
	// one whose id is not its key's, a copy of another under a new key) is
	// set aside too. Listed, it had an id no one could cancel, and was
	// parked again at every pass.
	t.Run("queue entries of the wrong shape are set aside", func(t *testing.T) {
		t.Parallel()
		const prefix = "shape-test/"
		aside, told := recordedAside(client, prefix)
		q := consulkv.NewQueue(client.KV(), prefix, aside)
		good := queue.Entry{ID: queue.NewID(), JobID: "train", Namespace: "vision", Request: json.RawMessage(`{"Job":{"ID":"train"}}`)}
		q.Put(ctx, good)
		copied, _ := json.Marshal(good)
		noJob, _ := json.Marshal(queue.Entry{ID: "ID", Request: good.Request})
		for _, v := range []string{`null`, `{}`, string(copied), strings.Replace(string(noJob), `"ID"`, `"$KEY"`, 1)} {
			key := queue.NewID()
			if _, err := client.KV().Put(&consul.KVPair{Key: prefix + "queue/" + key, Value: []byte(strings.ReplaceAll(v, "$KEY", key))}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := q.List(ctx); err != nil || len(got) != 1 || got[0].ID != good.ID {
			t.Errorf("listed: %+v %v", got, err)
		}
		if got := told(); len(got) != 4 || !strings.Contains(strings.Join(got, "\n"), "not its key's") || !strings.Contains(strings.Join(got, "\n"), "names no job") {
			t.Errorf("told: %q", got)
		}
		if got, err := q.List(ctx); err != nil || len(got) != 1 {
			t.Errorf("listed again: %+v %v", got, err)
		}
	})

	// Every key written has an owner that deletes it: 1,000 jobs scaled or
	// dispatched through the broker leave a grant each, and once Nomad no
	// longer has them the leader's prune leaves KV as it was.
	t.Run("grants of 1,000 jobs that came and went are pruned: KV is back to its size", func(t *testing.T) {
		t.Parallel()
		const prefix = "hygiene-test/"
		keys := func() int {
			k, _, err := client.KV().Keys(prefix, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			return len(k)
		}
		s := consulkv.NewScales(client.KV(), prefix, "east", nil)
		s.Put(ctx, nomadjob.Ref{Namespace: "team", ID: "stays"}, nomadjob.ScaleGrant{Stamp: "s"})
		before := keys()
		for i := 0; i < 1000; i++ {
			if err := s.Put(ctx, nomadjob.Ref{Namespace: "team", ID: fmt.Sprintf("job-%d", i)}, nomadjob.ScaleGrant{Stamp: "s"}); err != nil {
				t.Fatal(err)
			}
		}
		if got := keys(); got != before+1000 {
			t.Fatalf("%d keys after 1,000 grants, %d before", got, before)
		}
		gone := func(_ context.Context, job nomadjob.Ref) (bool, error) { return job.ID != "stays", nil }
		if n, err := s.Prune(ctx, gone); err != nil || n != 1000 {
			t.Fatalf("pruned %d: %v", n, err)
		}
		if got := keys(); got != before {
			t.Errorf("%d keys once the jobs are gone, %d before them", got, before)
		}
	})

	// Right-sizing profiles are bounded by count as well as by age: 1,500
	// jobs that came and went within the retention leave usage.MaxProfiles
	// keys, the most recently sampled.
	t.Run("profiles of 1,500 jobs that came and went: at most MaxProfiles keys, the newest", func(t *testing.T) {
		t.Parallel()
		const prefix = "profiles-bound-test/"
		store := consulkv.NewProfiles(client, prefix, nil)
		table := usage.NewProfiles()
		rec := &reclaimer.Recorder{Store: store, Table: table, Policies: testbuild.Fixed{P: testbuild.Policy(t, "queue \"training\" { priority = 60 }\ntenant \"vision\" {\n  namespaces = [\"vision\"]\n  queues = [\"training\"]\n}")}}
		t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		for i := range 1500 {
			at := t0.Add(time.Duration(i) * time.Minute)
			alloc := reclaim.Alloc{ID: fmt.Sprint(i), Namespace: "vision", JobID: fmt.Sprintf("job-%04d", i), Admitted: true, StartedAt: at, GPUs: []string{"g0"}}
			table.Sample(at, []reclaim.Alloc{alloc}, map[string]reclaim.GPU{"g0": {Utilization: 50, Healthy: true}}, 5)
		}
		if err := rec.Flush(ctx, t0.Add(1500*time.Minute)); err != nil {
			t.Fatal(err)
		}
		keys, _, err := client.KV().Keys(prefix+"rightsizing/", "", nil)
		if err != nil || len(keys) != usage.MaxProfiles {
			t.Fatalf("%d keys (%v), want %d", len(keys), err, usage.MaxProfiles)
		}
		sort.Strings(keys)
		if keys[0] != prefix+"rightsizing/vision/job-0500" {
			t.Errorf("the oldest kept: %s, want job-0500", keys[0])
		}
	})

	t.Run("the admission key: created once, then the same for every broker", func(t *testing.T) {
		t.Parallel()
		a, err := consulkv.StampKey(ctx, client.KV(), "key-test/")
		if err != nil || len(a) != 32 {
			t.Fatalf("%x %v", a, err)
		}
		b, err := consulkv.StampKey(ctx, client.KV(), "key-test/")
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("a second broker's key differs: %x %x %v", a, b, err)
		}
	})

	t.Run("holds: what the leader writes, every broker follows; none left, the key is gone", func(t *testing.T) {
		t.Parallel()
		leader, follower := consulkv.NewHolds(client.KV(), "holds-test/"), consulkv.NewHolds(client.KV(), "holds-test/")
		seen := make(chan map[string]string, 16)
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		go follower.Follow(fctx, func(h map[string]string) { seen <- h })
		wait := func(want map[string]string) {
			t.Helper()
			deadline := time.After(10 * time.Second)
			for {
				select {
				case h := <-seen:
					if maps.Equal(h, want) {
						return
					}
				case <-deadline:
					t.Fatalf("the follower never saw %v", want)
				}
			}
		}
		wait(map[string]string{})
		held := map[string]string{"n1": "vision/big"}
		if err := leader.Put(ctx, held); err != nil {
			t.Fatal(err)
		}
		wait(held)
		if err := leader.Put(ctx, nil); err != nil {
			t.Fatal(err)
		}
		wait(map[string]string{})
		if pair, _, err := client.KV().Get("holds-test/holds", nil); err != nil || pair != nil {
			t.Errorf("no hold left, the key stays: %v %v", pair, err)
		}
	})
}

// mustGet reads entry id of q.
func mustGet(t *testing.T, q *consulkv.Queue, id string) queue.Entry {
	t.Helper()
	e, err := q.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// recordedAside sets records under prefix aside, and tells what it was told
// of each: the record's key and why it could not be read.
func recordedAside(client *consul.Client, prefix string) (*consulkv.Aside, func() []string) {
	var (
		mu   sync.Mutex
		told []string
	)
	aside := consulkv.NewAside(client, prefix, func(u consulkv.Unreadable) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, u.Key+": "+u.Err.Error())
	})
	return aside, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(told)
	}
}
