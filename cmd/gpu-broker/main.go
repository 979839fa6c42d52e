// Command gpu-broker sits in front of Nomad's HTTP API and admits, queues or
// rejects GPU jobs by policy; its subcommands inspect a running broker.
package main

import (
	"fmt"
	"os"

	"github.com/nomad-gpu/nomad-gpu/internal/version"
)

const usage = `Usage: gpu-broker <command> [options]

Commands:
  serve -config broker.hcl       run the broker
  config validate FILE           check a broker configuration as serve reads it (errors at file:line); starts nothing
  policy validate DIR            check a policy set (-capacity N to check guarantees against N GPUs)
  policy tenants [-tfvars] DIR   each tenant's namespaces and submitters; -tfvars: as JSON variables for
                                 terraform/modules/cluster-config
  policy status                  the policy a broker has in force, and whether its last reload was refused
  job check -policy DIR FILE...  check jobspecs against a policy set as admission would (-max-gpus-per-node N,
                                 -address NOMAD to parse HCL)
  simulate -policy DIR [-trace FILE | -workload philly|helios] [-nodes COUNTxGPUS:MODEL] [-svg FILE]
                                 replay a workload in simulated time: Nomad alone, strict quotas and
                                 nomad-gpu side by side (gpu-broker simulate -h for every option)
  queue list                     queued jobs in admission order
  queue show ID                  one queued job
  queue cancel ID                remove a queued job
  usage                          GPUs per tenant: used / guaranteed / limit, borrowed, queued
  usage -rightsizing [-top N]    per tenant, the N jobs (default 5) that kept under half of their GPUs busy
  usage -trace [-since 168h]     the GPU jobs of that time as a trace for simulate -trace (JSON lines)
  usage -from DAY [-to DAY] [-by tenant|queue|class] [-csv]
                                 GPU-hours allocated / busy / idle and cost, from DAY up to -to (UTC days)
  region list                    the Nomad regions the broker governs: how each is reached, its nodes and GPUs, whether drained
  region drain|resume REGION     no new work goes to REGION (its running work finishes there), or it takes work again
  reclaim list                   reclaim decisions, newest first
  reclaim show ID                one reclaim decision
  reclaim cancel ID              cancel a proposed reclaim decision
  approval request -job ID -namespace NS -reason "..." (-priority N | -extra-gpus N) -for 4h
  approval grant ID | deny ID    (an approver of the policy; never one's own request)
  approval list | show ID        approvals and their state
  version                        version, commit and Go version (also -version)
  audit [-since 24h] [-tenant T] [-job J] [-limit N] [-cursor C]
                                 the audit trail: who decided or did what, oldest first, a page at a time

The queue, usage, region, reclaim, approval, audit and policy status commands reach the broker at -address or
GPU_BROKER_ADDR (default http://127.0.0.1:4649) with -token or NOMAD_TOKEN,
trust -ca-cert or GPU_BROKER_CACERT, and print JSON with -json.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	if version.Asked(args) {
		fmt.Println(version.String("gpu-broker"))
		return 0
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "config":
		if len(args) > 1 && args[1] == "validate" {
			return validateConfig(args[2:], os.Stdout, os.Stderr)
		}
		fmt.Fprint(os.Stderr, usage)
		return 2
	case "policy":
		switch {
		case len(args) > 1 && args[1] == "validate":
			return validatePolicy(args[2:], os.Stdout, os.Stderr)
		case len(args) > 1 && args[1] == "tenants":
			return policyTenants(args[2:])
		case len(args) > 1 && args[1] == "status":
			return policyStatus(args[2:])
		}
		fmt.Fprint(os.Stderr, usage)
		return 2
	case "queue", "usage", "reclaim", "audit", "region":
		return client(args)
	case "approval":
		return approvalCmd(args[1:])
	case "simulate":
		return simulate(args[1:], os.Stdout)
	case "job":
		if len(args) < 2 || args[1] != "check" {
			fmt.Fprint(os.Stderr, jobCheckUsage)
			return 2
		}
		return checkJobs(args[2:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "gpu-broker: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
