package policy

import (
	"time"
)

// Workload is a workload block: how the broker treats one kind of GPU work
// (a queue's workload names one).
type Workload struct {
	Name string
	// Gang: admitted only when every allocation fits the free GPUs at
	// once, node by node.
	Gang bool
	// CheckpointGrace is the kill_timeout floor written into its tasks, so
	// that a preempted task can write its checkpoint (0: none).
	CheckpointGrace time.Duration
	// RestartAttempts is written as a restart block into its task groups
	// that set none (0: none).
	RestartAttempts int
	// RequireUpdate: registered only with an update block that has canaries
	// and auto_revert.
	RequireUpdate bool
	// ProtectMinCount: never admitted in the borrowing band, so that the
	// first `min` allocations of its scaling blocks cannot be preempted.
	ProtectMinCount bool
	// MaxGPUs caps the GPUs of one job (0: no cap).
	MaxGPUs int
	// DefaultTTL is written as nomad-gpu.ttl where a job sets none (0: none).
	DefaultTTL time.Duration
	// Shared: it may be placed on time-sliced GPU replicas.
	Shared bool
	// OnRegionLoss is the policy's OnRegionLoss for its jobs ("": the
	// policy's).
	OnRegionLoss string
	// PromoteBelow is its own borrowing.promote_below (nil: the borrowing
	// block's): work that keeps no checkpoint loses everything it did when
	// evicted, so it may stop being preemptible sooner than other work.
	PromoteBelow *float64
	Pos          Pos // where it is defined
}

// WorkloadOf is the workload of a queue, nil if the policy defines none for it.
func (p *Policy) WorkloadOf(queue string) *Workload {
	if q, ok := p.Queues[queue]; ok {
		return p.Workloads[q.Workload]
	}
	return nil
}

// PromoteBelow is the promote_below of queue's work: its workload's, else
// the borrowing block's.
func (p *Policy) PromoteBelow(queue string) float64 {
	if w := p.WorkloadOf(queue); w != nil && w.PromoteBelow != nil {
		return *w.PromoteBelow
	}
	return p.Borrowing.PromoteBelow
}

// MaxPromoteBelow is the highest promote_below of any work, the borrowing
// block's or a workload's: 0, no running borrowed work is ever promoted.
func (p *Policy) MaxPromoteBelow() float64 {
	most := p.Borrowing.PromoteBelow
	for _, w := range p.Workloads {
		if w.PromoteBelow != nil {
			most = max(most, *w.PromoteBelow)
		}
	}
	return most
}

// WorkloadFor is the workload of a job in namespace asking for queue (""
// its tenant's default queue), nil if none.
func (p *Policy) WorkloadFor(namespace, queue string) *Workload {
	if q := p.queueOf(namespace, queue); q != nil && p.TenantOf(namespace) != nil {
		return p.Workloads[q.Workload]
	}
	return nil
}
