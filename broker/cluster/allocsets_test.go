package cluster

import (
	"maps"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// What live allocations hold is summed by job, replaced whole when an
// allocation changes, and gone with its last allocation; the GPUs of those
// created after an index are told apart.
func TestTheHoldsTrackerSumsWhatAJobsAllocationsHold(t *testing.T) {
	s := newHoldSet()
	k := jobKey{"vision", "train"}
	s.set("a1", hold{key: k, byModel: map[string]int{"A": 2}, created: 10})
	s.set("a2", hold{key: k, byModel: map[string]int{"A": 1, "B": 1}, created: 20})
	s.set("x", hold{key: jobKey{"search", "other"}, byModel: map[string]int{"A": 8}, created: 30})
	if got, want := s.of(k), map[string]int{"A": 3, "B": 1}; !maps.Equal(got, want) {
		t.Errorf("the job holds %v, want %v", got, want)
	}
	if got := s.createdAfter(k, 10); got != 2 {
		t.Errorf("created after 10: %d GPUs, want a2's 2", got)
	}
	s.set("a1", hold{key: k, byModel: map[string]int{"A": 1}, created: 10})
	s.set("a2", hold{key: k})
	if got, want := s.of(k), map[string]int{"A": 1}; !maps.Equal(got, want) {
		t.Errorf("after a1 changed and a2 ended, the job holds %v, want %v", got, want)
	}
	s.set("a1", hold{key: k})
	if s.of(k) != nil || len(s.byAlloc) != 1 {
		t.Errorf("a job with no allocation left holds %v (%d allocations known)", s.of(k), len(s.byAlloc))
	}
}

// An allocation that ran is kept once it stops holding GPUs, without an
// end until its client tells one, and swept an hour after its tasks
// ended; one that never ran is not kept. A listing ends what it no longer
// has at the listing's time, and keeps what was running and is gone.
func TestTheEndedTrackerKeepsWhatTheLedgerCharges(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	now := t0
	c := clock.Func(func() time.Time { return now })
	s := newEndedSet()
	ran := Alloc{ID: "a1", StartedAt: t0.Add(-time.Hour), ModifyIndex: 5}

	stopping := testbuild.Alloc("a1", "vision", "train", "n1", 5, "g0").Status(api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 6).Build()
	s.track(stopping, ran, true, false, c)
	if got := s.list(); len(got) != 1 || !got[0].EndedAt.IsZero() {
		t.Fatalf("a stopping allocation: %+v, want it kept with no end", got)
	}
	s.track(testbuild.Alloc("a0", "vision", "train", "n1", 5, "g1").Status(api.AllocDesiredStatusStop, api.AllocClientStatusPending, 6).Build(),
		Alloc{ID: "a0"}, true, false, c)
	if len(s.list()) != 1 {
		t.Errorf("an allocation that never ran is kept")
	}
	done := testbuild.Alloc("a1", "vision", "train", "n1", 5, "g0").Status(api.AllocDesiredStatusStop, api.AllocClientStatusComplete, 7).Finished(t0).Build()
	s.track(done, ran, true, false, c)
	if got := s.list(); len(got) != 1 || !got[0].EndedAt.Equal(t0) {
		t.Errorf("its client told its end: %+v, want EndedAt %s", got, t0)
	}

	s.unseen(map[string]Alloc{"gone": {ID: "gone", StartedAt: t0}, "still": {ID: "still", StartedAt: t0}},
		map[string]Alloc{"still": {ID: "still"}}, nil, now)
	if got := s.list(); len(got) != 2 || got[1].ID != "gone" || !got[1].EndedAt.Equal(now) {
		t.Errorf("after a listing: %+v, want a1 and gone, ended at the listing", got)
	}

	now = t0.Add(endedRetention + 2*time.Minute)
	s.track(testbuild.Alloc("b1", "vision", "train", "n1", 9, "g2").Status(api.AllocDesiredStatusStop, api.AllocClientStatusRunning, 9).Build(),
		Alloc{ID: "b1", StartedAt: now}, true, false, c)
	if got := s.list(); len(got) != 1 || got[0].ID != "b1" {
		t.Errorf("an hour after: %+v, want b1 alone", got)
	}
}
