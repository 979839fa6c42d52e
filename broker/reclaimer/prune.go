package reclaimer

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// Pruner deletes, each Every at most, what the broker keeps about jobs that
// Nomad no longer has (the scale and dispatch grants): it is those keys'
// owner. It runs as a watcher of the reclaim passes, so only the leader
// prunes.
type Pruner struct {
	What  string // what it prunes, for the log
	Prune func(ctx context.Context) (int, error)
	Every time.Duration
	Log   hclog.Logger
	last  time.Time
}

// Observed prunes when Every has passed since it last did.
func (p *Pruner) Observed(ctx context.Context, now time.Time, _ []reclaim.Alloc, _ map[string]reclaim.GPU) error {
	if !p.last.IsZero() && now.Sub(p.last) < p.Every {
		return nil
	}
	p.last = now
	n, err := p.Prune(ctx)
	if n > 0 {
		p.Log.Info("pruned", "what", p.What, "deleted", n)
	}
	return err
}
