package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

const soakPolicy = `
queue "training" { priority = 60 }
tenant "a" {
  namespaces = ["soak-a"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 6
}
tenant "b" {
  namespaces = ["soak-b"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 6
}
borrowing {
  enabled  = true
  priority = 20
  # Sub-bands from 1 GPU-second: borrowed work moves, in place, at each
  # reclaim pass while the users work (their jobs live seconds; the
  # default's 15 GPU-minutes would never be reached).
  sub_band_step = "1s"
}
# Moves are made at reclaim passes: many within CI's minute.
reclaim_settings {
  period = "2s"
}
`

// soakLimit is each soak tenant's limit.
const soakLimit = 6

// soakDuration is how long the soak's users work: SOAK_DURATION (`make soak`),
// else a minute.
func soakDuration(t *testing.T) time.Duration {
	d := time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
	}
	return d
}

// soakLedger counts every answer the users got, by kind.
type soakLedger struct {
	mu       sync.Mutex
	counts   map[string]int
	other    []string
	admitted map[string]string // job id -> namespace, of admitted registrations and dispatches
	queued   [][3]string       // queue id, namespace, job id
	// unavailable are the times of 503 answers.
	unavailable []time.Time
}

func (l *soakLedger) add(op string, status int, body string, err error, ns, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kind := ""
	switch {
	case err == nil && strings.Contains(body, "injected: "):
		kind = "Nomad failing (injected)" // relayed as Nomad answered it
	case err != nil:
		kind = "unreachable (broker killed)"
	case status == http.StatusOK && strings.Contains(body, "nomad-gpu: queued as "):
		kind = "queued"
		rest := body[strings.Index(body, "queued as ")+len("queued as "):]
		l.queued = append(l.queued, [3]string{strings.TrimSuffix(strings.Fields(rest)[0], ","), ns, id})
	case status == http.StatusOK:
		kind = "done"
		if op == "dispatch" {
			var out struct{ DispatchedJobID string }
			json.Unmarshal([]byte(body), &out)
			id = out.DispatchedJobID
		}
		if op == "submit" || op == "dispatch" {
			l.admitted[id] = ns
		}
	case status == http.StatusForbidden || status == http.StatusNotFound:
		kind = "refused"
	case status == http.StatusTooManyRequests:
		kind = "limited"
	case status == http.StatusConflict && strings.Contains(body, "again in a moment"):
		kind = "busy (try again)" // a stop while the leader's registration of it waits on Nomad
	case status == http.StatusServiceUnavailable:
		kind = "unavailable (leader change)"
		l.unavailable = append(l.unavailable, time.Now())
	default:
		l.other = append(l.other, fmt.Sprintf("%s %s/%s: %d %s", op, ns, id, status, body))
		kind = "other"
	}
	l.counts[op+": "+kind]++
}

// soakCPUWindow is the longest window over which each broker's CPU and
// queue passes are measured. soakCPUShare is the share of a core it may use
// in any one, users' requests included. soakPassRate is the queue passes a
// second (a leader passing in a loop while Nomad fails makes hundreds).
const (
	soakCPUWindow = 20 * time.Second
	soakCPUShare  = 0.25
	soakPassRate  = 100
)

// TestSoak: users of two tenants submit, scale, dispatch and stop GPU jobs
// through two brokers against real Nomad while the leader is killed once.
// Later Nomad answers every write 500, then 429, then nothing for a while
// (a proxy between the brokers and Nomad). It holds that:
//   - every answer is one the users can act on;
//   - everything admitted or queued is accounted for;
//   - Nomad never runs more GPUs for a tenant than its limit at any sampled
//     moment;
//   - no broker uses more than soakCPUShare of a core in any soakCPUWindow;
//   - the surviving broker's memory stays flat.
func TestSoak(t *testing.T) {
	duration := soakDuration(t)
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "soak", 16, "soak-a", "soak-b")
	faults, proxy := startFaultyNomad(t, n)
	faults.writes = true
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), soakPolicy)
	// Processes: the leader is SIGKILLed, the survivor's memory measured.
	// Built as released: a race-detector build's memory grows with its own
	// bookkeeping, so its RSS says nothing of the broker's (the other
	// integration tests run brokers under the race detector).
	// enable_debug: SOAK_PROFILE_DIR=DIR saves the survivor's heap profiles.
	brokers := []*testcluster.Broker{
		testcluster.StartReleaseBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Config: "enable_debug = true", NomadAddress: proxy}),
		testcluster.StartReleaseBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Config: "enable_debug = true", NomadAddress: proxy}),
	}
	// The users hold quiet for reading while a call is in flight; the
	// survivor's first sample takes it for writing, so that it is taken at
	// rest, as the last is. Under load, followers are between Consul long
	// polls and their idle connections closed, so a sample taken then has
	// fewer goroutines and files than one at rest, with nothing leaked.
	var quiet sync.RWMutex
	send := func(b *testcluster.Broker, method, path, body string) (int, string, error) {
		quiet.RLock()
		defer quiet.RUnlock()
		req, _ := http.NewRequest(method, b.Addr+path, strings.NewReader(body))
		resp, err := b.Client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out), nil
	}
	soakJob := func(ns, id string, count int, gpus uint64) *jobBuilder {
		return job(ns, id, api.JobTypeBatch).group("g", ptr(count), nil, task(dev("nvidia/gpu", gpus)))
	}
	waitForView(t, 16, func() string {
		_, out, _ := send(brokers[0], http.MethodPut, "/v1/jobs", soakJob("soak-a", "probe", 1, 17).body(nil, canonical))
		return out
	})
	for _, ns := range []string{"soak-a", "soak-b"} {
		parent := soakJob(ns, "parent", 1, 1)
		parent.j.ParameterizedJob = &api.ParameterizedJobConfig{}
		if status, out, err := send(brokers[0], http.MethodPut, "/v1/jobs", parent.body(nil, canonical)); err != nil || status != http.StatusOK {
			t.Fatalf("parent in %s: %d %s %v", ns, status, out, err)
		}
	}

	ledger := &soakLedger{counts: map[string]int{}, admitted: map[string]string{}}
	deadline := time.Now().Add(duration)
	stop := make(chan struct{})
	var users, sampler sync.WaitGroup

	// The sampler: GPUs Nomad runs per tenant, several times a second.
	var samples, maxUsed = 0, map[string]int{}
	var over []string
	subBanded := map[string]bool{} // jobs seen in a sub-band above the borrowing priority
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if samples%10 == 0 {
				if jobs, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: "*"}); err == nil {
					for _, j := range jobs {
						if j.Priority > 20 && j.Priority < 30 {
							subBanded[j.Namespace+"/"+j.ID] = true
						}
					}
				}
			}
			used, holders, err := gpusHeld(n)
			if err != nil {
				continue
			}
			samples++
			for ns, u := range used {
				maxUsed[ns] = max(maxUsed[ns], u)
				if u > soakLimit {
					sort.Strings(holders[ns])
					over = append(over, fmt.Sprintf("%s: %d GPUs at %s: %s", ns, u, time.Now().Format("15:04:05.000"), strings.Join(holders[ns], "; ")))
				}
			}
		}
	}()

	// Each broker's share of a core and queue passes a second, window by
	// window (a killed one's end with it; at least three before the kill).
	var busiest []string
	window := min(soakCPUWindow, duration/9).Round(time.Second)
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		cpus, passes := make([]time.Duration, len(brokers)), make([]float64, len(brokers))
		for i, b := range brokers {
			cpus[i], passes[i] = b.CPUTime(), queuePasses(b)
		}
		for start := time.Now(); ; start = time.Now() {
			select {
			case <-stop:
				return
			case <-time.After(window):
			}
			seen := make([]string, len(brokers))
			for i, b := range brokers {
				cpu, passed := b.CPUTime(), queuePasses(b)
				if cpu == 0 { // killed
					seen[i] = "gone"
					continue
				}
				share, rate := float64(cpu-cpus[i])/float64(time.Since(start)), (passed-passes[i])/time.Since(start).Seconds()
				cpus[i], passes[i] = cpu, passed
				seen[i] = fmt.Sprintf("%.3f of a core and %.1f queue passes a second", share, rate)
				if share > soakCPUShare || rate > soakPassRate {
					busiest = append(busiest, fmt.Sprintf("broker %d in the %s to %s: %s", i, window, time.Now().Format("15:04:05"), seen[i]))
				}
			}
			t.Logf("%s, over %s: %s (Nomad failing: %q)", time.Now().Format("15:04:05"), window, strings.Join(seen, "; "), faults.current())
		}
	}()
	// Nomad fails from 55 % of the run, after the survivor's first sample:
	// every write answered 500, then 429, then not at all, each for a
	// twelfth of the run (at most 20 s), then Nomad answers again. At the
	// start of each, an operator stops the users' jobs straight in Nomad:
	// queued jobs then fit, and the leader registers them while Nomad fails.
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		phase := min(duration/12, 20*time.Second)
		select {
		case <-stop:
			return
		case <-time.After(duration * 55 / 100):
		}
		for _, mode := range []string{"500", "429", "stall", ""} {
			faults.set(mode)
			if mode == "" {
				return
			}
			stopUsersJobs(n)
			select {
			case <-stop:
				faults.set("")
				return
			case <-time.After(phase):
			}
		}
	}()

	for u := 0; u < 8; u++ {
		users.Add(1)
		go func(u int) {
			defer users.Done()
			rng := rand.New(rand.NewSource(int64(u)))
			ns := []string{"soak-a", "soak-b"}[u%2]
			b := u % 2
			var children []string
			for time.Now().Before(deadline) {
				id := fmt.Sprintf("u%d-%d", u, rng.Intn(3))
				var op, method, path, body string
				switch r := rng.Intn(100); {
				case r < 40:
					op, method, path = "submit", http.MethodPut, "/v1/jobs"
					body = soakJob(ns, id, 1+rng.Intn(2), uint64(1+rng.Intn(2))).body(nil, canonical)
				case r < 60:
					op, method, path = "scale", http.MethodPost, "/v1/job/"+id+"/scale?namespace="+ns
					body = fmt.Sprintf(`{"Count":%d,"Target":{"Group":"g"}}`, rng.Intn(3))
				case r < 75:
					op, method, path, body = "dispatch", http.MethodPost, "/v1/job/parent/dispatch?namespace="+ns, "{}"
				default:
					op, method = "stop", http.MethodDelete
					if len(children) > 0 && rng.Intn(2) == 0 {
						id, children = children[0], children[1:]
					}
					path = "/v1/job/" + id + "?namespace=" + ns
				}
				status, out, err := send(brokers[b], method, path, body)
				if err != nil {
					b = 1 - b // that broker is gone: the user turns to the other
				}
				ledger.add(op, status, out, err, ns, id)
				if op == "dispatch" && status == http.StatusOK {
					var d struct{ DispatchedJobID string }
					json.Unmarshal([]byte(out), &d)
					children = append(children, d.DispatchedJobID)
				}
				time.Sleep(time.Duration(100+rng.Intn(400)) * time.Millisecond)
			}
		}(u)
	}

	// Kill the leader at a third of the run; measure the survivor's memory
	// from half the run (the users paused) to the end.
	time.Sleep(duration / 3)
	killedAt := time.Now()
	survivor := killLeader(t, consul, brokers)
	time.Sleep(duration / 6)
	quiet.Lock()
	time.Sleep(2 * time.Second) // the last requests' connections and goroutines end
	rssFrom, fdsFrom, goFrom, heapFrom := survivor.RSS(), survivor.FDs(), settledGoroutines(survivor), survivor.Scrape()["go_memstats_heap_inuse_bytes"]
	jobsFrom, allocsFrom := nomadObjects(t, n)
	liveFrom := liveHeap(t, survivor, "from")
	quiet.Unlock()
	users.Wait()
	time.Sleep(2 * time.Second)
	rssTo, fdsTo, goTo, heapTo := survivor.RSS(), survivor.FDs(), settledGoroutines(survivor), survivor.Scrape()["go_memstats_heap_inuse_bytes"]
	jobsTo, allocsTo := nomadObjects(t, n)
	liveTo := liveHeap(t, survivor, "to")
	close(stop)
	sampler.Wait()

	kinds := make([]string, 0, len(ledger.counts))
	total := 0
	for k, c := range ledger.counts {
		kinds = append(kinds, fmt.Sprintf("%-40s %5d", k, c))
		total += c
	}
	sort.Strings(kinds)
	t.Logf("soak of %s: %d requests by 8 users\n%s", duration, total, strings.Join(kinds, "\n"))
	t.Logf("%d samples of Nomad's allocations; most GPUs a tenant ran at once: %v (limit %d); %d jobs seen in a borrowed sub-band",
		samples, maxUsed, soakLimit, len(subBanded))
	if len(subBanded) == 0 {
		t.Error("no borrowed job was seen moved to a sub-band while the users worked")
	}
	if u := ledger.unavailable; len(u) > 0 {
		t.Logf("GPU calls answered 503 from %.1fs to %.1fs after the leader was killed", u[0].Sub(killedAt).Seconds(), u[len(u)-1].Sub(killedAt).Seconds())
		if u[0].Before(killedAt) {
			// Fail-closed, not lost: a leader too loaded to renew its Consul
			// session steps down. Worth knowing, not a failure.
			t.Logf("GPU calls answered 503 %.1fs before the kill", killedAt.Sub(u[0]).Seconds())
		}
	}
	t.Logf("surviving broker after the failover, then at the end: RSS %d then %d MiB, Go heap in use %.0f then %.0f MiB, live heap after a GC %.1f then %.1f MiB, open files %d then %d, goroutines %g then %g; Nomad held %d then %d jobs, %d then %d allocations",
		rssFrom>>20, rssTo>>20, heapFrom/(1<<20), heapTo/(1<<20), liveFrom/(1<<20), liveTo/(1<<20), fdsFrom, fdsTo, goFrom, goTo, jobsFrom, jobsTo, allocsFrom, allocsTo)
	// Flat: what the broker holds after a collection (the heap in use and
	// RSS also hold garbage not yet collected), its files and goroutines.
	// The broker mirrors Nomad's state, which grows through the run: Nomad
	// keeps finished and preempted allocations until its own collection,
	// hours later, and the view keeps the preempted ones as long. So 1 KiB
	// per allocation Nomad added, and 1 MiB of slack for a scrape or a pass
	// in flight at either moment.
	if allowed := liveFrom*1.1 + (1 << 20) + float64(max(0, allocsTo-allocsFrom))*1024; liveTo > allowed {
		t.Errorf("the survivor's live heap grew from %.1f to %.1f MiB (allowed %.1f MiB: Nomad's allocations went from %d to %d)",
			liveFrom/(1<<20), liveTo/(1<<20), allowed/(1<<20), allocsFrom, allocsTo)
	}
	if fdsTo > fdsFrom+fdsFrom/10+2 || goTo > goFrom*1.1+2 {
		t.Errorf("the survivor's open files (%d then %d) or goroutines (%g then %g) grew", fdsFrom, fdsTo, goFrom, goTo)
	}

	if len(ledger.other) > 0 {
		t.Errorf("%d answers a user cannot act on:\n%s", len(ledger.other), strings.Join(ledger.other, "\n"))
	}
	if len(over) > 0 {
		t.Errorf("Nomad ran more GPUs than a tenant's limit at %d of %d samples:\n%s", len(over), samples, strings.Join(over, "\n"))
	}
	t.Logf("Nomad failing: %d writes answered 500, %d answered 429, %d stalled", faults.count("500"), faults.count("429"), faults.count("stall"))
	if faults.count("500") == 0 || faults.count("stall") == 0 {
		t.Error("the brokers sent Nomad no write while it failed")
	}
	if len(busiest) > 0 {
		t.Errorf("a broker used more than %.2f of a core or made more than %d queue passes a second:\n%s", soakCPUShare, soakPassRate, strings.Join(busiest, "\n"))
	}
	// Between samples too: the leaders' ledger charges every GPU-second a
	// tenant's allocations held above its limit, those being stopped
	// included, and keeps it across the failover.
	status, body, err := send(survivor, http.MethodGet, "/v1/gpu/usage?by=tenant&from="+time.Now().UTC().AddDate(0, 0, -1).Format("2006-01-02"), "")
	var rep gpuapi.UsageReport
	if err != nil || status != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil {
		t.Errorf("usage report: %d %s %v", status, body, err)
	}
	for _, r := range rep.Rows {
		if r.OverLimitSeconds > 0 {
			t.Errorf("tenant %q held %.1f GPU-seconds above its limit", r.Group, r.OverLimitSeconds)
		}
	}
	if ledger.counts["submit: done"] == 0 || ledger.counts["submit: queued"] == 0 || ledger.counts["stop: done"] == 0 {
		t.Errorf("the soak did not admit, queue and stop: %v", ledger.counts)
	}
	for id, ns := range ledger.admitted {
		if _, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: ns}); err != nil {
			t.Errorf("admitted job %s/%s is not in Nomad: %v", ns, id, err)
		}
	}
	stillQueued := 0
	for _, q := range ledger.queued {
		// Still queued (or parked), or admitted since: either way, not lost.
		status, body, err := send(survivor, http.MethodGet, "/v1/gpu/queue/"+q[0], "")
		switch {
		case err != nil:
			t.Fatal(err)
		case status == http.StatusOK:
			stillQueued++
		case status != http.StatusNotFound:
			t.Errorf("queue entry %s: %d %s", q[0], status, body)
		default:
			if _, _, err := n.API.Jobs().Info(q[2], &api.QueryOptions{Namespace: q[1]}); err != nil {
				t.Errorf("queued job %s/%s (%s) is neither queued nor in Nomad: %v", q[1], q[2], q[0], err)
			}
		}
	}
	t.Logf("%d queued answers: %d still queued, the others admitted since", len(ledger.queued), stillQueued)
	// RSS flat too: under 10 % more from mid-run to the end, and 4 MiB for
	// a pass or a scrape in flight. It was 23 then 24 MiB at 10 minutes,
	// since the listing of Nomad leaves out ended allocations; 23 then 64
	// before.
	if rssTo > rssFrom*11/10+4<<20 {
		t.Errorf("the broker's memory grew from %d MiB to %d MiB", rssFrom>>20, rssTo>>20)
	}
	// Once the load is over, what grows without bound shows: open files and
	// goroutines may not end above where they were under load (10 % and a
	// few connections' worth of slack).
	if fdsTo > fdsFrom*11/10+8 {
		t.Errorf("the broker's open files grew from %d to %d", fdsFrom, fdsTo)
	}
	if goTo > goFrom*1.1+16 {
		t.Errorf("the broker's goroutines grew from %g to %g", goFrom, goTo)
	}
	torn := 0
	trail, err := os.ReadFile(survivor.AuditPath())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(trail), "\n"), "\n")
	for _, line := range lines {
		if !json.Valid([]byte(line)) {
			torn++
		}
	}
	t.Logf("the survivor's audit trail: %d lines, %d unreadable", len(lines), torn)
	if torn > 0 {
		t.Errorf("%d audit lines cannot be read", torn)
	}
}

// stopUsersJobs stops every job of the soak's users straight in Nomad (not
// the parameterized parents).
func stopUsersJobs(n *testcluster.Nomad) {
	jobs, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: "*"})
	if err != nil {
		return
	}
	for _, j := range jobs {
		if j.Status != "dead" && !j.ParameterizedJob && !j.Stop {
			n.API.Jobs().Deregister(j.ID, false, &api.WriteOptions{Namespace: j.Namespace})
		}
	}
}

// queuePasses is how many queue passes b made as leader (0 once it is gone).
func queuePasses(b *testcluster.Broker) float64 {
	resp, err := b.Client.Get(b.Addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	n := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, `nomadgpu_leader_passes_total{loop="queue",`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += v
		}
	}
	return n
}

// nomadObjects counts the jobs and allocations Nomad holds (the state the
// broker's view mirrors, whose size its memory follows).
func nomadObjects(t *testing.T, n *testcluster.Nomad) (jobs, allocs int) {
	j, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: "*"})
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := n.API.Allocations().List(&api.QueryOptions{Namespace: "*"})
	if err != nil {
		t.Fatal(err)
	}
	return len(j), len(a)
}

// settledGoroutines is the fewest goroutines b ran over three scrapes half a
// second apart: a reclaim pass in flight (every 2 s here) has its calls'
// goroutines for a moment; a leak stays.
func settledGoroutines(b *testcluster.Broker) float64 {
	n := b.Scrape()["go_goroutines"]
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		n = min(n, b.Scrape()["go_goroutines"])
	}
	return n
}

// liveHeap is b's heap after two garbage collections (HeapAlloc, in bytes),
// from its profiler (enable_debug): objects in a sync.Pool (a scrape's gzip
// writer, about 0.9 MiB) outlive one collection. With SOAK_PROFILE_DIR it
// also saves the heap profile there as heap-<name>.pb.gz.
func liveHeap(t *testing.T, b *testcluster.Broker, name string) float64 {
	get := func(query string) []byte {
		resp, err := b.Client.Get(b.Addr + "/debug/pprof/heap?gc=1" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return out
	}
	if dir := os.Getenv("SOAK_PROFILE_DIR"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "heap-"+name+".pb.gz"), get(""), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	get("&debug=1")
	text := string(get("&debug=1"))
	i := strings.Index(text, "# HeapAlloc = ")
	if i < 0 {
		t.Fatalf("no HeapAlloc in the heap profile:\n%.500s", text)
	}
	v, err := strconv.ParseFloat(strings.Fields(text[i+len("# HeapAlloc = "):])[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// gpusHeld is the GPUs each namespace's allocations in n's region hold
// (to run, and not ended), and what holds them, by namespace: to tell a
// violation's cause.
func gpusHeld(n *testcluster.Nomad) (used map[string]int, holders map[string][]string, err error) {
	allocs, _, err := n.API.Allocations().List(&api.QueryOptions{Namespace: "*", Params: map[string]string{"resources": "true"}})
	if err != nil {
		return nil, nil, err
	}
	used, holders = map[string]int{}, map[string][]string{}
	for _, a := range allocs {
		if a.DesiredStatus != api.AllocDesiredStatusRun || a.ClientStatus == api.AllocClientStatusComplete ||
			a.ClientStatus == api.AllocClientStatusFailed || a.ClientStatus == api.AllocClientStatusLost || a.AllocatedResources == nil {
			continue
		}
		gpus := 0
		for _, tr := range a.AllocatedResources.Tasks {
			for _, d := range tr.Devices {
				gpus += len(d.DeviceIDs)
			}
		}
		used[a.Namespace] += gpus
		if gpus > 0 {
			holders[a.Namespace] = append(holders[a.Namespace], fmt.Sprintf("%s/%s v%d %s %d GPUs (created at index %d)",
				a.JobID, a.ID[:8], a.JobVersion, a.ClientStatus, gpus, a.CreateIndex))
		}
	}
	return used, holders, nil
}
