package admission

import (
	"slices"
	"sort"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Running is a job running borrowed, as promotion weighs it.
type Running struct {
	Namespace, ID, Tenant, Queue string
	Region                       string // the Nomad region it runs in ("": the broker's own)
	GPUs                         float64
	Since                        time.Time // when it started running
	Priority                     int       // its priority in Nomad now
}

// Promotion is a borrowed job to run on within its tenant's guarantee: at
// Priority, its queue's band.
type Promotion struct {
	Running
	Priority int
}

// Promotions returns, under policy borrowing.promote_below (or its
// workload's, for a job of a workload that sets its own), the running
// borrowed jobs that run on within their tenant's guarantee. Each tenant's
// oldest go first: the most work a preemption would lose, short of knowing
// its checkpoints. They go while its work within the guarantee
// (guaranteed, by tenant) and the job stay within promote_below of it. Promoted, a job is
// no longer another tenant's to preempt; promoting only below the whole
// guarantee keeps room for the tenant's next job to take borrowed work
// back. Only guarantees over all GPUs are weighed (one by class says
// nothing of another class's job).
func Promotions(p *policy.Policy, guaranteed map[string]float64, running []Running) []Promotion {
	// Only work whose promote_below is above 0 is weighed (a workload may
	// promote while the borrowing block does not).
	running = slices.DeleteFunc(slices.Clone(running), func(r Running) bool { return p.PromoteBelow(r.Queue) <= 0 })
	if len(running) == 0 {
		return nil
	}
	sort.SliceStable(running, func(i, j int) bool {
		if !running[i].Since.Equal(running[j].Since) {
			return running[i].Since.Before(running[j].Since)
		}
		return running[i].Namespace+"/"+running[i].ID < running[j].Namespace+"/"+running[j].ID
	})
	held := make(map[string]float64, len(guaranteed))
	for t, n := range guaranteed {
		held[t] = n
	}
	var out []Promotion
	for _, r := range running {
		t, q := p.Tenants[r.Tenant], p.Queues[r.Queue]
		if t == nil || q == nil || len(t.Guaranteed) != 1 {
			continue
		}
		g, ok := t.Guaranteed[policy.AllGPUs]
		if !ok || exceeds(held[r.Tenant]+r.GPUs, p.PromoteBelow(r.Queue)*g) {
			continue
		}
		held[r.Tenant] += r.GPUs
		out = append(out, Promotion{Running: r, Priority: q.Band})
	}
	return out
}
