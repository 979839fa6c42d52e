package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/broker/sim"
)

const simulateUsage = `usage: gpu-broker simulate -policy DIR [-trace FILE | -workload philly|helios -jobs N -load X -seed N]
                          [-nodes COUNTxGPUS:MODEL,...] [-modes nomad-alone,strict-quotas,nomad-gpu]
                          [-svg FILE] [-write-trace FILE] [-json] [-pass-interval 10s] [-reclaim-period 30s]
                          [-nomad-model nomad|ideal] [-start-latency 0s] [-proportional-asks]
       gpu-broker simulate -compare POLICY_A POLICY_B [options as above]

Replays a workload in simulated time three ways on the same jobs: Nomad alone (priority
order, no quotas), strict quotas (limit = guarantee, no borrowing) and nomad-gpu (the policy
as written), through the broker's own admission, queue order and reclaim rules. Nomad is
modelled as v1.6.3's scheduler places and preempts (-nomad-model nomad), or idealised: best
fit over every node, the fewest GPUs preempted (-nomad-model ideal). Each job asks CPU and
memory between a quarter and four times its GPUs' share of a node, which Nomad's bin-packing
scores (-proportional-asks: exactly its share).

With -compare, the same workload (generated under POLICY_A) is replayed under each of two
policy directories, side by side: what a policy change does before it is merged. The modes
default to nomad-gpu alone there.
`

// simulate is `gpu-broker simulate`.
// Long: one flag set and its checks, read top to bottom as the usage text lists them.
func simulate(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, simulateUsage); fs.PrintDefaults() }
	var (
		policyDir     = fs.String("policy", "", "policy directory (required without -compare)")
		compare       = fs.Bool("compare", false, "replay under the two policy directories given as arguments, side by side")
		tracePath     = fs.String("trace", "", "JSON-lines trace to replay (instead of a generated workload)")
		workload      = fs.String("workload", sim.Philly, "generated workload: philly or helios")
		jobs          = fs.Int("jobs", 10000, "generated jobs")
		load          = fs.Float64("load", 0.9, "generated GPU work as a share of the cluster's GPU time")
		seed          = fs.Uint64("seed", 1, "generator seed")
		nodes         = fs.String("nodes", "4x8:NVIDIA H100 80GB HBM3", "the simulated cluster: COUNTxGPUS:MODEL, comma-separated")
		modes         = fs.String("modes", "nomad-alone,strict-quotas,nomad-gpu", "modes to compare")
		svgPath       = fs.String("svg", "", "write a chart of allocation and waiting jobs over time to FILE")
		writeTrace    = fs.String("write-trace", "", "write the workload replayed as a trace to FILE")
		asJSON        = fs.Bool("json", false, "print the results as JSON")
		passInterval  = fs.Duration("pass-interval", sim.DefaultPassInterval, "queue passes set off within this are made once")
		reclaimPeriod = fs.Duration("reclaim-period", 0, "how often the leader's reclaim passes run (default: the policy's reclaim_settings period)")
		startLatency  = fs.Duration("start-latency", 0, "how long an allocation holds its GPUs before its task starts")
		nomadModel    = fs.String("nomad-model", sim.ModelNomad, "how the simulated Nomad places and preempts: nomad (v1.6.3's scheduler) or ideal")
		proportional  = fs.Bool("proportional-asks", false, "each job asks CPU and memory in proportion to its GPUs (Nomad's bin-packing then packs GPUs)")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dirs := []string{*policyDir}
	if *compare {
		// The two directories, then any options after them.
		if fs.NArg() < 2 || *policyDir != "" {
			fs.Usage()
			return 2
		}
		dirs = fs.Args()[:2]
		if err := fs.Parse(fs.Args()[2:]); err != nil {
			return 2
		}
		modesSet := false
		fs.Visit(func(f *flag.Flag) { modesSet = modesSet || f.Name == "modes" })
		if !modesSet {
			*modes = string(sim.NomadGPU)
		}
	}
	if dirs[0] == "" || fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "gpu-broker simulate:", err)
		return 1
	}
	cluster, err := sim.ParseNodes(*nodes)
	if err != nil {
		return fail(err)
	}
	var pols []*policy.Policy
	for _, dir := range dirs {
		p, diags := policyhcl.LoadDir(dir, sim.GPUs(cluster))
		fmt.Fprint(os.Stderr, policyhcl.FormatDiagnostics(diags))
		if p == nil {
			return 1
		}
		pols = append(pols, p)
	}
	p := pols[0]
	var ms []sim.Mode
	for _, m := range strings.Split(*modes, ",") {
		mode := sim.Mode(strings.TrimSpace(m))
		if mode != sim.NomadAlone && mode != sim.StrictQuotas && mode != sim.NomadGPU {
			return fail(fmt.Errorf("mode %q: want nomad-alone, strict-quotas or nomad-gpu", m))
		}
		ms = append(ms, mode)
	}
	var work []sim.Job
	if *tracePath != "" {
		f, err := os.Open(*tracePath)
		if err != nil {
			return fail(err)
		}
		work, err = sim.ReadTrace(f, *tracePath)
		f.Close()
		if err != nil {
			return fail(err)
		}
	} else if work, err = sim.Generate(p, cluster, sim.Generator{Trace: *workload, Jobs: *jobs, Seed: *seed, Load: *load}); err != nil {
		return fail(err)
	}
	if *writeTrace != "" {
		if err := writeFile(*writeTrace, func(w io.Writer) error { return sim.WriteTrace(w, work) }); err != nil {
			return fail(err)
		}
	}
	// The runs share nothing but the (read-only) policies and jobs.
	results := make([]*sim.Result, len(ms)*len(pols))
	errs := make([]error, len(results))
	var wg sync.WaitGroup
	for k, pol := range pols {
		for i, m := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := sim.Run(work, sim.Options{Policy: pol, Nodes: cluster, Mode: m,
					PassInterval: *passInterval, ReclaimPeriod: *reclaimPeriod, NomadModel: *nomadModel, Seed: *seed, StartLatency: *startLatency,
					ProportionalAsks: *proportional})
				if r != nil && *compare {
					r.Label = dirs[k] + " " + string(m)
				}
				results[k*len(ms)+i], errs[k*len(ms)+i] = r, err
			}()
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fail(err)
		}
	}
	if *svgPath != "" {
		if err := writeFile(*svgPath, func(w io.Writer) error { return sim.WriteSVG(w, results) }); err != nil {
			return fail(err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "%d jobs on %d GPUs (%s), Nomad model %s\n\n", len(work), sim.GPUs(cluster), *nodes, *nomadModel)
	if err := sim.WriteReport(stdout, results); err != nil {
		return fail(err)
	}
	return 0
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
