package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// NodeGroup is Count nodes of GPUs GPUs of one model each.
type NodeGroup struct {
	Model string
	GPUs  int
	Count int
}

// ParseNodes reads a cluster as "COUNTxGPUS:MODEL,…", e.g.
// "1250x8:NVIDIA H100 80GB HBM3".
func ParseNodes(spec string) ([]NodeGroup, error) {
	var out []NodeGroup
	for _, part := range strings.Split(spec, ",") {
		shape, model, ok := strings.Cut(strings.TrimSpace(part), ":")
		count, gpus, ok2 := strings.Cut(shape, "x")
		c, err1 := strconv.Atoi(count)
		g, err2 := strconv.Atoi(gpus)
		if !ok || !ok2 || err1 != nil || err2 != nil || c <= 0 || g <= 0 || model == "" {
			return nil, fmt.Errorf("nodes %q: want COUNTxGPUS:MODEL (e.g. 1250x8:NVIDIA H100 80GB HBM3), comma-separated", part)
		}
		out = append(out, NodeGroup{Model: model, GPUs: g, Count: c})
	}
	return out, nil
}

// GPUs is the cluster's GPUs in all.
func GPUs(nodes []NodeGroup) int {
	n := 0
	for _, g := range nodes {
		n += g.GPUs * g.Count
	}
	return n
}

// The published trace statistics a generated workload follows.
const (
	// Philly (Microsoft, as Gavel-style simulators use it): 70/10/15/5 % of
	// jobs ask 1/2/4/8 GPUs; 80 % run ~32 min to ~16.7 h, 20 % up to ~6.9 days.
	Philly = "philly"
	// Helios (Shanghai AI Lab): median 1 GPU, mean 3.7; median ~206 s; ~15 %
	// failed, ~22 % cancelled.
	Helios = "helios"
)

// Generator makes a synthetic workload.
type Generator struct {
	Trace string // Philly or Helios
	Jobs  int
	Seed  uint64
	// Load is the GPU work offered as a share of the cluster's GPU time over
	// the arrivals' span (1: exactly full on average).
	Load float64
}

// Generate makes g.Jobs jobs for the policy's tenants on nodes. Tenants
// submit in proportion to their guarantee, in bursts, more by day than by
// night, to their queues (7:2:1 training, dev, inference). A job's kind
// follows its queue's workload: dev sessions (1 GPU, half of them left
// idle, 1-10 h), inference services (1-2 GPUs, 1-3 days), and training
// jobs drawn from the trace's statistics, checkpointing hourly.
func Generate(p *policy.Policy, nodes []NodeGroup, g Generator) ([]Job, error) {
	if g.Trace != Philly && g.Trace != Helios {
		return nil, fmt.Errorf("workload %q: want %s or %s", g.Trace, Philly, Helios)
	}
	if g.Jobs <= 0 || g.Load <= 0 {
		return nil, fmt.Errorf("a workload needs jobs and a load above 0")
	}
	rng := rand.New(rand.NewPCG(g.Seed, 0x6e6f6d6164677075))
	tenants := make([]*policy.Tenant, 0, len(p.Tenants))
	for _, t := range p.Tenants {
		tenants = append(tenants, t)
	}
	sort.Slice(tenants, func(i, j int) bool { return tenants[i].Name < tenants[j].Name })
	if len(tenants) == 0 {
		return nil, fmt.Errorf("the policy has no tenants to submit jobs")
	}
	weights := make([]float64, len(tenants))
	for i, t := range tenants {
		weights[i] = max(t.Guaranteed.Total(), 1)
	}
	nodeGPUs := 0
	for _, n := range nodes {
		nodeGPUs = max(nodeGPUs, n.GPUs)
	}
	jobs := make([]Job, 0, g.Jobs)
	work := 0.0
	for len(jobs) < g.Jobs {
		t := tenants[pick(rng, weights)]
		burst := 1
		if rng.Float64() < 0.1 {
			burst = 2 + rng.IntN(19) // a tenant submitting a sweep at once
		}
		for b := 0; b < burst && len(jobs) < g.Jobs; b++ {
			j := shape(rng, g.Trace, p, t, nodes, nodeGPUs)
			j.ID = fmt.Sprintf("j%07d", len(jobs))
			if b > 0 {
				j.Submit = -1 // with the one before it
			}
			work += float64(j.gpus()) * j.Duration
			jobs = append(jobs, j)
		}
	}
	// Arrivals: a Poisson process whose rate follows the day (1 ± 0.5), its
	// mean set so that the work offered is Load of the cluster's GPU time.
	span := work / (g.Load * float64(GPUs(nodes)))
	groups := 0
	for _, j := range jobs {
		if j.Submit >= 0 {
			groups++
		}
	}
	rate := float64(groups) / span
	now := 0.0
	for i := range jobs {
		if jobs[i].Submit < 0 {
			jobs[i].Submit = now
			continue
		}
		for {
			now += rng.ExpFloat64() / (1.5 * rate)
			if rng.Float64()*1.5 <= 1+0.5*math.Sin(2*math.Pi*now/86400) {
				break
			}
		}
		jobs[i].Submit = math.Round(now)
	}
	return jobs, nil
}

func pick(rng *rand.Rand, weights []float64) int {
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	x := rng.Float64() * sum
	for i, w := range weights {
		if x -= w; x < 0 {
			return i
		}
	}
	return len(weights) - 1
}

// shape draws one job of tenant t: its queue, kind, size and duration.
func shape(rng *rand.Rand, trace string, p *policy.Policy, t *policy.Tenant, nodes []NodeGroup, nodeGPUs int) Job {
	// Most work is training: a queue of a dev workload gets 2 parts, of an
	// inference workload 1, any other 7.
	weights := make([]float64, len(t.Queues))
	for i, q := range t.Queues {
		switch kind := workloadKind(p, t.Namespaces[0], q); {
		case strings.Contains(kind, "dev"):
			weights[i] = 2
		case strings.Contains(kind, "inference"):
			weights[i] = 1
		default:
			weights[i] = 7
		}
	}
	j := Job{Namespace: t.Namespaces[0], Queue: t.Queues[pick(rng, weights)], Outcome: "completed"}
	// Tenants with quotas per class only must name a model of a class.
	if _, any := t.Limit[policy.AllGPUs]; !any {
		for _, n := range nodes {
			if c := p.ClassOf(n.Model); c != "" && t.Limit[c] > 0 {
				j.Model = n.Model
				break
			}
		}
	}
	switch kind := workloadKind(p, j.Namespace, j.Queue); {
	case strings.Contains(kind, "dev"):
		j.GPUs, j.Duration, j.Idle = 1, 3600*(1+9*rng.Float64()), rng.Float64() < 0.5
		return j
	case strings.Contains(kind, "inference"):
		j.GPUs, j.Duration = 1+rng.IntN(2), 86400*(1+2*rng.Float64())
		return j
	}
	j.Checkpoint = 3600
	switch trace {
	case Philly:
		j.GPUs = []int{1, 2, 4, 8}[pick(rng, []float64{70, 10, 15, 5})]
		if rng.Float64() < 0.8 {
			j.Duration = logUniform(rng, 32*60, 16.7*3600)
		} else {
			j.Duration = logUniform(rng, 16.7*3600, 6.9*86400)
		}
	case Helios:
		j.GPUs = []int{1, 2, 4, 8, 16, 32}[pick(rng, []float64{56, 12, 12, 14, 4, 2})]
		j.Duration = math.Max(10, 206*math.Exp(2.2*rng.NormFloat64()))
		switch x := rng.Float64(); {
		case x < 0.15:
			j.Outcome = "failed"
		case x < 0.37:
			j.Outcome = "cancelled"
		}
	}
	if j.GPUs > nodeGPUs { // a multi-node job: one allocation per node
		j.Count, j.GPUs = (j.GPUs+nodeGPUs-1)/nodeGPUs, nodeGPUs
	}
	j.Duration = math.Round(j.Duration)
	return j
}

// workloadKind is the name of the queue's workload, or the queue's.
func workloadKind(p *policy.Policy, namespace, queue string) string {
	if w := p.WorkloadFor(namespace, queue); w != nil {
		return w.Name
	}
	return queue
}

func logUniform(rng *rand.Rand, lo, hi float64) float64 {
	return math.Exp(math.Log(lo) + rng.Float64()*(math.Log(hi)-math.Log(lo)))
}
