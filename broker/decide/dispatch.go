package decide

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
)

// Dispatching is a cluster over several regions, among which a job that
// leaves its region to the broker is placed in one (cluster.Regions).
type Dispatching interface {
	Regional
	// Names are the regions governed as Nomad names them, the broker's own
	// first.
	Names() []string
	// EachUsage hands f each of n jobs of namespace with the usage it sees
	// in its region (UsageFor), until f returns false. job(i) is the job
	// as a region would decide on it, built only when reached (false: that
	// region cannot take it).
	EachUsage(p *policy.Policy, namespace string, n int, job func(i int) (admission.Job, bool), f func(i int, j admission.Job, u admission.Usage) bool)
	// Drained says who drained region and when ("": it takes new work).
	Drained(region string) string
	// Free is how many free GPUs j's allocations could take in its region,
	// node by node (admission.FreeFor): what best_fit ranks regions by.
	Free(j admission.Job) int
	// Unreachable is since when following region has failed (zero while
	// it is followed): no job is sent there meanwhile.
	Unreachable(region string) (time.Time, string)
}

// dispatch chooses the one region of a job that leaves it to the broker
// (meta nomad-gpu.region = "auto", or its queue's region = "auto"). A
// running job stays in the region it runs in. Otherwise it goes to a region
// whose decision admits it now, never a drained one. With ordered, that is
// the first in the policy's order with the job's GPUs idle, else the first;
// a later region only once the job has waited spill_after for each one
// before it that could take it. With best_fit, it is the one with the most
// free GPUs its allocations could take, node by node. Failing those, it queues
// in the first region where it may wait for GPUs or for a drained region
// to resume, and each queue pass chooses again. A job no region can take
// is the job's error, with each region's reason. note is what the answer
// and the audit trail say of the choice.
func (s *Sequence) dispatch(p *policy.Policy, req *nomadjob.Request) (region, note string, err error) {
	r, ok := s.Cluster.(Dispatching)
	if !ok {
		return req.Region, "", nil // one region: nothing to choose
	}
	names := ordered(p.Dispatch.Order, r.Names())
	for _, name := range names {
		if v, _, _ := r.In(name); v.Running(req.Namespace, req.JobID) {
			return name, fmt.Sprintf("region %s, where the job runs", name), nil
		}
	}
	how := p.DispatchFor(req.Namespace, req.Job.Meta[nomadjob.MetaQueue])
	mode := how.Mode
	var waited time.Duration
	if !req.QueuedAt.IsZero() {
		waited = s.Clock.Now().Sub(req.QueuedAt)
	}
	in, why, drained := candidates(r, names)
	var (
		chosen, waits string
		queues        = map[string]bool{} // regions where it may wait
		before        time.Duration       // ordered: spill_after for each region before this one that could take it
		full          [][2]string         // ordered: regions that admit the job but have too few GPUs idle for it now, and why
	)
	js := &regionJobs{r: r, req: req, built: map[string]*admission.Job{}}
	job := func(i int) (admission.Job, bool) { return js.at(in[i]) }
	if mode == policy.DispatchBestFit {
		in = byFree(r, in, job)
	}
	r.EachUsage(p, req.Namespace, len(in), job, func(i int, j admission.Job, u admission.Usage) bool {
		name := in[i]
		d := s.Enricher.Decide(p, j, u)
		need := before
		if d.Outcome != admission.Reject {
			before += how.SpillAfter
		}
		switch d.Outcome {
		case admission.Admit, admission.AdmitBorrowed:
			if mode == policy.DispatchOrdered && waited < need {
				why = append(why, fmt.Sprintf("%s: admits it once it has waited %s for the regions before it (spill_after %s)", name, need, how.SpillAfter))
				return true
			}
			if mode == policy.DispatchBestFit {
				chosen = name
				return false // the most free GPUs of those that admit it: they come in that order (byFree)
			}
			idle := idleFor(u, d.Demand)
			if idle+1e-9 >= d.Demand.Total() {
				chosen = name
				return false // ordered: the first that admits it where its GPUs are idle
			}
			// Admitted within a guarantee, it would preempt, or wait in
			// Nomad: only where no region has its GPUs idle.
			full = append(full, [2]string{name, fmt.Sprintf("%s: admits it, but %g of its %g GPUs are idle there", name, idle, d.Demand.Total())})
			return true
		case admission.Queue:
			queues[name] = true
			why = append(why, fmt.Sprintf("%s: %s", name, d.Reason))
		default:
			why = append(why, fmt.Sprintf("%s: %s", name, d.Reason))
		}
		return true
	})
	for _, f := range full {
		if chosen == "" {
			chosen = f[0] // the first that admits it: preemption aims at one region
		} else if f[0] != chosen {
			why = append(why, f[1])
		}
	}
	waits = drained
	if i := slices.IndexFunc(names, func(n string) bool { return queues[n] }); i >= 0 {
		waits = names[i]
	}
	return told(chosen, waits, mode, append(why, js.why...))
}

// told is dispatch's answer: the region chosen, else the one to wait in,
// else the job's error; why says why each other region was not chosen.
func told(chosen, waits, mode string, why []string) (region, note string, err error) {
	switch {
	case chosen != "" && len(why) == 0:
		return chosen, fmt.Sprintf("region %s (dispatch %s)", chosen, mode), nil
	case chosen != "":
		return chosen, fmt.Sprintf("region %s (dispatch %s; not %s)", chosen, mode, strings.Join(why, "; ")), nil
	case waits != "":
		return waits, fmt.Sprintf("region %s to wait in (dispatch %s; no region admits it now: %s)", waits, mode, strings.Join(why, "; ")), nil
	}
	return "", "", &JobError{fmt.Errorf("no region this broker governs can take it: %s", strings.Join(why, "; "))}
}

// candidates are the regions of names that may take new work; why says why
// each other region may not, and drained is the first drained region, one to
// wait in if no other takes the job.
func candidates(r Dispatching, names []string) (in, why []string, drained string) {
	for _, name := range names {
		if since, err := r.Unreachable(name); !since.IsZero() {
			why = append(why, fmt.Sprintf("%s: unreachable since %s (%s)", name, since.UTC().Format(time.RFC3339), err))
			continue
		}
		if by := r.Drained(name); by != "" {
			why = append(why, fmt.Sprintf("%s: drained (%s)", name, by))
			if drained == "" {
				drained = name
			}
			continue
		}
		in = append(in, name)
	}
	return in, why, drained
}

// regionJobs are the job as each region decides on it, built once per
// region (best_fit ranks regions by it before deciding) and shared among
// regions while its groups do not count a region's nodes. why says which
// regions it could not be read for.
type regionJobs struct {
	r     Dispatching
	req   *nomadjob.Request
	built map[string]*admission.Job // nil: not readable there
	same  *admission.Job            // the job in any region, while its groups did not count a region's nodes
	why   []string
}

func (js *regionJobs) at(region string) (admission.Job, bool) {
	if j, ok := js.built[region]; ok {
		if j == nil {
			return admission.Job{}, false
		}
		return *j, true
	}
	j, perRegion, err := regionJob(js.r, js.req, region, js.same)
	if err != nil {
		js.why, js.built[region] = append(js.why, fmt.Sprintf("%s: %v", region, err)), nil
		return j, false
	}
	if js.built[region] = &j; !perRegion {
		js.same = &j
	}
	return j, true
}

// regionJob is the job as region would decide on it: its groups on that
// region's nodes, or same's (the job as another region decides on it) when
// its groups do not count nodes (only a system job's do). perRegion says
// whether they did.
func regionJob(r Dispatching, req *nomadjob.Request, region string, same *admission.Job) (j admission.Job, perRegion bool, err error) {
	v, key, _ := r.In(region)
	if same != nil {
		j = *same
		j.Where.Region = key
		return j, false, nil
	}
	counted := func(model string, gpus int) int {
		perRegion = true
		return v.NodesFitting(model, gpus)
	}
	groups, err := nomadjob.Groups(req.Job, nomadjob.Placement{PreserveCounts: req.PreserveCounts, NodesFitting: counted})
	if err != nil {
		return admission.Job{}, perRegion, err
	}
	j = nomadjob.AdmissionJob(req.Job, req.Namespace, groups)
	j.ID, j.Where.Region = req.JobID, key
	return j, perRegion, nil
}

// byFree are the regions in, ordered by the free GPUs the job's
// allocations could take in each, node by node (Dispatching.Free): the
// most first, in their order where equal. best_fit decides on them in that order and takes the
// first that admits the job, deciding on no more regions than it must. A
// region the job cannot be read for is left out (job says why).
func byFree(r Dispatching, in []string, job func(i int) (admission.Job, bool)) []string {
	type ranked struct {
		name string
		free int
	}
	out := make([]ranked, 0, len(in))
	for i, name := range in {
		if j, ok := job(i); ok {
			out = append(out, ranked{name, r.Free(j)})
		}
	}
	slices.SortStableFunc(out, func(a, b ranked) int { return b.free - a.free })
	names := make([]string, len(out))
	for i, o := range out {
		names[i] = o.name
	}
	return names
}

// ordered are the regions governed (names, the broker's own first) in the
// policy's dispatch_order, those it leaves out after in their own order; a
// name in order the broker does not govern is passed over.
func ordered(order, names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range order {
		if slices.Contains(names, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// idleFor is how many GPUs of demand's classes are idle in u: the fewest of
// any class it asks for, its total when it names none.
func idleFor(u admission.Usage, demand policy.Quota) float64 {
	idle := u.Idle[policy.AllGPUs]
	for class := range demand {
		if class != policy.AllGPUs {
			idle = min(idle, u.Idle[class])
		}
	}
	return idle
}
