package reclaimer

import (
	"context"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// RegionObserver observes one region's GPU allocations (nomadapi.Observer).
type RegionObserver interface {
	Observer
	// Ended are its allocations that stopped holding GPUs lately.
	Ended() []reclaim.Alloc
}

// RegionalActor carries decisions out in one region, and reads its jobs
// (nomadapi.Client.Region).
type RegionalActor interface {
	Actor
	Job(ctx context.Context, namespace, id string) (*api.Job, error)
}

// Elsewhere observes the regions a broker governs besides its own, once a
// reclaim pass: their running GPU allocations and GPUs, each marked with its
// region, for the rules (Observe), and for the usage ledger (Last) with what
// ended there lately. A region that cannot be observed now is left to the
// rules, and charged as it was last observed (its jobs stay charged, in state
// unknown, until the region is back or lost), less what ended since.
type Elsewhere struct {
	Log       hclog.Logger
	Observers map[string]RegionObserver // by region
	// In is the actor of a region, which carries out the decisions on its
	// allocations.
	In func(region string) RegionalActor

	last map[string]observed
	pass observed // the last pass's, every region's
}

type observed struct {
	allocs, ended []reclaim.Alloc
	gpus          map[string]reclaim.GPU
}

// Observe observes every other region now: what the rules decide on.
func (e *Elsewhere) Observe(ctx context.Context) ([]reclaim.Alloc, map[string]reclaim.GPU) {
	if e.last == nil {
		e.last = map[string]observed{}
	}
	var fresh []reclaim.Alloc
	e.pass = observed{gpus: map[string]reclaim.GPU{}}
	for _, region := range slices.Sorted(maps.Keys(e.Observers)) {
		o := e.Observers[region]
		gone := map[string]bool{}
		for _, a := range o.Ended() {
			a.Region = region
			e.pass.ended, gone[a.ID] = append(e.pass.ended, a), true
		}
		allocs, g, err := o.Observe(ctx)
		if err != nil {
			e.Log.Warn("region not observed this pass: its allocations are charged as last observed, and no rule looks at them",
				"region", region, "error", err)
			was := e.last[region]
			allocs, g = slices.DeleteFunc(slices.Clone(was.allocs), func(a reclaim.Alloc) bool { return gone[a.ID] }), was.gpus
		} else {
			for i := range allocs {
				allocs[i].Region = region
			}
			fresh = append(fresh, allocs...)
		}
		e.last[region] = observed{allocs: allocs, gpus: g}
		e.pass.allocs = append(e.pass.allocs, allocs...)
		maps.Copy(e.pass.gpus, g)
	}
	return fresh, e.pass.gpus
}

// Last is what the last Observe found in every other region, for the
// ledger: their running allocations (as last observed where a region could
// not be), those that ended lately, and their GPUs.
func (e *Elsewhere) Last() (running, ended []reclaim.Alloc, gpus map[string]reclaim.GPU) {
	return e.pass.allocs, e.pass.ended, e.pass.gpus
}
