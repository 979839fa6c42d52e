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
	Pos          Pos // where it is defined
}

// WorkloadOf is the workload of a queue, nil if the policy defines none for it.
func (p *Policy) WorkloadOf(queue string) *Workload {
	if q, ok := p.Queues[queue]; ok {
		return p.Workloads[q.Workload]
	}
	return nil
}

// WorkloadFor is the workload of a job in namespace asking for queue (""
// its tenant's default queue), nil if none.
func (p *Policy) WorkloadFor(namespace, queue string) *Workload {
	if q := p.queueOf(namespace, queue); q != nil && p.TenantOf(namespace) != nil {
		return p.Workloads[q.Workload]
	}
	return nil
}
