package reclaimer

import (
	"context"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
)

// RegionObserver observes one region's GPU allocations (nomadapi.Observer).
type RegionObserver interface {
	Observer
	// Ended are its allocations that stopped holding GPUs lately.
	Ended() []reclaim.Alloc
}

// Elsewhere observes, for the usage ledger, the regions a broker governs
// besides its own: each pass, their running GPU allocations and GPUs, and
// those that ended lately, each marked with its region. A region that cannot
// be observed now is charged as it was last observed (its jobs stay charged,
// in state unknown, until the region is back or lost), less what ended since.
type Elsewhere struct {
	Log       hclog.Logger
	Observers map[string]RegionObserver // by region
	last      map[string]observed
}

type observed struct {
	allocs []reclaim.Alloc
	gpus   map[string]reclaim.GPU
}

// Observe is what the other regions hold now, and what ended there lately.
func (e *Elsewhere) Observe(ctx context.Context) (running, ended []reclaim.Alloc, gpus map[string]reclaim.GPU) {
	if e.last == nil {
		e.last = map[string]observed{}
	}
	gpus = map[string]reclaim.GPU{}
	for _, region := range slices.Sorted(maps.Keys(e.Observers)) {
		o := e.Observers[region]
		gone := map[string]bool{}
		for _, a := range o.Ended() {
			a.Region = region
			ended, gone[a.ID] = append(ended, a), true
		}
		allocs, g, err := o.Observe(ctx)
		if err != nil {
			e.Log.Warn("usage ledger: region not observed this pass; charged as last observed", "region", region, "error", err)
			was := e.last[region]
			allocs, g = slices.DeleteFunc(slices.Clone(was.allocs), func(a reclaim.Alloc) bool { return gone[a.ID] }), was.gpus
		} else {
			for i := range allocs {
				allocs[i].Region = region
			}
		}
		e.last[region] = observed{allocs, g}
		running = append(running, allocs...)
		maps.Copy(gpus, g)
	}
	return running, ended, gpus
}
