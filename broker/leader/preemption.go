package leader

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
)

// PreemptionSetter makes Nomad's scheduler preemption what policy says, and
// reports whether it had to change it.
type PreemptionSetter interface {
	SetPreemption(ctx context.Context, batch, service bool) (changed bool, err error)
}

// KeepPreemption asserts policy's preemption settings in Nomad now, on every
// policy reload and on every tick (anyone with operator rights may have
// changed them), until ctx ends. want reads the policy in force.
func KeepPreemption(ctx context.Context, tick <-chan time.Time, reloaded <-chan struct{}, want func() (batch, service bool),
	nomad PreemptionSetter, log hclog.Logger) {
	for {
		batch, service := want()
		changed, err := nomad.SetPreemption(ctx, batch, service)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("cannot set Nomad's preemption", "error", err)
		case changed:
			log.Warn("Nomad's scheduler preemption differed from policy: set again", "batch", batch, "service", service)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-reloaded:
		}
	}
}
