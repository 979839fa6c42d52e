package integration

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

const racePolicy = `
queue "training" { priority = 60 }
tenant "race" {
  namespaces = ["race"]
  queues     = ["training"]
  guaranteed = 8
  limit      = 8
}
tenant "race-scale" {
  namespaces = ["race-scale"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
borrowing {
  enabled = false
}
`

// TestConcurrentAdmissionsThroughTwoBrokers: many registrations of one tenant
// at once, and many scales of one job, through two brokers against one
// Consul, never admit more than the tenant's limit together; the rest is
// queued, nothing is lost.
func TestConcurrentAdmissionsThroughTwoBrokers(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "race", 32, "race", "race-scale")
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), racePolicy)
	brokers := []*testcluster.Broker{
		testcluster.StartBroker(t, n, consul, policyDir),
		testcluster.StartBroker(t, n, consul, policyDir),
	}
	d := &diffEnv{t: t, nomad: n}
	testcluster.WaitFor(t, 60*time.Second, "a leader and both brokers' views", func() error {
		for _, b := range brokers {
			d.broker = b
			probe := job("race", "probe", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("gpu", 33))).body(nil, canonical)
			if status, out := d.send(http.MethodPut, "/v1/job/probe/plan", probe); !strings.Contains(out, "no node has more than 32") {
				return fmt.Errorf("broker %s: %d %s", b.Addr, status, out)
			}
		}
		pair, _, err := consulKV(consul).Get("nomad-gpu/leader", nil)
		if err != nil || pair == nil || pair.Session == "" {
			return fmt.Errorf("no leader yet (%v)", err)
		}
		return nil
	})

	const jobs = 24
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted []string
		queued   int
		other    []string
	)
	start := make(chan struct{})
	for i := 0; i < jobs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			e := &diffEnv{t: t, nomad: n, broker: brokers[i%2]}
			body := job("race", fmt.Sprintf("race-%02d", i), api.JobTypeBatch).group("g", ptr(1), nil, task(dev("gpu", 1))).body(nil, canonical)
			<-start
			status, out := e.send(http.MethodPut, "/v1/jobs", body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case status == http.StatusOK && strings.Contains(out, "nomad-gpu: admitted"):
				admitted = append(admitted, fmt.Sprintf("race-%02d via broker %d", i, i%2))
			case status == http.StatusOK && strings.Contains(out, "nomad-gpu: queued"):
				queued++
			default:
				other = append(other, fmt.Sprintf("%d %s", status, out))
			}
		}(i)
	}
	close(start)
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("unexpected answers: %v", other)
	}
	if len(admitted) != 8 || queued != jobs-8 {
		t.Errorf("admitted %d (%v), queued %d; want 8 and %d", len(admitted), admitted, queued, jobs-8)
	}
	inNomad, _, err := n.API.Jobs().List(&api.QueryOptions{Namespace: "race", Prefix: "race-"})
	if err != nil || len(inNomad) > 8 {
		t.Errorf("Nomad has %d of the tenant's one-GPU jobs, its limit is 8 (%v)", len(inNomad), err)
	}

	// Five scales of five groups of one job at once, through both brokers,
	// each to 1 GPU against a limit of 2: decided one after another.
	five := job("race-scale", "five", api.JobTypeBatch)
	for i := 0; i < 5; i++ {
		five.group(fmt.Sprintf("g%d", i), ptr(0), nil, task(dev("gpu", 1)))
	}
	d.broker = brokers[0]
	if status, out := d.send(http.MethodPut, "/v1/jobs", five.body(nil, canonical)); status != http.StatusOK {
		t.Fatalf("five GPU groups at count 0: %d %s", status, out)
	}
	statuses := make([]int, 5)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := &diffEnv{t: t, nomad: n, broker: brokers[i%2]}
			statuses[i], _ = e.send(http.MethodPut, "/v1/job/five/scale?namespace=race-scale", fmt.Sprintf(`{"Count": 1, "Target": {"Group": "g%d"}}`, i))
		}()
	}
	wg.Wait()
	scaled := 0
	for _, s := range statuses {
		if s == http.StatusOK {
			scaled++
		}
	}
	if j, _, err := n.API.Jobs().Info("five", &api.QueryOptions{Namespace: "race-scale"}); err != nil || scaled != 2 || gpusOf(j) != 2 {
		t.Errorf("%d scales admitted (%v) through two brokers; Nomad's job asks for %d GPUs (%v); the limit is 2", scaled, statuses, gpusOf(j), err)
	}
}

// leaderOf is the advertise address of the broker holding the leader lock, "" if none.
func leaderOf(consul *testcluster.Consul) string {
	pair, _, err := consulKV(consul).Get("nomad-gpu/leader", nil)
	if err != nil || pair == nil || pair.Session == "" {
		return ""
	}
	return string(pair.Value)
}

// takeover watches the leader key until addr holds it: when the key was
// last seen free, and when addr was seen holding it.
func takeover(t *testing.T, consul *testcluster.Consul, addr string) (freed, taken time.Time) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var index uint64
	for time.Now().Before(deadline) {
		pair, meta, err := consulKV(consul).Get("nomad-gpu/leader", &consulapi.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second})
		if err != nil {
			t.Fatalf("watch the leader key: %v", err)
		}
		switch {
		case pair == nil || pair.Session == "":
			freed = time.Now()
		case string(pair.Value) == addr:
			if freed.IsZero() {
				t.Fatalf("%s took the leader lock, which was never seen free", addr)
			}
			return freed, time.Now()
		}
		index = meta.LastIndex
	}
	t.Fatalf("%s did not take the leader lock within 60 s", addr)
	return
}

// startBrokerPair starts two brokers on one policy directory and waits for
// one of them to lead.
func startBrokerPair(t *testing.T, n *testcluster.Nomad, consul *testcluster.Consul, policyDir string) []*testcluster.Broker {
	t.Helper()
	brokers := []*testcluster.Broker{ // processes: killLeader SIGKILLs one
		testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Process: true}),
		testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Process: true}),
	}
	testcluster.WaitFor(t, 30*time.Second, "a leader", func() error {
		if leaderOf(consul) == "" {
			return fmt.Errorf("no leader yet")
		}
		return nil
	})
	return brokers
}

// killLeader SIGKILLs the one of brokers that leads, and returns the other.
func killLeader(t *testing.T, consul *testcluster.Consul, brokers []*testcluster.Broker) *testcluster.Broker {
	t.Helper()
	leader := leaderOf(consul)
	for i, b := range brokers {
		if b.Addr == leader {
			b.Kill()
			return brokers[1-i]
		}
	}
	t.Fatalf("the leader %q is neither broker", leader)
	return nil
}

// consulClients holds one client per Consul agent. A client made per call
// brings its own connection pool, and a test polling four times a second
// left an idle connection open for each call until Consul's limit of 200
// connections per client address refused every new one. leaderOf then read
// "" while a leader held the lock.
var consulClients sync.Map

func consulKV(c *testcluster.Consul) *consulapi.KV {
	if client, ok := consulClients.Load(c.Addr); ok {
		return client.(*consulapi.Client).KV()
	}
	client, err := consulapi.NewClient(&consulapi.Config{Address: c.Addr})
	if err != nil {
		panic(err)
	}
	actual, _ := consulClients.LoadOrStore(c.Addr, client)
	return actual.(*consulapi.Client).KV()
}

// TestLeaderKilledWhileAdmitting: the leader broker is SIGKILLed just as
// GPUs free up for the queue; the other broker takes over and admits every
// queued job: none lost, none placed twice, the tenant never above its limit.
func TestLeaderKilledWhileAdmitting(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	n := startGPUNode(t, "failover", 8, "race")
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), racePolicy)
	brokers := []*testcluster.Broker{ // processes: the leader is SIGKILLed
		testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Process: true}),
		testcluster.StartBrokerWith(t, n, consul, policyDir, testcluster.BrokerOptions{Process: true}),
	}
	e := &env{t: t, nomad: n, dir: t.TempDir(), broker: brokers[0]}
	waitForView(t, 8, func() string {
		out, _ := e.run("race", "probe", 1, 9, "", false)
		return out
	})
	testcluster.WaitFor(t, 30*time.Second, "a leader", func() error {
		if leaderOf(consul) == "" {
			return fmt.Errorf("no leader yet")
		}
		return nil
	})
	if out, err := e.run("race", "blocker", 1, 8, "", true); err != nil || !strings.Contains(out, "admitted") {
		t.Fatalf("%v\n%s", err, out)
	}
	const queued = 6
	for i := 0; i < queued; i++ {
		e.broker = brokers[i%2]
		if out, err := e.run("race", fmt.Sprintf("waits-%d", i), 1, 1, "", true); err != nil || !strings.Contains(out, "queued as") {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if _, _, err := n.API.Jobs().Deregister("blocker", false, &api.WriteOptions{Namespace: "race"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the leader sees the change and starts admitting
	survivor := killLeader(t, consul, brokers)
	killed := time.Now()
	// The survivor finds nothing listening at the leader's address and ends
	// its session rather than wait two TTLs for it to expire. It takes the
	// lock as soon as the lock delay (1 s) allows, not after the Consul
	// client's retry of 5 s.
	freed, taken := takeover(t, consul, survivor.Addr)
	if taken.Sub(freed) > 3*time.Second {
		t.Errorf("the survivor took the lock %s after it was freed, want under 3 s", taken.Sub(freed).Round(100*time.Millisecond))
	}
	if d := taken.Sub(killed); d > 8*time.Second {
		t.Errorf("the survivor led %s after the leader was killed, want under 8 s", d.Round(100*time.Millisecond))
	}
	t.Logf("the survivor led %s after the leader was killed", taken.Sub(killed).Round(100*time.Millisecond))

	e.broker = survivor
	for i := 0; i < queued; i++ {
		e.waitAdmitted(t, "race", fmt.Sprintf("waits-%d", i), 90*time.Second)
	}
	testcluster.WaitFor(t, 60*time.Second, "each admitted job placed once", func() error {
		for i := 0; i < queued; i++ {
			id := fmt.Sprintf("waits-%d", i)
			allocs, _, err := n.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: "race"})
			if err != nil {
				return err
			}
			if len(allocs) != 1 {
				return fmt.Errorf("%s has %d allocations", id, len(allocs))
			}
		}
		return nil
	})
	// The leader may have been killed between registering a job and removing
	// its entry: the survivor, once it holds the lock, admits that entry again
	// (the same job, so Nomad places nothing more) and removes it.
	testcluster.WaitFor(t, 60*time.Second, "no admitted job left in the queue", func() error {
		if out := e.brokerCLI("queue", "list"); strings.Contains(out, "waits-") {
			return fmt.Errorf("admitted jobs still queued:\n%s", out)
		}
		return nil
	})
	for i := 0; i < queued; i++ {
		id := fmt.Sprintf("waits-%d", i)
		if allocs, _, err := n.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: "race"}); err != nil || len(allocs) != 1 {
			t.Errorf("%s: %d allocations (%v), want 1", id, len(allocs), err)
		}
	}
	for _, u := range e.usage() {
		if u.Used > u.Limit {
			t.Errorf("tenant %s uses %g GPUs, its limit is %g", u.Tenant, u.Used, u.Limit)
		}
	}
}
