package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/approval"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
)

const approvalUsage = `usage: gpu-broker approval request -job ID -namespace NS -reason "..." (-priority N | -extra-gpus N) -for 4h
       gpu-broker approval grant ID | deny ID | show ID | list
  (each with -address, -token, -ca-cert, -json and -wide as the other commands)
`

// approvalCmd asks for, decides on and lists approvals.
// Long: a switch over the subcommands, one short case each.
func approvalCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, approvalUsage)
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("approval "+sub, flag.ContinueOnError)
	addr := fs.String("address", envOr("GPU_BROKER_ADDR", "http://127.0.0.1:4649"), "broker address")
	asJSON := fs.Bool("json", false, "print JSON")
	token := fs.String("token", os.Getenv("NOMAD_TOKEN"), "Nomad ACL token (default: NOMAD_TOKEN)")
	caCert := fs.String("ca-cert", os.Getenv("GPU_BROKER_CACERT"), "CA certificate to trust when the broker serves TLS")
	wide := fs.Bool("wide", false, wideUsage)
	req := gpuapi.ApprovalRequest{}
	if sub == "request" {
		fs.StringVar(&req.Job, "job", "", "the job's id")
		fs.StringVar(&req.Namespace, "namespace", envOr("NOMAD_NAMESPACE", "default"), "the job's namespace")
		fs.StringVar(&req.Reason, "reason", "", "why (for the approver and the audit trail)")
		fs.IntVar(&req.Priority, "priority", 0, "run the job at this Nomad priority")
		fs.IntVar(&req.ExtraGPUs, "extra-gpus", 0, "let the job take this many GPUs above its tenant's limit")
		fs.StringVar(&req.For, "for", "", "how long, from the grant (at most 168h)")
	}
	// Flags may come before or after the id.
	var positional []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		positional, rest = append(positional, fs.Arg(0)), fs.Args()[1:]
	}
	method, path, wantID := http.MethodGet, "/v1/gpu/approvals", false
	var body []byte
	switch sub {
	case "list":
	case "request":
		method = http.MethodPost
		body, _ = json.Marshal(req)
	case "show":
		wantID = true
	case "grant", "deny":
		method, wantID = http.MethodPost, true
	default:
		fmt.Fprint(os.Stderr, approvalUsage)
		return 2
	}
	if wantID != (len(positional) == 1) || (!wantID && len(positional) > 0) {
		fmt.Fprint(os.Stderr, approvalUsage)
		return 2
	}
	if wantID {
		path += "/" + url.PathEscape(positional[0])
		if sub != "show" {
			path += "/" + sub
		}
	}
	out, ok := fetch(*caCert, *addr, method, path, *token, body, *asJSON)
	if !ok || *asJSON {
		return exit(ok)
	}
	var list []approval.Approval
	if sub == "list" {
		if err := json.Unmarshal(out, &list); err != nil {
			return fail(err)
		}
	} else {
		var a approval.Approval
		if err := json.Unmarshal(out, &a); err != nil {
			return fail(err)
		}
		list = []approval.Approval{a}
	}
	t := newTable("ID", "STATE", "NAMESPACE", "JOB", "ASKS", "FOR", "REQUESTED BY", "DECIDED BY", "EXPIRES", "REASON")
	for _, a := range list {
		asks := fmt.Sprintf("priority %d", a.Priority)
		if a.ExtraGPUs > 0 {
			asks = fmt.Sprintf("+%d GPUs", a.ExtraGPUs)
		}
		expires := "-"
		if !a.ExpiresAt.IsZero() {
			expires = a.ExpiresAt.Format(time.RFC3339)
		}
		t.row(a.ID, a.State, a.Namespace, a.Job, asks, a.For, a.RequestedBy, a.DecidedBy, expires, a.Reason)
	}
	t.print(os.Stdout, outputWidth(*wide))
	return 0
}
