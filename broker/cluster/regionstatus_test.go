package cluster

import (
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// A region is unreachable from its first failure, with its last one's
// reason, until it is listed again, which also settles what it lost. A job
// the broker dispatched there is kept while live and verified, and as ended
// for endedDispatchKept once it is not live; one never dispatched is not.
func TestARegionsStatusFollowsFailuresAndDispatches(t *testing.T) {
	s := newRegionStatus()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	s.failed(t0, "connection refused")
	s.failed(t0.Add(time.Minute), "timeout")
	if s.unreachable != t0 || s.unreachableWhy != "timeout" {
		t.Errorf("unreachable since %s (%s), want %s with the last reason", s.unreachable, s.unreachableWhy, t0)
	}
	s.lose(jobKey{"vision", "train"}, map[string]int{"H100": 2})
	s.listed()
	if !s.unreachable.IsZero() || s.lost != nil {
		t.Errorf("listed again: unreachable %s, lost %v", s.unreachable, s.lost)
	}

	dispatched := testbuild.Job("vision", "train").Meta(nomadjob.MetaDispatched, "west").Build()
	plain := testbuild.Job("vision", "plain").Build()
	train, other := jobKey{"vision", "train"}, jobKey{"vision", "plain"}
	s.noteDispatched(train, dispatched, true, true, t0)
	s.noteDispatched(other, plain, true, true, t0)
	if got := s.dispatchedJobs(); len(got) != 1 || *got[0].ID != "train" {
		t.Fatalf("dispatched %v, want train alone", got)
	}
	s.noteDispatched(train, dispatched, true, false, t0)
	if len(s.dispatchedJobs()) != 0 {
		t.Errorf("a dispatched job whose stamp does not verify is kept")
	}
	s.noteDispatched(train, dispatched, false, true, t0)
	s.noteDispatched(other, plain, false, true, t0)
	if !s.endedLately(train) || s.endedLately(other) || len(s.dispatchedJobs()) != 0 {
		t.Errorf("ended: train %t, plain %t; live %d", s.endedLately(train), s.endedLately(other), len(s.dispatchedJobs()))
	}
	// Swept as another dispatch ends (at most once a minute), of those
	// kept past endedDispatchKept.
	s.noteDispatched(jobKey{"vision", "later"}, dispatched, false, true, t0.Add(endedDispatchKept+2*time.Minute))
	if s.endedLately(train) {
		t.Errorf("an ended dispatch is kept past endedDispatchKept")
	}
}
