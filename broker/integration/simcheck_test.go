package integration

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/sim"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// simCheckDir holds make sim-check's trace and policy.
const simCheckDir = "../sim/testdata/sim-check"

// simCheckTolerance is how far the simulator may be from the real cluster:
// its mean allocation from the real one, and its preemptions and the
// GPU-seconds they lose (see simToReal).
const simCheckTolerance = 0.15

// simFigures are what the check compares.
type simFigures struct {
	allocation, lostGPUHours, meanWait float64
	preemptions, guaranteedVictims     float64
	// startLatency is, on the real cluster, the mean time from an
	// allocation's placement to its task's start.
	startLatency time.Duration
}

// simSeeds is how many runs the simulated figures are the mean of, each
// with its own shuffles of Nomad's node order and its own delays of the
// submissions (late). One trace of 160 jobs preempts 7 to 24 times from one
// to another (200 runs), and a real replay varies as much. Ten runs spanned
// only 10 to 23, so a real run as likely as one in ten fell outside them;
// forty span 8 to 23, and one real run in twenty does.
const simSeeds = 40

// TestSimToReal (make sim-check; make test skips it: it takes minutes)
// replays one trace on real Nomad v1.6.3 and Consul behind the broker (4
// nodes of 8 fake GPUs, mock-driver tasks that run for each job's
// duration). It plays the same trace in the simulator with the same policy
// and time scale, and compares them in mode nomad-gpu: allocation while
// work arrives, preemptions, guaranteed victims, GPU-seconds lost and mean
// wait. It runs once per placement mode (the broker pinning jobs, and
// Nomad choosing), unless the policy sets one. Its settings:
//   - SIM_CHECK_OUT names a file for the tables;
//   - SIM_CHECK_POLICY a directory of policy files to check instead of the
//     one beside the trace (a policy change measured on a real cluster
//     before it is adopted);
//   - SIM_CHECK_TIMELINE a directory, for following where a real run parts
//     from the simulated one. Each job's submission, first registration,
//     placement and start are logged, and the broker's log and audit trail
//     are written there.
func TestSimToReal(t *testing.T) {
	f, err := os.Open(filepath.Join(simCheckDir, "trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	trace, err := sim.ReadTrace(f, "trace.jsonl")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	policyDir := simCheckDir
	if dir := os.Getenv("SIM_CHECK_POLICY"); dir != "" {
		policyDir = dir
	}
	var tables strings.Builder
	defer func() {
		if out := os.Getenv("SIM_CHECK_OUT"); out != "" {
			writeFile(t, out, tables.String())
		}
	}()
	p, diags := policyhcl.LoadDir(policyDir, 32)
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	if setsPlacement(t, policyDir) {
		simToReal(t, trace, policyDir, "as the policy says", &tables)
		return
	}
	for _, mode := range []string{policy.PlaceBroker, policy.PlaceNomad} {
		t.Run("placement="+mode, func(t *testing.T) {
			dir := t.TempDir()
			entries, err := os.ReadDir(policyDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".hcl") {
					raw, err := os.ReadFile(filepath.Join(policyDir, e.Name()))
					if err != nil {
						t.Fatal(err)
					}
					writeFile(t, filepath.Join(dir, e.Name()), string(raw))
				}
			}
			writeFile(t, filepath.Join(dir, "zz-placement.hcl"), fmt.Sprintf("placement {\n  mode = %q\n}\n", mode))
			simToReal(t, trace, dir, "placement mode "+mode, &tables)
		})
	}
}

// late is trace with each job submitted up to half a second late, drawn
// from seed. The real replay's submissions are: its loop sleeps to each
// job's time, then the broker decides. A run where the broker places every
// job has no shuffle of Nomad's to vary it otherwise.
func late(trace []sim.Job, seed uint64) []sim.Job {
	rng := rand.New(rand.NewPCG(seed, 0x1a7e))
	out := slices.Clone(trace)
	for i := range out {
		out[i].Submit += rng.Float64() / 2
	}
	slices.SortStableFunc(out, func(a, b sim.Job) int { return cmp.Compare(a.Submit, b.Submit) })
	return out
}

// setsPlacement reports whether a policy directory has a placement block.
func setsPlacement(t *testing.T, dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasSuffix(e.Name(), ".hcl") && regexp.MustCompile(`(?m)^\s*placement\s*\{`).Match(raw) {
			return true
		}
	}
	return false
}

// simToReal is one comparison, under the policy in policyDir (named as
// label in its table, which it adds to tables).
// Long: the replay, the simulations and the table with its checks, read in the order the table prints.
func simToReal(t *testing.T, trace []sim.Job, policyDir, label string, tables *strings.Builder) {
	nodes := []sim.NodeGroup{{Model: "GPU", GPUs: 8, Count: 4}}
	p, diags := policyhcl.LoadDir(policyDir, sim.GPUs(nodes))
	if p == nil {
		t.Fatal(policyhcl.FormatDiagnostics(diags))
	}
	real := replay(t, trace, policyDir, slices.Sorted(maps.Keys(p.Tenants)))
	// The same trace in the simulator, with the client's start latency the
	// real cluster showed: each figure the mean over simSeeds shuffles.
	simulated := map[string]simFigures{}
	lows, highs := map[string]simFigures{}, map[string]simFigures{} // preemptions and GPU-hours lost, over the shuffles
	for _, model := range []string{sim.ModelNomad, sim.ModelIdeal} {
		var f simFigures
		lo, hi := simFigures{preemptions: math.Inf(1), lostGPUHours: math.Inf(1)}, simFigures{}
		for seed := range uint64(simSeeds) {
			res, err := sim.Run(late(trace, seed), sim.Options{Policy: p, Nodes: nodes, Mode: sim.NomadGPU, PassInterval: time.Second,
				ReclaimPeriod: time.Second, NomadModel: model, Seed: seed + 1, StartLatency: real.startLatency})
			if err != nil {
				t.Fatal(err)
			}
			f.allocation += res.Allocation / simSeeds
			f.preemptions += float64(res.Preemptions) / simSeeds
			f.guaranteedVictims += float64(res.GuaranteedVictims) / simSeeds
			f.lostGPUHours += res.LostGPUHours / simSeeds
			f.meanWait += res.Wait.Mean / simSeeds
			lo.preemptions, hi.preemptions = min(lo.preemptions, float64(res.Preemptions)), max(hi.preemptions, float64(res.Preemptions))
			lo.lostGPUHours, hi.lostGPUHours = min(lo.lostGPUHours, res.LostGPUHours), max(hi.lostGPUHours, res.LostGPUHours)
		}
		simulated[model], lows[model], highs[model] = f, lo, hi
	}

	rows := []struct {
		name string
		get  func(simFigures) float64
		unit string
		// ranged: shown with the shuffles' range, and checked against it
		ranged bool
	}{
		{"allocation while work arrives", func(f simFigures) float64 { return 100 * f.allocation }, "%", false},
		{"preemptions", func(f simFigures) float64 { return f.preemptions }, "", true},
		{"guaranteed victims", func(f simFigures) float64 { return f.guaranteedVictims }, "", false},
		{"GPU-seconds lost to preemption", func(f simFigures) float64 { return 3600 * f.lostGPUHours }, "", true},
		{"mean wait (s)", func(f simFigures) float64 { return f.meanWait }, "", false},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "| nomad-gpu, %s, %d jobs on 4 × 8 GPUs | real (Nomad v1.6.3) | simulated, Nomad model | error | simulated, ideal model | error |\n|---|---|---|---|---|---|\n", label, len(trace))
	defer func() {
		fmt.Fprintf(&table, "\nSimulated: the mean of %d runs, each with its own shuffles and submissions up to half a second late (their range in brackets), with the real cluster's start latency (placement to task start) of %s.\n\n",
			simSeeds, real.startLatency.Round(10*time.Millisecond))
		t.Logf("sim-to-real, %s:\n%s", label, table.String())
		tables.WriteString(table.String())
	}()
	relErr := func(sim, real float64) float64 {
		if real == 0 {
			if sim == 0 {
				return 0
			}
			return math.Inf(1)
		}
		return (sim - real) / real
	}
	for _, r := range rows {
		rv, nv, iv := r.get(real), r.get(simulated[sim.ModelNomad]), r.get(simulated[sim.ModelIdeal])
		nr, ir := "", ""
		if r.ranged {
			nr = fmt.Sprintf(" (%.0f–%.0f)", r.get(lows[sim.ModelNomad]), r.get(highs[sim.ModelNomad]))
			ir = fmt.Sprintf(" (%.0f–%.0f)", r.get(lows[sim.ModelIdeal]), r.get(highs[sim.ModelIdeal]))
		}
		fmt.Fprintf(&table, "| %s | %.1f%s | %.1f%s%s | %+.0f %% | %.1f%s%s | %+.0f %% |\n", r.name, rv, r.unit, nv, r.unit, nr,
			100*relErr(nv, rv), iv, r.unit, ir, 100*relErr(iv, rv))
	}
	nomad := simulated[sim.ModelNomad]
	if e := relErr(nomad.allocation, real.allocation); math.Abs(e) > simCheckTolerance {
		t.Errorf("allocation: simulated %.1f %%, real %.1f %%: off by %.0f %%", 100*nomad.allocation, 100*real.allocation, 100*e)
	}
	// Preemptions and the work they lose: within the tolerance of the
	// shuffles' mean. One replay of 160 jobs varies from run to run as much
	// as one shuffle from another: three real runs with the broker placing
	// preempted 8, 20 and 8 times. So a real figure within the shuffles'
	// range widened by the tolerance passes too.
	for _, r := range rows {
		if !r.ranged {
			continue
		}
		rv, mean := r.get(real), r.get(nomad)
		lo, hi := r.get(lows[sim.ModelNomad])*(1-simCheckTolerance), r.get(highs[sim.ModelNomad])*(1+simCheckTolerance)
		if e := relErr(mean, rv); math.Abs(e) > simCheckTolerance && (rv < lo || rv > hi) {
			t.Errorf("%s: real %.1f, simulated %.1f (off by %.0f %%), %.1f to %.1f over %d shuffles (allowed %.1f to %.1f)", r.name, rv, mean,
				100*e, r.get(lows[sim.ModelNomad]), r.get(highs[sim.ModelNomad]), simSeeds, lo, hi)
		}
	}
}

// preemptor names the job of the allocation that preempted another: a
// tenant's own work evicting its own shows as such.
func preemptor(n *testcluster.Nomad, allocID string) string {
	a, _, err := n.API.Allocations().Info(allocID, nil)
	if err != nil {
		return allocID[:8]
	}
	return fmt.Sprintf("%s/%s (priority %d)", a.Namespace, a.JobID, *a.Job.Priority)
}

// replay submits trace through a broker in front of a real cluster of 4
// nodes of 8 fake GPUs, each job at its time, waits until every job has
// completed, and measures what happened.
func replay(t *testing.T, trace []sim.Job, policyDir string, namespaces []string) simFigures {
	consul := testcluster.StartConsul(t)
	n := startGPUCluster(t, "simcheck", 4, 8, namespaces...)
	broker := testcluster.StartBroker(t, n, consul, policyDir)
	testcluster.WaitFor(t, 60*time.Second, "the broker's view of 32 GPUs and Nomad's batch preemption", func() error {
		if cfg, _, err := n.API.Operator().SchedulerGetConfiguration(nil); err != nil || !cfg.SchedulerConfig.PreemptionConfig.BatchSchedulerEnabled {
			return fmt.Errorf("batch preemption not switched on yet (%v)", err)
		}
		total := 0.0
		for series, v := range broker.Scrape() {
			if strings.HasPrefix(series, "nomadgpu_gpus{") && strings.Contains(series, `state="total"`) {
				total += v
			}
		}
		if total != 32 {
			return fmt.Errorf("the broker sees %g GPUs", total)
		}
		return nil
	})

	gpus := map[string]int{} // by namespace/job
	for _, j := range trace {
		gpus[j.Tenant+"/"+j.ID] = j.GPUs
	}
	start := time.Now().Add(2 * time.Second)
	first, last := start.Add(time.Duration(trace[0].Submit*float64(time.Second))), start.Add(time.Duration(trace[len(trace)-1].Submit*float64(time.Second)))

	// The sampler integrates the GPUs Nomad's allocations hold (placed and
	// not stopped) over the window in which work arrives.
	var (
		mu        sync.Mutex
		gpuSecs   float64
		lastAt    = first
		lastHeld  int
		stop      = make(chan struct{})
		sampled   = make(chan struct{})
		allNS     = &api.QueryOptions{Namespace: "*"}
		submitErr error
	)
	go func() {
		defer close(sampled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			stubs, _, err := n.API.Allocations().List(allNS)
			if err != nil {
				continue
			}
			held := 0
			for _, a := range stubs {
				if a.DesiredStatus == api.AllocDesiredStatusRun && (a.ClientStatus == api.AllocClientStatusPending || a.ClientStatus == api.AllocClientStatusRunning) {
					held += gpus[a.Namespace+"/"+a.JobID]
				}
			}
			now := time.Now()
			mu.Lock()
			if from, to := maxTime(lastAt, first), minTime(now, last); to.After(from) {
				gpuSecs += float64(lastHeld) * to.Sub(from).Seconds()
			}
			lastAt, lastHeld = now, held
			mu.Unlock()
		}
	}()
	for _, j := range trace {
		time.Sleep(time.Until(start.Add(time.Duration(j.Submit * float64(time.Second)))))
		spec := job(j.Tenant, j.ID, api.JobTypeBatch).group("g", ptr(1), nil, task(dev("nvidia/gpu", uint64(j.GPUs))))
		spec.j.Meta = map[string]string{"nomad-gpu.queue": j.Queue}
		spec.j.TaskGroups[0].Tasks[0].Config = map[string]any{"run_for": fmt.Sprintf("%.1fs", j.Duration)}
		if status, out := send(t, broker.Addr, http.MethodPut, "/v1/jobs", spec.body(nil, canonical)); status != http.StatusOK {
			submitErr = fmt.Errorf("submit %s: %d %s", j.ID, status, out)
			break
		}
	}
	if submitErr != nil {
		t.Fatal(submitErr)
	}
	var stubs []*api.AllocationListStub
	testcluster.WaitFor(t, 20*time.Minute, "every job completed", func() error {
		var err error
		if stubs, _, err = n.API.Allocations().List(allNS); err != nil {
			return err
		}
		done := map[string]bool{}
		for _, a := range stubs {
			if a.ClientStatus == api.AllocClientStatusComplete && a.DesiredStatus == api.AllocDesiredStatusRun {
				done[a.Namespace+"/"+a.JobID] = true
			}
		}
		if len(done) < len(trace) {
			return fmt.Errorf("%d of %d jobs completed", len(done), len(trace))
		}
		return nil
	})
	close(stop)
	<-sampled
	if dir := os.Getenv("SIM_CHECK_TIMELINE"); dir != "" {
		// The broker's log and audit trail beside the timeline, to follow
		// where the real run parts from the simulated one; a directory per
		// placement mode.
		dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "-"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		audit, _ := os.ReadFile(broker.AuditPath())
		writeFile(t, filepath.Join(dir, "broker.log"), broker.Log())
		writeFile(t, filepath.Join(dir, "audit.log"), string(audit))
	}

	var f simFigures
	mu.Lock()
	f.allocation = gpuSecs / (32 * last.Sub(first).Seconds())
	mu.Unlock()
	firstStart, firstPlaced := map[string]time.Time{}, map[string]time.Time{}
	var latency time.Duration
	started := 0
	for _, a := range stubs {
		key := a.Namespace + "/" + a.JobID
		ts := a.TaskStates["t0"]
		ran := ts != nil && !ts.StartedAt.IsZero()
		if p, ok := firstPlaced[key]; !ok || time.Unix(0, a.CreateTime).Before(p) {
			firstPlaced[key] = time.Unix(0, a.CreateTime)
		}
		if ran {
			if s, ok := firstStart[key]; !ok || ts.StartedAt.Before(s) {
				firstStart[key] = ts.StartedAt
			}
			latency += ts.StartedAt.Sub(time.Unix(0, a.CreateTime))
			started++
		}
		if a.DesiredStatus != api.AllocDesiredStatusEvict {
			continue
		}
		full, _, err := n.API.Allocations().Info(a.ID, nil)
		if err != nil || full.PreemptedByAllocation == "" {
			continue
		}
		// An allocation evicted before its task started is a preemption too,
		// as the simulator counts it (its job is requeued and backs off
		// alike); it loses no work.
		f.preemptions++
		borrowed := full.Job != nil && full.Job.Meta["nomad-gpu.borrowed"] == "true"
		if !borrowed {
			f.guaranteedVictims++
		}
		if !ran {
			t.Logf("preempted before its task started: %s (%d GPUs, priority %d, borrowed %t), on %s, by %s", key, gpus[key],
				*full.Job.Priority, borrowed, a.NodeName, preemptor(n, full.PreemptedByAllocation))
			continue
		}
		end := ts.FinishedAt
		if end.IsZero() {
			end = time.Unix(0, a.ModifyTime)
		}
		f.lostGPUHours += end.Sub(ts.StartedAt).Hours() * float64(gpus[key])
		t.Logf("preempted at %5.1fs: %s (%d GPUs, priority %d, borrowed %t) after %.1fs, on %s, by %s", end.Sub(start).Seconds(), key, gpus[key],
			*full.Job.Priority, borrowed, end.Sub(ts.StartedAt).Seconds(), a.NodeName, preemptor(n, full.PreemptedByAllocation))
	}
	if started > 0 {
		f.startLatency = latency / time.Duration(started)
	}
	for _, j := range trace {
		s, ok := firstStart[j.Tenant+"/"+j.ID]
		if !ok {
			t.Errorf("%s never started", j.ID)
			continue
		}
		f.meanWait += s.Sub(start.Add(time.Duration(j.Submit*float64(time.Second)))).Seconds() / float64(len(trace))
		if os.Getenv("SIM_CHECK_TIMELINE") != "" {
			// When Nomad first had the job: the broker's first admission of it.
			registered := math.Inf(1)
			if versions, _, _, err := n.API.Jobs().Versions(j.ID, false, &api.QueryOptions{Namespace: j.Tenant}); err == nil {
				for _, v := range versions {
					registered = math.Min(registered, time.Unix(0, *v.SubmitTime).Sub(start).Seconds())
				}
			}
			t.Logf("timeline %s/%s: submitted %6.1fs, first registered %6.1fs, first placed %6.1fs, first started %6.1fs", j.Tenant, j.ID, j.Submit, registered,
				firstPlaced[j.Tenant+"/"+j.ID].Sub(start).Seconds(), s.Sub(start).Seconds())
		}
	}
	return f
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
