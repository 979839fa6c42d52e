package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/gpuapi"
	"github.com/nomad-gpu/nomad-gpu/broker/metrics"
	"github.com/nomad-gpu/nomad-gpu/broker/reclaim"
	"github.com/nomad-gpu/nomad-gpu/testing/browser"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

const regionsPolicy = `
queue "training" { priority = 60 }
queue "serving" {
  priority = 70
  dispatch = "best_fit"
}
tenant "vision" {
  namespaces = ["vision"]
  queues     = ["training"]
  guaranteed = 4
  limit      = 4
}
tenant "audio" {
  namespaces = ["audio"]
  queues     = ["training", "serving"]
  guaranteed = 2
  limit      = 6
}
tenant "dub" {
  namespaces = ["dub"]
  queues     = ["training"]
  guaranteed = 1
  limit      = 2
  region "west" {
    limit = 1
  }
}
tenant "speech" {
  namespaces = ["speech"]
  queues     = ["training"]
  guaranteed = 2
  limit      = 2
}
borrowing { enabled = true }
region_lost_timeout = "2s"
reclaim_settings { period = "2s" }
reclaim "unadmitted" {
  unadmitted = true
  action     = "stop"
  mode       = "enforce"
}
`

// startRegion starts a Nomad server and client of region name with gpus fake
// GPUs and namespaces.
func startRegion(t *testing.T, name string, gpus int, namespaces ...string) *testcluster.Nomad {
	t.Helper()
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: name, Server: true, Client: true, ExtraHCL: fmt.Sprintf("region = %q", name),
		PluginConfig: fmt.Sprintf(`
    backend = "fake"
    fake {
      count     = %d
      id_prefix = %q
    }`, gpus, name)})
	n.WaitForNodes(t, 1)
	for _, ns := range namespaces {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestRegions: one broker in front of region east governs west too
// (region "west" {} in broker.hcl, reached through east's servers, which
// forward). Two federated regions, east of one 4-GPU node, west of one
// 2-GPU node. A job naming west runs there, a tenant's limit counts both
// regions, a job is decided on its own region's nodes, and a job for a
// region the broker does not govern is refused.
func TestRegions(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	east, west := startRegion(t, "east", 4, "vision", "audio", "speech", "dub"), startRegion(t, "west", 2, "vision", "audio", "speech", "dub")
	if _, err := east.API.Agent().Join(west.SerfAddr); err != nil {
		t.Fatalf("federate east with west: %v", err)
	}
	testcluster.WaitFor(t, 60*time.Second, "east's servers reaching west", func() error {
		_, _, err := east.API.Nodes().List(&api.QueryOptions{Region: "west"})
		return err
	})
	e := brokerEnv(t, east, consul, regionsPolicy, "vision", 4, testcluster.BrokerOptions{Config: `region "west" {}`})
	testcluster.WaitFor(t, 60*time.Second, "the broker following west", func() error {
		out := e.brokerCLI("region", "list")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "west" {
				if want := []string{"west", "through", "east", "true", "1", "2", "2", "-", "-"}; strings.Join(f, " ") != strings.Join(want, " ") {
					return fmt.Errorf("west listed as %q, want %q\n%s", line, strings.Join(want, " "), out)
				}
				return nil
			}
		}
		return fmt.Errorf("west not listed:\n%s", out)
	})
	runsIn := func(t *testing.T, n *testcluster.Nomad, region, id string) {
		t.Helper()
		ns := namespaceOf(id)
		testcluster.WaitFor(t, 60*time.Second, id+" running in "+region, func() error {
			stubs, _, err := n.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: ns})
			if err != nil {
				return err
			}
			for _, s := range stubs {
				if s.ClientStatus == api.AllocClientStatusRunning {
					return nil
				}
			}
			return fmt.Errorf("%d allocations in %s, none running", len(stubs), region)
		})
	}
	// inRegion and autoSpec write a jobspec with e, the caller's env (a
	// subtest's, bound to its t).
	inRegion := func(e *env, id, region string, gpus int) string {
		path := e.spec("vision", id, 1, gpus, "")
		spec, err := os.ReadFile(path)
		if err != nil {
			e.t.Fatal(err)
		}
		writeFile(e.t, path, strings.Replace(string(spec), "\n", fmt.Sprintf("\n  region = %q\n", region), 1))
		return path
	}
	// autoSpec is a jobspec of id that leaves its region to the broker.
	autoSpec := func(e *env, id string, gpus int, queue string) string {
		path := e.spec(namespaceOf(id), id, 1, gpus, queue)
		spec, err := os.ReadFile(path)
		if err != nil {
			e.t.Fatal(err)
		}
		writeFile(e.t, path, strings.Replace(string(spec), `meta = {`, `meta = { "nomad-gpu.region" = "auto",`, 1))
		return path
	}

	if out, err := e.run("vision", "e1", 1, 2, "", false); err != nil {
		t.Fatalf("e1 (east, 2 GPUs): %v\n%s", err, out)
	}
	if out, err := e.nomadCLI("job", "run", inRegion(e, "w1", "west", 2)); err != nil {
		t.Fatalf("w1 (west, 2 GPUs): %v\n%s", err, out)
	}
	runsIn(t, east, "east", "e1")
	runsIn(t, west, "west", "w1")
	if _, _, err := east.API.Jobs().Info("w1", &api.QueryOptions{Namespace: "vision", Region: "east"}); err == nil {
		t.Error("w1 registered in east too")
	}
	e.waitUsed("vision", 4)

	// A fifth GPU is over the limit: in east, whose node has 2 GPUs free, it
	// is queued.
	id := e.queuedIn("vision", "e2", 1, true)
	out, err := e.nomadCLI("job", "run", "-detach", inRegion(e, "w2", "west", 1))
	if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") {
		t.Fatalf("w2 (west, 1 GPU) at vision's limit: want queued: %v\n%s", err, out)
	}
	// West frees 2 GPUs: the queue admits both, each in its own region.
	if _, _, err := west.API.Jobs().Deregister("w1", false, &api.WriteOptions{Namespace: "vision"}); err != nil {
		t.Fatal(err)
	}
	runsIn(t, east, "east", "e2")
	runsIn(t, west, "west", "w2")
	if got := e.brokerCLI("queue", "list"); strings.Contains(got, id) {
		t.Errorf("e2 still queued:\n%s", got)
	}
	e.waitUsed("vision", 4)

	t.Run("a job no node of its region fits is refused at once", func(t *testing.T) {
		e := e.in(t)
		// East's node has 4 GPUs, west's 2: a job is decided on its own region's nodes.
		out, err := e.nomadCLI("job", "run", inRegion(e, "w3", "west", 3))
		if err == nil || !strings.Contains(out, "no node has more than 2") {
			t.Fatalf("3 GPUs in west, whose node has 2: want refused, no node fits: %v\n%s", err, out)
		}
	})
	t.Run("a region the broker does not govern is refused", func(t *testing.T) {
		e := e.in(t)
		out, err := e.nomadCLI("job", "run", inRegion(e, "x1", "south", 1))
		if err == nil || !strings.Contains(out, `is for region "south"`) {
			t.Fatalf("a job for region south: want refused by the broker: %v\n%s", err, out)
		}
	})
	// dubGone waits until no allocation of dub's holds a GPU in either
	// region (a purged job's tasks take seconds to stop): the subtests after
	// dub's count on every GPU it used being free.
	dubGone := func(e *env) {
		e.t.Helper()
		e.waitUsed("dub", 0)
		testcluster.WaitFor(e.t, 60*time.Second, "dub's allocations ended", func() error {
			for name, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
				allocs, _, err := n.API.Allocations().List(&api.QueryOptions{Namespace: "dub", Region: name})
				if err != nil {
					return err
				}
				for _, a := range allocs {
					if a.ClientStatus == api.AllocClientStatusRunning || a.ClientStatus == api.AllocClientStatusPending {
						return fmt.Errorf("%s's allocation in %s is %s", a.JobID, name, a.ClientStatus)
					}
				}
			}
			return nil
		})
	}
	// R1, R1b: Nomad acts in the region a job call's body names when its
	// query names none. A revert naming west in its body was decided on
	// east's GPU-less job of the same id, and Nomad reverted west's past
	// dub's cap there; a dispatch so made a child in west at every call.
	// Both are decided in west now.
	t.Run("a revert and a dispatch are decided in the region their body names", func(t *testing.T) {
		e := e.in(t)
		dub := func(id, region string, count, gpus int) string {
			path := e.spec("dub", id, count, gpus, "")
			spec, _ := os.ReadFile(path)
			writeFile(t, path, strings.Replace(string(spec), "\n", fmt.Sprintf("\n  region = %q\n", region), 1))
			return path
		}
		// rv's second version keeps its GPU group at count 0: admitted and
		// stamped, so that the first version's allocation, stopping, is
		// not read as unadmitted work (enforced here) meanwhile.
		for _, c := range []struct {
			id, region  string
			count, gpus int
		}{{"rv", "west", 1, 1}, {"rv", "west", 0, 1}, {"cap", "west", 1, 1}, {"rv", "east", 1, 0}} {
			if out, err := e.nomadCLI("job", "run", "-detach", dub(c.id, c.region, c.count, c.gpus)); err != nil || !strings.Contains(out, "admitted") && c.gpus > 0 {
				t.Fatalf("%s in %s (%d × %d GPUs): %v\n%s", c.id, c.region, c.count, c.gpus, err, out)
			}
			if c.count == 0 {
				// West's second GPU is cap's only once rv's first
				// allocation has stopped: before, cap would queue.
				e.waitUsed("dub", 0)
			}
		}
		e.waitUsed("dub", 1) // cap's: dub at its cap in west
		status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/revert", `{"JobID": "rv", "JobVersion": 0, "Namespace": "dub", "Region": "west"}`)
		// West is full: refused there, whether for the cap or for no idle
		// GPU to borrow (east's rv, of no GPU, would pass).
		if status != http.StatusForbidden || !strings.Contains(out, `revert of "rv" refused: `) {
			t.Errorf("a revert of west's rv to 1 GPU beside cap's, cap 1 in west: want 403; got %d %s", status, out)
		}
		// In both, disagreeing: Nomad takes the query's (parseWriteRequest
		// overrides the body's), and so does the broker.
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/revert?region=west", `{"JobID": "rv", "JobVersion": 0, "Namespace": "dub", "Region": "east"}`)
		if status != http.StatusForbidden || !strings.Contains(out, `revert of "rv" refused: `) {
			t.Errorf("a revert naming west in the query and east in the body: want 403, decided in west; got %d %s", status, out)
		}
		send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/revert?region=east", `{"JobID": "rv", "JobVersion": 0, "Namespace": "dub", "Region": "west"}`)
		// R1c: marking west's version 0 stable makes it west's current one
		// (Nomad copies it back); east's decoy is at version 0, where
		// stable changes nothing. Decided on west's, it is refused, and
		// the evaluation after it places nothing.
		status, out = send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/stable", `{"JobID": "rv", "JobVersion": 0, "Stable": true, "Namespace": "dub", "Region": "west"}`)
		if status != http.StatusForbidden || !strings.Contains(out, `marking version 0 of "rv" stable or not refused`) {
			t.Errorf("stable on west's version 0, named by the body: want 403; got %d %s", status, out)
		}
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/rv/evaluate", `{"JobID": "rv", "Namespace": "dub", "Region": "west"}`); status != http.StatusOK {
			t.Errorf("an evaluation of west's rv, at count 0: %d %s", status, out)
		}
		time.Sleep(2 * time.Second) // an evaluation places within this
		// Its GPUs, not its version: the broker's own moves (a sub-band, a
		// pin) register versions of their own.
		if j, _, err := west.API.Jobs().Info("rv", &api.QueryOptions{Namespace: "dub"}); err != nil || gpusOf(j) != 0 {
			t.Errorf("Nomad made west's rv a version with GPUs (%v)", err)
		}
		for region, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
			for _, id := range []string{"rv", "cap"} {
				n.API.Jobs().Deregister(id, true, &api.WriteOptions{Namespace: "dub", Region: region})
			}
		}
		e.waitUsed("dub", 0)

		// A parameterized parent in west (a child of 1 GPU), and a GPU-less
		// one of the same id in east: the second child is beyond dub's cap
		// of 1 in west.
		for _, c := range []struct {
			region string
			gpus   int
		}{{"west", 1}, {"east", 0}} {
			path := dub("pa", c.region, 1, c.gpus)
			spec, _ := os.ReadFile(path)
			writeFile(t, path, strings.Replace(string(spec), `type        = "batch"`, "type        = \"batch\"\n  parameterized {}", 1))
			if out, err := e.nomadCLI("job", "run", "-detach", path); err != nil {
				t.Fatalf("parent pa in %s: %v\n%s", c.region, err, out)
			}
		}
		for i, want := range []int{http.StatusOK, http.StatusForbidden} {
			if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/pa/dispatch", `{"Namespace": "dub", "Region": "west"}`); status != want {
				t.Errorf("dispatch %d of west's pa, named by the body: %d %s, want %d", i+1, status, out, want)
			}
		}
		if kids, _, err := west.API.Jobs().List(&api.QueryOptions{Namespace: "dub", Prefix: "pa/dispatch-"}); err != nil || len(kids) != 1 {
			t.Errorf("west has %d children of pa, want 1 (%v)", len(kids), err)
		}
		for region, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
			kids, _, _ := n.API.Jobs().List(&api.QueryOptions{Namespace: "dub", Prefix: "pa", Region: region})
			for _, k := range kids {
				n.API.Jobs().Deregister(k.ID, true, &api.WriteOptions{Namespace: "dub", Region: region})
			}
		}
		dubGone(e)
	})
	// P5: a job admitted in east, its stored JSON registered straight in
	// west: the stamp binds the region Nomad stores the job in, so the
	// copy is not the broker's admission (here enforced: stopped).
	t.Run("an east job's stamp on a copy in west is not an admission", func(t *testing.T) {
		e := e.in(t)
		// A service job: the broker pins a batch job to the nodes it chose
		// (placement mode broker), and a copy of that pin in west places
		// nothing.
		path := e.spec("dub", "p5", 1, 1, "")
		spec, _ := os.ReadFile(path)
		writeFile(t, path, strings.Replace(string(spec), `type        = "batch"`, `type        = "service"`, 1))
		if out, err := e.nomadCLI("job", "run", "-detach", path); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("p5 (east, 1 GPU): %v\n%s", err, out)
		}
		stored, _, err := east.API.Jobs().Info("p5", &api.QueryOptions{Namespace: "dub"})
		if err != nil {
			t.Fatal(err)
		}
		stored.Region = ptr("west")
		if _, _, err := west.API.Jobs().Register(stored, &api.WriteOptions{Region: "west"}); err != nil {
			t.Fatalf("p5's copy straight in west: %v", err)
		}
		testcluster.WaitFor(t, 60*time.Second, "the copy in west read as unadmitted", func() error {
			if !e.unadmitted("dub", "p5") {
				return errors.New("no unadmitted decision on p5")
			}
			return nil
		})
		if j, _, err := east.API.Jobs().Info("p5", &api.QueryOptions{Namespace: "dub"}); err != nil || *j.Stop {
			t.Errorf("east's p5, the broker's admission, was stopped (%v)", err)
		}
		for region, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
			n.API.Jobs().Deregister("p5", true, &api.WriteOptions{Namespace: "dub", Region: region})
		}
		dubGone(e)
	})
	// D4: the broker's records of a job are its region's. A stop of west's
	// d4 is not a stop of east's job of the same id: east's d4, scaled
	// through the broker afterwards, is its admission (here enforced: a
	// scale read as unadmitted would be stopped).
	t.Run("a stop in one region is not one of another's job of the same id", func(t *testing.T) {
		e := e.in(t)
		for _, c := range []struct {
			region string
			count  int
		}{{"west", 0}, {"east", 1}} {
			path := e.spec("dub", "d4", c.count, 1, "")
			spec, _ := os.ReadFile(path)
			writeFile(t, path, strings.Replace(string(spec), "\n", fmt.Sprintf("\n  region = %q\n", c.region), 1))
			if out, err := e.nomadCLI("job", "run", "-detach", path); err != nil || !strings.Contains(out, "admitted") {
				t.Fatalf("d4 in %s (%d x 1 GPU): %v\n%s", c.region, c.count, err, out)
			}
		}
		running := func(want int) {
			t.Helper()
			testcluster.WaitFor(t, 60*time.Second, fmt.Sprintf("east's d4 at %d", want), func() error {
				allocs, _, err := east.API.Jobs().Allocations("d4", false, &api.QueryOptions{Namespace: "dub", Region: "east"})
				n := 0
				for _, a := range allocs {
					if a.ClientStatus == api.AllocClientStatusRunning && a.DesiredStatus == api.AllocDesiredStatusRun {
						n++
					}
				}
				if err != nil || n != want {
					return fmt.Errorf("%d running (%v)", n, err)
				}
				return nil
			})
		}
		running(1)
		if _, _, err := west.API.Jobs().Deregister("d4", false, &api.WriteOptions{Namespace: "dub", Region: "west"}); err != nil {
			t.Fatal(err)
		}
		testcluster.WaitFor(t, 30*time.Second, "west's stop of d4 recorded", func() error {
			if p, _, err := consulKV(consul).Get("nomad-gpu/stopped/west/dub/d4", nil); err != nil || p == nil {
				return fmt.Errorf("no record (%v)", err)
			}
			return nil
		})
		// Two regions' indexes do not compare: east's is taken past west's
		// stop, as it may well be, so that a record keyed without a region
		// would read east's scale as a version registered after the stop.
		stopped, _, err := west.API.Jobs().Info("d4", &api.QueryOptions{Namespace: "dub", Region: "west"})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			wrote, err := east.API.Namespaces().Register(&api.Namespace{Name: "dub", Description: fmt.Sprint(i)}, &api.WriteOptions{Region: "east"})
			if err != nil || i > 1000 {
				t.Fatalf("east's index not past west's stop at %d (%v)", *stopped.JobModifyIndex, err)
			}
			if wrote.LastIndex > *stopped.JobModifyIndex {
				break
			}
		}
		// East has one GPU idle beside vision's: the scale keeps the count,
		// and Nomad makes a new version of the job all the same.
		if status, out := send(t, e.broker.Addr, http.MethodPut, "/v1/job/d4/scale?namespace=dub", `{"Count": 1, "Target": {"Group": "g"}}`); status != http.StatusOK {
			t.Fatalf("east's d4 scaled through the broker: %d %s", status, out)
		}
		waitPasses(t, e.broker, metrics.LoopReclaim, 3)
		if e.unadmitted("dub", "d4") {
			t.Errorf("east's d4, scaled through the broker, read as unadmitted after west's stop")
		}
		if j, _, err := east.API.Jobs().Info("d4", &api.QueryOptions{Namespace: "dub", Region: "east"}); err != nil || *j.Stop {
			t.Errorf("east's d4 was stopped (%v)", err)
		}
		for region, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
			n.API.Jobs().Deregister("d4", true, &api.WriteOptions{Namespace: "dub", Region: region})
		}
		dubGone(e)
	})
	// over_limit knows region caps: a cap lowered below what the tenant
	// holds there has its work there requeued after the grace.
	t.Run("a region's cap lowered below what a tenant holds there: its work there is requeued", func(t *testing.T) {
		e := e.in(t)
		path := e.spec("dub", "dc", 1, 1, "")
		spec, _ := os.ReadFile(path)
		writeFile(t, path, strings.Replace(string(spec), "\n", "\n  region = \"west\"\n", 1))
		if out, err := e.nomadCLI("job", "run", "-detach", path); err != nil || !strings.Contains(out, "admitted") {
			t.Fatalf("dc in west (1 GPU, dub's cap there 1): %v\n%s", err, out)
		}
		runsIn(t, west, "west", "dc")
		policyFile := filepath.Join(e.policyDir, "policy.hcl")
		lowered := strings.Replace(regionsPolicy, "region \"west\" {\n    limit = 1", "region \"west\" {\n    limit = 0", 1) + "over_limit_grace = \"1s\"\n"
		writeFile(t, policyFile, lowered)
		defer writeFile(t, policyFile, regionsPolicy)
		testcluster.WaitFor(t, 60*time.Second, "dc requeued from west", func() error {
			j, _, err := west.API.Jobs().Info("dc", &api.QueryOptions{Namespace: "dub", Region: "west"})
			if err != nil || j.Stop == nil || !*j.Stop {
				return fmt.Errorf("dc not stopped (%v)", err)
			}
			return nil
		})
		var recs []reclaim.Record
		if err := json.Unmarshal([]byte(e.brokerCLI("reclaim", "list", "-json")), &recs); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range recs {
			found = found || r.Rule == "over-limit" && r.Job == "dc" && r.Region == "west" && strings.Contains(r.Evidence, "above its cap of 0 in region west")
		}
		if !found {
			t.Errorf("no over-limit decision on dc for west's cap: %+v", recs)
		}
		writeFile(t, policyFile, regionsPolicy)
		testcluster.WaitFor(t, 30*time.Second, "dub's cap in west back to 1", func() error {
			if out := e.brokerCLI("queue", "list"); strings.Contains(out, "dc") {
				return errors.New("dc still queued: " + out)
			}
			return nil
		})
		for region, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
			n.API.Jobs().Deregister("dc", true, &api.WriteOptions{Namespace: "dub", Region: region})
		}
		dubGone(e)
	})
	t.Run("a job that leaves its region to the broker runs in exactly one", func(t *testing.T) {
		e := e.in(t)
		for _, stop := range []struct {
			n  *testcluster.Nomad
			id string
		}{{east, "e1"}, {east, "e2"}, {west, "w2"}} {
			if _, _, err := stop.n.API.Jobs().Deregister(stop.id, false, &api.WriteOptions{Namespace: "vision"}); err != nil {
				t.Fatal(err)
			}
		}
		e.waitUsed("vision", 0)
		// auto submits an auto job; detached unless follow (nomad job run
		// then follows its evaluation by id, through the broker, with no region).
		auto := func(id string, gpus int, queue string, follow ...bool) string {
			path := autoSpec(e, id, gpus, queue)
			args := []string{"job", "run", "-detach", path}
			if len(follow) > 0 {
				args = []string{"job", "run", path}
			}
			out, err := e.nomadCLI(args...)
			if err != nil {
				t.Fatalf("%s (auto, %d GPUs, queue %s): %v\n%s", id, gpus, queue, err, out)
			}
			return out
		}
		// only checks that id is registered in the one region, as the broker chose.
		only := func(id, in string) {
			t.Helper()
			for name, n := range map[string]*testcluster.Nomad{"east": east, "west": west} {
				job, _, err := n.API.Jobs().Info(id, &api.QueryOptions{Namespace: "audio", Region: name})
				switch {
				case name != in && err == nil:
					t.Errorf("%s registered in %s too", id, name)
				case name == in && err != nil:
					t.Errorf("%s not registered in %s: %v", id, name, err)
				case name == in && (job.Meta["nomad-gpu.dispatched-region"] != in || *job.Region != in || job.Meta["nomad-gpu.region"] != "auto"):
					t.Errorf("%s in %s: region %q, meta %v; want region and nomad-gpu.dispatched-region %q, nomad-gpu.region auto", id, name, *job.Region, job.Meta, in)
				}
			}
		}
		// East has 4 free GPUs, west 2: ordered takes the broker's own region,
		// the first that admits it, and looks no further.
		if out := auto("a1", 3, "training"); !strings.Contains(out, "nomad-gpu: dispatched to region east (dispatch ordered)\n") {
			t.Errorf("a1: want the answer to say it went to east:\n%s", out)
		}
		runsIn(t, east, "east", "a1")
		only("a1", "east")
		// East has 1 free, west 2: both admit; best_fit takes the freer. As
		// the broker sees them: a stopped allocation of the subtests before
		// holds its GPU in the broker's view until Nomad says it ended.
		testcluster.WaitFor(t, 60*time.Second, "the broker seeing 1 GPU free in east and 2 in west", func() error {
			free := map[string]string{}
			out := e.brokerCLI("region", "list")
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) >= 8 { // ... FREE DRAINED UNREACHABLE, neither of the last two set here
					free[f[0]] = f[len(f)-3]
				}
			}
			if free["east"] != "1" || free["west"] != "2" {
				return fmt.Errorf("free: east %q, west %q\n%s", free["east"], free["west"], out)
			}
			return nil
		})
		if out := auto("a2", 1, "serving", true); !strings.Contains(out, "nomad-gpu: dispatched to region west (dispatch best_fit)") ||
			!strings.Contains(out, `finished with status "complete"`) {
			t.Errorf("a2: want the answer to say best_fit chose west, and its evaluation followed:\n%s", out)
		}
		runsIn(t, west, "west", "a2")
		only("a2", "west")
		// 2 GPUs fit no node now in either region: queued, each region's
		// reason told; the region that frees GPUs first takes it.
		out := auto("a3", 2, "training")
		if !strings.Contains(out, "nomad-gpu: queued as ") || !strings.Contains(out, "no region admits it now: east: ") || !strings.Contains(out, "; west: ") {
			t.Errorf("a3: want queued, with east's and west's reasons:\n%s", out)
		}
		if got := queuedRegions(t, e); got["a3"] != "auto" {
			t.Errorf("a3 queued with region %q, want auto", got["a3"])
		}
		if _, _, err := west.API.Jobs().Deregister("a2", false, &api.WriteOptions{Namespace: "audio"}); err != nil {
			t.Fatal(err)
		}
		runsIn(t, west, "west", "a3")
		only("a3", "west")
		// Read through the broker with no -region, as users do.
		if out, err := e.nomadCLI("job", "status", "-namespace", "audio", "a3"); err != nil || !strings.Contains(out, "running") {
			t.Errorf("nomad job status a3 (in west) with no region: want found and running: %v\n%s", err, out)
		}
		e.waitUsed("audio", 5)
		// 5 GPUs fit no node of any region: refused at once, per region.
		if out, err := e.nomadCLI("job", "run", autoSpec(e, "a4", 5, "training")); err == nil || !strings.Contains(out, "no region this broker governs can take it: east: ") {
			t.Errorf("a4 (auto, 5 GPUs): want refused, no region fits: %v\n%s", err, out)
		}
	})
	t.Run("a drained region takes no new work until it resumes", func(t *testing.T) {
		e := e.in(t)
		for _, stop := range []struct {
			n  *testcluster.Nomad
			id string
		}{{east, "a1"}, {west, "a3"}} {
			if _, _, err := stop.n.API.Jobs().Deregister(stop.id, false, &api.WriteOptions{Namespace: "audio"}); err != nil {
				t.Fatal(err)
			}
		}
		e.waitUsed("audio", 0)
		// a3, dispatched to west, has ended: still found there with no -region.
		testcluster.WaitFor(t, 30*time.Second, "a3, stopped in west, read with no region", func() error {
			if out, err := e.nomadCLI("job", "status", "-namespace", "audio", "a3"); err != nil || !strings.Contains(out, "dead (stopped)") {
				return fmt.Errorf("nomad job status a3: %v\n%s", err, out)
			}
			return nil
		})
		if out := e.brokerCLI("region", "drain", "east"); !strings.Contains(out, "by anonymous at ") {
			t.Fatalf("gpu-broker region drain east: want east listed as drained:\n%s", out)
		}
		// An auto job passes the drained region over; one for it waits.
		if out, err := e.nomadCLI("job", "run", "-detach", autoSpec(e, "a5", 1, "training")); err != nil || !strings.Contains(out, "dispatched to region west (dispatch ordered; not east: drained (by anonymous at ") {
			t.Errorf("a5 (auto) with east drained: want it sent to west: %v\n%s", err, out)
		}
		runsIn(t, west, "west", "a5")
		out, err := e.run("vision", "e5", 1, 1, "", true)
		if err != nil || !strings.Contains(out, "nomad-gpu: queued as ") || !strings.Contains(out, "region east is drained (by anonymous at ") {
			t.Fatalf("e5 in drained east: want queued, saying east is drained: %v\n%s", err, out)
		}
		if got := queuedRegions(t, e); got["e5"] != "east" {
			t.Errorf("e5 queued with region %q, want east", got["e5"])
		}
		if out := e.brokerCLI("region", "resume", "east"); strings.Contains(out, "by anonymous") {
			t.Errorf("gpu-broker region resume east: want no region drained:\n%s", out)
		}
		runsIn(t, east, "east", "e5")
	})
	t.Run("the reclaim rules see every region, and act where the job runs", func(t *testing.T) {
		e := e.in(t)
		// Registered straight with west, past the broker: rule unadmitted
		// stops it there.
		if out, err := e.nomadCLI("job", "run", "-detach", "-address", west.Addr, inRegion(e, "bypass", "west", 1)); err != nil {
			t.Fatalf("bypass, straight to west: %v\n%s", err, out)
		}
		testcluster.WaitFor(t, 60*time.Second, "bypass stopped in west", func() error {
			job, _, err := west.API.Jobs().Info("bypass", &api.QueryOptions{Namespace: "vision"})
			if err != nil {
				return err
			}
			if job.Stop == nil || !*job.Stop {
				return fmt.Errorf("bypass runs in west")
			}
			return nil
		})
		waitTrail(t, e, "the stop", func(trail string) bool {
			return strings.Contains(trail, `"what":"reclaim-action"`) && strings.Contains(trail, `"job":"bypass","rule":"unadmitted","result":"executed stop`)
		})
	})
	t.Run("GPU time is counted in every region, and split by region", func(t *testing.T) {
		e := e.in(t)
		testcluster.WaitFor(t, 30*time.Second, "GPU-hours in east and west", func() error {
			var rep gpuapi.UsageReport
			out := e.brokerCLI("usage", "-from", time.Now().UTC().Format("2006-01-02"), "-by", "region", "-json")
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			hours := map[string]float64{}
			for _, r := range rep.Rows {
				hours[r.Group] = r.AllocatedHours
			}
			if len(hours) != 2 || hours["east"] <= 0 || hours["west"] <= 0 {
				return fmt.Errorf("allocated GPU-hours by region %v, want east's and west's", hours)
			}
			return nil
		})
		// West's alone, by tenant: audio ran a2, a3 and a5 there, vision w1
		// and w2. The job registered past the broker, of no tenant, may have
		// started before it was stopped; dub's short jobs there may be
		// charged or not, as the ledger's passes fell.
		var west gpuapi.UsageReport
		out := e.brokerCLI("usage", "-from", time.Now().UTC().Format("2006-01-02"), "-region", "west", "-json")
		if err := json.Unmarshal([]byte(out), &west); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var tenants []string
		for _, r := range west.Rows {
			if r.Group != "" && r.Group != "dub" {
				tenants = append(tenants, r.Group)
			}
		}
		if west.Region != "west" || strings.Join(tenants, ",") != "audio,vision" {
			t.Errorf("usage -region west: %s; want audio's and vision's GPU-hours in west", out)
		}
	})
	t.Run("the web UI filters by region, and says where a decision acts", func(t *testing.T) {
		e := e.in(t)
		nodes, _, err := west.API.Nodes().List(nil)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("west's nodes: %v %v", nodes, err)
		}
		tab := browser.New(t)
		rows := "JSON.stringify([...document.querySelectorAll('#map-rows .row')].map(r => [r.dataset.node, r.dataset.gpus]))"
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#map")
		browser.WaitFor(t, tab, 20*time.Second, "both regions' nodes, and a region filter", `document.querySelectorAll('#map-rows .row').length == 2 && !document.getElementById('f-region-label').hidden`, rows)
		browser.Eval[bool](t, tab, `(() => { const s = document.getElementById('f-region'); s.value = 'west'; s.dispatchEvent(new Event('input')); return true; })()`)
		browser.WaitFor(t, tab, 10*time.Second, "west's node alone", fmt.Sprintf(`document.querySelectorAll('#map-rows .row').length == 1 && document.querySelector('#map-rows .row').dataset.node == %q`, nodes[0].Name), rows)
		if href := browser.Eval[string](t, tab, `document.querySelector('#map-rows .row a.node').getAttribute('href')`); !strings.HasSuffix(href, "?region=west") {
			t.Errorf("west's node links to %q, want Nomad's UI in region west", href)
		}
		// The decision on bypass, in west, says so and links there.
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#reclaim")
		browser.WaitFor(t, tab, 20*time.Second, "the decision on bypass, in west", `(() => { const a = document.querySelector('#decided tr[data-job="bypass"] a');
			return !!a && a.textContent == 'bypass (west)' && a.getAttribute('href').endsWith('?region=west'); })()`,
			`document.querySelector('#decided').outerHTML`)
		// The GPU-hours table, west's alone: its tenants' rows.
		browser.Navigate(t, tab, e.broker.Addr+"/gpu/#tenants")
		report := "JSON.stringify([...document.querySelectorAll('#report tbody tr')].map(r => r.dataset.tenant))"
		browser.WaitFor(t, tab, 20*time.Second, "a region filter on the GPU-hours", `!document.getElementById('p-region-label').hidden && document.querySelectorAll('#report tr[data-tenant]').length > 0`, report)
		for _, region := range []string{"east", "west"} {
			var rep gpuapi.UsageReport
			out := e.brokerCLI("usage", "-from", time.Now().UTC().Format("2006-01-02"), "-region", region, "-json")
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var tenants []string
			for _, r := range rep.Rows {
				tenants = append(tenants, r.Group)
			}
			want, _ := json.Marshal(tenants)
			browser.Eval[bool](t, tab, fmt.Sprintf(`(() => { const s = document.getElementById('p-region'); s.value = %q; s.dispatchEvent(new Event('change')); return true; })()`, region))
			browser.WaitFor(t, tab, 10*time.Second, region+"'s GPU-hours alone, as usage -region says", fmt.Sprintf("%s == %q", report, want), report)
		}
	})
	t.Run("a lost region's batch job is requeued elsewhere, and its stale copy stopped when the region is back", func(t *testing.T) {
		e := e.in(t)
		// a5 and s1 (auto, batch, 1 GPU each) run in west; speech holds
		// its limit of 2 with s2 in east. West goes down: after
		// region_lost_timeout (2s) the broker requeues both. The queue
		// dispatches a5 to east, the one region left; s1 waits, for its
		// copy in west may run still (and does, once west is back).
		e.brokerCLI("region", "drain", "east")
		if out, err := e.nomadCLI("job", "run", "-detach", autoSpec(e, "s1", 1, "training")); err != nil || !strings.Contains(out, "dispatched to region west") {
			t.Fatalf("s1 (auto) with east drained: want it sent to west: %v\n%s", err, out)
		}
		e.brokerCLI("region", "resume", "east")
		if out, err := e.run("speech", "s2", 1, 1, "", false); err != nil {
			t.Fatalf("s2 (east, 1 GPU): %v\n%s", err, out)
		}
		runsIn(t, west, "west", "s1")
		runsIn(t, east, "east", "s2")
		held := sampleHeld(t, map[string]*testcluster.Nomad{"east": east, "west": west})
		lost := time.Now()
		west.Down()
		testcluster.WaitFor(t, 90*time.Second, "west listed as unreachable", func() error {
			if out := e.brokerCLI("region", "list"); !strings.Contains(out, "since ") {
				return fmt.Errorf("west not unreachable:\n%s", out)
			}
			return nil
		})
		runsIn(t, east, "east", "a5")
		job, _, err := east.API.Jobs().Info("a5", &api.QueryOptions{Namespace: "audio"})
		if err != nil || job.Meta["nomad-gpu.dispatched-region"] != "east" || job.Meta["nomad-gpu.dispatch-id"] == "" {
			t.Fatalf("a5 in east: want dispatched there, with a dispatch id: %v %v", err, job)
		}
		waitTrail(t, e, "the requeue", func(trail string) bool {
			return strings.Contains(trail, `"what":"region-lost","id":"region-lost-west-`) && strings.Contains(trail, "past region_lost_timeout 2s")
		})
		t.Logf("a5 ran again in east %s after west went down", time.Since(lost).Round(time.Second))
		testcluster.WaitFor(t, 30*time.Second, "s1 requeued, waiting for west", func() error {
			if got := queuedRegions(t, e); len(got) != 1 || got["s1"] != "" {
				return fmt.Errorf("queued %v, want s1 alone, its region left to the broker", got)
			}
			return nil
		})
		if out, err := e.nomadCLI("job", "plan", autoSpec(e, "s1", 1, "training")); !strings.Contains(out, "counting 1 of its jobs' in regions the broker cannot reach") {
			t.Errorf("a plan of s1 while west is lost: want it held by its copy there: %v\n%s", err, out)
		}
		// West comes back, a5's and s1's copies there with it: the broker
		// stops a5's with the earlier dispatch id, withdraws s1's requeued
		// copy, and records why.
		west.Up()
		testcluster.WaitFor(t, 120*time.Second, "a5's stale copy in west stopped", func() error {
			job, _, err := west.API.Jobs().Info("a5", &api.QueryOptions{Namespace: "audio"})
			if err != nil {
				return err
			}
			if job.Stop == nil || !*job.Stop {
				return fmt.Errorf("a5 in west not stopped")
			}
			return nil
		})
		waitTrail(t, e, "the stale copy's stop", func(trail string) bool {
			return strings.Contains(trail, `"what":"region-stale"`) && strings.Contains(trail, "region west came back running a stale copy")
		})
		runsIn(t, east, "east", "a5")
		// s1's requeued copy is withdrawn, or, should a queue pass come
		// first, sent where the job runs: either way it runs once, in west.
		testcluster.WaitFor(t, 30*time.Second, "s1's requeued copy settled", func() error {
			if got := queuedRegions(t, e); len(got) > 0 {
				return fmt.Errorf("queued %v, want none", got)
			}
			return nil
		})
		waitTrail(t, e, "s1's requeued copy withdrawn, or sent to west where it runs,", func(trail string) bool {
			return strings.Contains(trail, "region west came back running the job: its requeued copy, still queued, withdrawn") ||
				regexp.MustCompile(`"job":"s1",[^\n]*dispatched to region west, where the job runs`).MatchString(trail)
		})
		runsIn(t, west, "west", "s1")
		if _, _, err := east.API.Jobs().Info("s1", &api.QueryOptions{Namespace: "speech"}); err == nil {
			t.Error("s1 registered in east too")
		}
		most, samples := held()
		if samples < 20 || most["speech"] != 2 {
			t.Errorf("%d samples, speech at most %v; want 20 or more, speech at its limit", samples, most["speech"])
		}
	})
}

// sampleHeld samples, every 200 ms, the GPUs each namespace holds over
// regions (one that cannot be asked counted as last seen) and fails t if a
// tenant of TestRegions' policy holds more than its limit at any sample.
// Its result ends the sampling and says the most each namespace held, and
// in how many samples.
func sampleHeld(t *testing.T, regions map[string]*testcluster.Nomad) func() (map[string]int, int) {
	limits := map[string]int{"vision": 4, "audio": 6, "speech": 2, "dub": 2}
	most, samples, over := map[string]int{}, 0, map[string]bool{}
	seen := map[string]map[string]int{}         // by region
	holders := map[string]map[string][]string{} // by region
	sample := func() {
		for name, n := range regions {
			if used, by, err := gpusHeld(n); err == nil {
				seen[name], holders[name] = used, by
			}
		}
		samples++
		sum, by := map[string]int{}, map[string][]string{}
		for region, used := range seen {
			for ns, gpus := range used {
				sum[ns] += gpus
				by[ns] = append(by[ns], fmt.Sprintf("%s: %s", region, strings.Join(holders[region][ns], ", ")))
			}
		}
		for ns, gpus := range sum {
			most[ns] = max(most[ns], gpus)
			if gpus > limits[ns] && !over[ns] { // the first sample above it tells the cause
				over[ns] = true
				t.Errorf("at %s %s holds %d GPUs over both regions, above its limit of %d: %s", time.Now().Format("15:04:05.000"), ns, gpus, limits[ns], strings.Join(by[ns], "; "))
			}
		}
	}
	sample() // every region seen before the caller takes one down
	if len(seen) != len(regions) {
		t.Fatalf("sampling: %d of %d regions answered", len(seen), len(regions))
	}
	stop, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(stop); <-done }) }
	t.Cleanup(end) // a test that fails early ends the sampling too
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			sample()
		}
	}()
	return func() (map[string]int, int) {
		end()
		return most, samples
	}
}

// namespaceOf is the namespace of a job of TestRegions, by its id's first
// letter: audio's, speech's or vision's.
func namespaceOf(id string) string {
	switch id[0] {
	case 'a':
		return "audio"
	case 's':
		return "speech"
	case 'd':
		return "dub"
	}
	return "vision"
}

// waitTrail waits for the broker's audit trail to show what (ok): an act is
// written there once done, which Nomad or the queue may show first.
func waitTrail(t *testing.T, e *env, what string, ok func(trail string) bool) {
	t.Helper()
	testcluster.WaitFor(t, 10*time.Second, what+" in the audit trail", func() error {
		if trail := auditTrail(t, e); !ok(trail) {
			return fmt.Errorf("not there:\n%s", trail)
		}
		return nil
	})
}

// auditTrail is the broker's audit trail as written so far.
func auditTrail(t *testing.T, e *env) string {
	t.Helper()
	trail, err := os.ReadFile(e.broker.AuditPath())
	if err != nil {
		t.Fatal(err)
	}
	return string(trail)
}

// queuedRegions are the queued jobs' regions, by job id.
func queuedRegions(t *testing.T, e *env) map[string]string {
	t.Helper()
	var entries []gpuapi.QueuedJob
	if out := e.brokerCLI("queue", "list", "-json"); json.Unmarshal([]byte(out), &entries) != nil {
		t.Fatalf("gpu-broker queue list -json: %s", out)
	}
	out := map[string]string{}
	for _, q := range entries {
		out[q.JobID] = q.Region
	}
	return out
}
