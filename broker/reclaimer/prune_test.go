package reclaimer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaimer"
)

// The pruner runs at its first pass, then once Every has passed, and says
// when pruning failed.
func TestThePrunerRunsEveryPeriodAtMost(t *testing.T) {
	runs := 0
	var fail error
	p := &reclaimer.Pruner{What: "grants", Every: 10 * time.Minute, Log: hclog.NewNullLogger(),
		Prune: func(context.Context) (int, error) { runs++; return 1, fail }}
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		after time.Duration
		runs  int
	}{{0, 1}, {time.Minute, 1}, {9 * time.Minute, 1}, {10 * time.Minute, 2}, {15 * time.Minute, 2}, {20 * time.Minute, 3}} {
		if err := p.Observed(context.Background(), start.Add(c.after), nil, nil); err != nil || runs != c.runs {
			t.Errorf("after %s: %d runs (want %d), %v", c.after, runs, c.runs, err)
		}
	}
	fail = errors.New("consul unreachable")
	if err := p.Observed(context.Background(), start.Add(30*time.Minute), nil, nil); !errors.Is(err, fail) {
		t.Errorf("a failed prune: %v", err)
	}
}
