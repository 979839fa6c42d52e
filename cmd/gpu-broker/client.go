package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
	"github.com/nomad-gpu/nomad-gpu/broker/cluster"
	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	gpuusage "github.com/nomad-gpu/nomad-gpu/broker/usage"
)

// client runs the queue and usage commands against a broker's /v1/gpu API.
// Long: a switch over the subcommands, one short case each.
func client(args []string) int {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	addr := fs.String("address", envOr("GPU_BROKER_ADDR", "http://127.0.0.1:4649"), "broker address")
	asJSON := fs.Bool("json", false, "print JSON")
	token := fs.String("token", os.Getenv("NOMAD_TOKEN"), "Nomad ACL token (default: NOMAD_TOKEN)")
	caCert := fs.String("ca-cert", os.Getenv("GPU_BROKER_CACERT"), "CA certificate to trust when the broker serves TLS")
	wide := fs.Bool("wide", false, wideUsage)
	var rightSizing, asCSV, trace *bool
	var top *int
	var from, to, by, region *string
	if args[0] == "usage" {
		rightSizing = fs.Bool("rightsizing", false, "list each tenant's jobs that kept under half of their GPUs busy")
		top = fs.Int("top", gpuapi.DefaultRightSizingTop, "with -rightsizing: jobs per tenant (0: all)")
		from = fs.String("from", "", "GPU-hours and cost from this day (YYYY-MM-DD, UTC)")
		to = fs.String("to", "", "with -from: up to, not including, this day (default: through today)")
		by = fs.String("by", "tenant", "with -from: tenant, queue, class or region")
		region = fs.String("region", "", "with -from: the GPU time of this Nomad region alone (a broker governing several)")
		asCSV = fs.Bool("csv", false, "with -from: print CSV")
		trace = fs.Bool("trace", false, "the GPU jobs of the last -since as a trace for gpu-broker simulate -trace (JSON lines)")
	}
	var since, tenant, jobID, cursor *string
	var limit *int
	switch args[0] {
	case "usage":
		since = fs.String("since", "168h", "with -trace: jobs of this long back")
	case "audit":
		since = fs.String("since", "24h", "events of this long back")
		tenant = fs.String("tenant", "", "only this tenant's events")
		jobID = fs.String("job", "", "only this job's events")
		limit = fs.Int("limit", 1000, "at most this many events (the broker's most: 10000); the next page's -cursor is printed on stderr")
		cursor = fs.String("cursor", "", "the page that starts at this cursor (printed by the page before), instead of -since")
	}
	rest := args[1:]
	sub := ""
	if args[0] != "usage" && args[0] != "audit" {
		if len(rest) == 0 {
			fmt.Fprintf(os.Stderr, "usage: gpu-broker %s list|show ID|cancel ID [-address ADDR] [-json]\n", args[0])
			return 2
		}
		sub, rest = rest[0], rest[1:]
	}
	// Flags may come before or after the id, as the usage line shows them.
	var positional []string
	for {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		positional, rest = append(positional, fs.Arg(0)), fs.Args()[1:]
	}
	if (sub == "" || sub == "list") && len(positional) > 0 {
		fmt.Fprintf(os.Stderr, "gpu-broker %s: unexpected argument %q\n", strings.TrimSpace(args[0]+" "+sub), positional[0])
		return 2
	}
	method, path := http.MethodGet, "/v1/gpu/usage"
	switch sub {
	case "":
		switch {
		case args[0] == "audit":
			q := url.Values{"since": {*since}, "tenant": {*tenant}, "job": {*jobID}, "limit": {strconv.Itoa(*limit)}}
			if *cursor != "" {
				q.Set("cursor", *cursor)
			}
			sub, path = "audit", "/v1/gpu/audit?"+q.Encode()
		case *rightSizing:
			sub, path = "rightsizing", "/v1/gpu/rightsizing?top="+strconv.Itoa(*top)
		case *trace:
			sub, path = "trace", "/v1/gpu/trace?"+url.Values{"since": {*since}}.Encode()
		case *from != "":
			sub, path = "report", "/v1/gpu/usage?"+url.Values{"from": {*from}, "to": {*to}, "by": {*by}, "region": {*region}}.Encode()
		}
	case "list":
		path = "/v1/gpu/" + args[0]
		if args[0] == "region" {
			path = "/v1/gpu/regions"
		}
	case "drain", "resume":
		if args[0] != "region" || len(positional) != 1 {
			fmt.Fprintf(os.Stderr, "usage: gpu-broker region %s REGION\n", sub)
			return 2
		}
		method, path = http.MethodPut, "/v1/gpu/regions/"+url.PathEscape(positional[0])+"/"+sub
	case "show", "cancel":
		if args[0] == "region" {
			fmt.Fprintf(os.Stderr, "gpu-broker region: unknown subcommand %q (region list|drain REGION|resume REGION)\n", sub)
			return 2
		}
		if len(positional) != 1 {
			fmt.Fprintf(os.Stderr, "usage: gpu-broker %s %s ID\n", args[0], sub)
			return 2
		}
		path = "/v1/gpu/" + args[0] + "/" + url.PathEscape(positional[0])
		if sub == "cancel" {
			method = http.MethodDelete
		}
	default:
		fmt.Fprintf(os.Stderr, "gpu-broker %s: unknown subcommand %q\n", args[0], sub)
		return 2
	}
	body, ok := fetch(*caCert, *addr, method, path, *token, nil, *asJSON)
	if !ok || *asJSON {
		return exit(ok)
	}
	width := outputWidth(*wide)
	switch args[0] {
	case "reclaim":
		return printDecisions(sub, body, width)
	case "region":
		return printRegions(body, width)
	}
	switch sub {
	case "trace":
		os.Stdout.Write(body)
		return 0
	case "report":
		return printReport(body, *asCSV, width)
	case "audit":
		return printAudit(body, width)
	}
	return printTable(sub, body, width)
}

// printDecisions prints reclaim decisions: a table, or one decision whole.
func printDecisions(sub string, body []byte, width int) int {
	if sub == "list" {
		var rows []reclaim.Record
		if err := json.Unmarshal(body, &rows); err != nil {
			return fail(err)
		}
		t := newTable("ID", "RULE", "ACTION", "STATE", "NAMESPACE", "JOB", "GPUS", "PROPOSED", "ACT AFTER")
		for _, r := range rows {
			t.row(r.ID, r.Rule, string(r.Action), string(r.State), r.Namespace, r.Job, strconv.Itoa(r.GPUs),
				r.ProposedAt.Format(time.RFC3339), r.ActAfter.Format(time.RFC3339))
		}
		t.print(os.Stdout, width)
		return 0
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	defer w.Flush()
	var r reclaim.Record
	if err := json.Unmarshal(body, &r); err != nil {
		return fail(err)
	}
	fmt.Fprintf(w, "ID\t%s\nRule\t%s (%s)\nAction\t%s\nState\t%s\nJob\t%s/%s (tenant %s, queue %s)\nAllocations\t%s\nGPUs\t%d\n"+
		"Evidence\t%s\nProposed\t%s\nAct after\t%s\n", r.ID, r.Rule, r.Mode, r.Action, r.State, r.Namespace, r.Job, r.Tenant, r.Queue,
		strings.Join(r.Allocs, ", "), r.GPUs, r.Evidence, r.ProposedAt.Format(time.RFC3339), r.ActAfter.Format(time.RFC3339))
	if !r.ExecutedAt.IsZero() {
		fmt.Fprintf(w, "Executed\t%s\n", r.ExecutedAt.Format(time.RFC3339))
	}
	if r.Result != "" {
		fmt.Fprintf(w, "Result\t%s\n", r.Result)
	}
	return 0
}

// printAudit prints audit events, oldest first.
func printAudit(body []byte, width int) int {
	var events []audit.Event
	if err := json.Unmarshal(body, &events); err != nil {
		return fail(err)
	}
	t := newTable("TIME", "WHO", "WHAT", "NAMESPACE", "JOB", "TENANT", "QUEUE", "RULE", "RESULT")
	for _, e := range events {
		t.row(e.Time.Format(time.RFC3339), e.Who, e.What, e.Namespace, e.Job, e.Tenant, e.Queue, e.Rule, e.Result)
	}
	t.print(os.Stdout, width)
	return 0
}

// printReport prints a usage report: a table, or CSV.
func printReport(body []byte, asCSV bool, width int) int {
	var rep gpuapi.UsageReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fail(err)
	}
	header := []string{strings.ToUpper(rep.By), "ALLOCATED GPU-H", "BUSY GPU-H", "IDLE GPU-H", "IDLE SHARE", "COST " + rep.Currency}
	byTenant := rep.By == gpuusage.ByTenant
	if byTenant {
		header = append(header, "OVER LIMIT GPU-S")
	}
	rows := [][]string{}
	for _, r := range rep.Rows {
		group := r.Group
		if group == "" {
			group = "(none)"
		}
		row := []string{group, strconv.FormatFloat(r.AllocatedHours, 'f', 2, 64), strconv.FormatFloat(r.BusyHours, 'f', 2, 64),
			strconv.FormatFloat(r.IdleHours, 'f', 2, 64), strconv.FormatFloat(100*r.IdleShare, 'f', 1, 64) + "%",
			strconv.FormatFloat(r.Cost, 'f', 2, 64)}
		if byTenant {
			row = append(row, strconv.FormatFloat(r.OverLimitSeconds, 'f', 0, 64))
		}
		rows = append(rows, row)
	}
	if asCSV {
		cw := csv.NewWriter(os.Stdout)
		cw.Write(header)
		cw.WriteAll(rows)
		return 0
	}
	fmt.Printf("GPU-hours from %s up to %s\n", rep.From, rep.To)
	(&table{rows: append([][]string{header}, rows...)}).print(os.Stdout, width)
	return 0
}

// httpClient trusts caCert (a PEM file) besides the system's CAs.
func httpClient(caCert string) (*http.Client, error) {
	hc := &http.Client{Timeout: 30 * time.Second}
	if caCert == "" {
		return hc, nil
	}
	pem, err := os.ReadFile(caCert)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caCert)
	}
	hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return hc, nil
}

// fetch calls the broker (trusting caCert) and returns the answer's body;
// false (the error printed) when it failed. With asJSON the body is
// printed as it came.
func fetch(caCert, addr, method, path, token string, body []byte, asJSON bool) ([]byte, bool) {
	hc, err := httpClient(caCert)
	if err == nil {
		body, err = call(hc, method, strings.TrimRight(addr, "/")+path, token, body)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-broker: %v\n", err)
		return nil, false
	}
	if asJSON {
		os.Stdout.Write(body)
	}
	return body, true
}

// exit is the exit status of a command that did, or did not, succeed.
func exit(ok bool) int {
	if ok {
		return 0
	}
	return 1
}

// call makes a request of the broker's API (with a JSON body unless nil)
// and returns the answer's body, or its error text.
func call(hc *http.Client, method, u, token string, body []byte) ([]byte, error) {
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("X-Nomad-Token", token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach the broker: %w", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", strings.TrimSpace(string(out)))
	}
	if next := resp.Header.Get(gpuapi.NextCursorHeader); next != "" {
		fmt.Fprintf(os.Stderr, "gpu-broker: more events follow: run it again with -cursor %s\n", next)
	}
	return out, nil
}

// Long: a switch over the listings, one table layout each.
func printTable(sub string, body []byte, width int) int {
	var t *table
	switch sub {
	case "rightsizing":
		var rows []gpuapi.RightSizing
		if err := json.Unmarshal(body, &rows); err != nil {
			return fail(err)
		}
		t = newTable("TENANT", "NAMESPACE", "JOB", "QUEUE", "GPUS ASKED", "BUSY P50", "BUSY P95", "SAMPLES", "SINCE")
		for _, r := range rows {
			t.row(r.Tenant, r.Namespace, r.Job, r.Queue, strconv.Itoa(r.Asked), strconv.Itoa(r.BusyP50), strconv.Itoa(r.BusyP95),
				strconv.FormatInt(r.Samples, 10), r.Since.Format(time.RFC3339))
		}
	case "":
		var rows []gpuapi.TenantUsage
		if err := json.Unmarshal(body, &rows); err != nil {
			return fail(err)
		}
		t = newTable("TENANT", "USED", "GUARANTEED", "LIMIT", "BORROWED", "QUEUED", "BUDGET (GPU-HOURS)")
		for _, r := range rows {
			budget := "-"
			if b := r.Budget; b != nil {
				budget = fmt.Sprintf("%.1f of %g this %s, resets %s", b.Spent, b.Limit, b.Period, b.Resets.Format(time.RFC3339))
				if b.Over() {
					budget = "OVER: " + budget + "; its jobs run borrowed"
				}
			}
			t.row(r.Tenant, num(r.Used), num(r.Guaranteed), num(r.Limit), num(r.Borrowed), num(r.Queued), budget)
		}
	case "list":
		var rows []gpuapi.QueuedJob
		if err := json.Unmarshal(body, &rows); err != nil {
			return fail(err)
		}
		t = newTable("POS", "ID", "JOB", "NAMESPACE", "TENANT", "QUEUE", "GPUS", "WAITING", "ESTIMATED START", "REASON")
		for _, r := range rows {
			reason := r.Reason
			if b := r.Backoff; b != nil && !strings.Contains(reason, b.Text()) { // a reason may say it already
				reason = b.Text() + "; " + reason
			}
			if r.Parked != "" {
				reason = "parked: " + r.Parked
			}
			start := "-" // estimated by the leader only
			switch e := r.Estimate; {
			case e != nil && !e.At.IsZero():
				start = e.At.Format(time.RFC3339)
			case e != nil:
				start = "unknown"
			}
			t.row(strconv.Itoa(r.Position), r.ID, r.JobID, r.Namespace, r.Tenant, r.Queue, num(r.Demand),
				time.Since(r.SubmittedAt).Round(time.Second).String(), start, reason)
		}
	default:
		var r gpuapi.QueuedJob
		if err := json.Unmarshal(body, &r); err != nil {
			return fail(err)
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		defer w.Flush()
		verb := "queued"
		if sub == "cancel" {
			verb = "cancelled"
		}
		fmt.Fprintf(w, "ID\t%s\nJob\t%s\nNamespace\t%s\nTenant\t%s\nQueue\t%s\nGPUs\t%g\nSubmitted\t%s by %s\nReason\t%s\nStatus\t%s",
			r.ID, r.JobID, r.Namespace, r.Tenant, r.Queue, r.Demand, r.SubmittedAt.Format(time.RFC3339), r.SubmittedBy, r.Reason, verb)
		switch {
		case r.Parked != "":
			fmt.Fprintf(w, ", parked since %s: %s\n(`gpu-broker queue cancel %s` removes it)", r.ParkedAt.Format(time.RFC3339), r.Parked, r.ID)
		case r.Position > 0:
			fmt.Fprintf(w, ", position %d", r.Position)
		}
		fmt.Fprintln(w)
		if b := r.Backoff; b != nil {
			fmt.Fprintf(w, "Backoff\t%s\n", b.Text())
		}
		if e := r.Estimate; e != nil && !e.At.IsZero() {
			fmt.Fprintf(w, "Estimated start\t%s (%s)\n", e.At.Format(time.RFC3339), e.Why)
		} else if e != nil {
			fmt.Fprintf(w, "Estimated start\t%s\n", e.Why)
		}
	}
	if t != nil {
		t.print(os.Stdout, width)
	}
	return 0
}

// printRegions prints the regions a broker governs.
func printRegions(body []byte, width int) int {
	var rows []cluster.RegionStatus
	if err := json.Unmarshal(body, &rows); err != nil {
		return fail(err)
	}
	t := newTable("REGION", "REACHED AT", "SYNCED", "NODES", "GPUS", "FREE", "DRAINED", "UNREACHABLE")
	home := ""
	for _, r := range rows {
		at := r.Address
		switch {
		case r.Own:
			home, at = r.Name, "nomad.address (own region)"
		case at == "":
			at = "through " + home
		}
		t.row(r.Name, at, strconv.FormatBool(r.Synced), strconv.Itoa(r.Nodes), strconv.Itoa(r.GPUs), strconv.Itoa(r.Free), orDash(r.Drained), orDash(r.Unreachable))
	}
	t.print(os.Stdout, width)
	return 0
}

// orDash is s, or "-" for none.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// num prints a count as %g does.
func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "gpu-broker: unexpected answer: %v\n", err)
	return 1
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
