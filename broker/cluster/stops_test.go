package cluster

import (
	"maps"
	"testing"
	"time"
)

// A stop is kept from when it was first seen at its index until the leader
// records that index, the broker registers the job again, or it has been
// kept unrecordedStopKept; a stop at another index is another stop.
func TestStopsAreKeptUntilRecordedRevivedOrOld(t *testing.T) {
	s := stops{}
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	train, serve, old := jobKey{"vision", "train"}, jobKey{"vision", "serve"}, jobKey{"vision", "old"}
	s.saw(train, 7, t0)
	s.saw(train, 7, t0.Add(50*time.Minute)) // seen again: kept from its first sight
	s.saw(serve, 9, t0)
	s.saw(old, 3, t0.Add(-2*time.Hour))
	s.prune(t0.Add(30 * time.Minute))
	if want := map[[2]string]uint64{{"vision", "train"}: 7, {"vision", "serve"}: 9}; !maps.Equal(s.pending(), want) {
		t.Fatalf("pending %v, want %v", s.pending(), want)
	}
	s.recorded(train, 5) // an older stop's record
	s.revived(serve)
	if want := map[[2]string]uint64{{"vision", "train"}: 7}; !maps.Equal(s.pending(), want) {
		t.Errorf("after an older record and a revival: %v, want %v", s.pending(), want)
	}
	s.saw(train, 11, t0.Add(time.Hour))
	s.recorded(train, 7)
	if s.pending()[[2]string{"vision", "train"}] != 11 {
		t.Errorf("a record of the stop before ended the newer one: %v", s.pending())
	}
	s.prune(t0.Add(2*time.Hour + time.Second))
	if len(s.pending()) != 0 {
		t.Errorf("kept past unrecordedStopKept: %v", s.pending())
	}
}
