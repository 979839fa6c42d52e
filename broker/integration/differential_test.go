package integration

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
	"github.com/nomad-gpu/nomad-gpu/testing/testcluster"
)

// The gate's differential test: a generated corpus of job requests goes
// through the broker to a real Nomad with plenty of GPUs on two nodes. For
// every request the GPUs Nomad allocates (or plans to) must equal what the
// broker charged, at the broker's priority, in the namespace the broker
// decided on. A request the broker refuses must leave nothing in Nomad.

const diffPolicy = `
queue "training" { priority = 60 }
queue "inference" { priority = 60 } # one band: Nomad must not preempt one case for another
tenant "diff" {
  namespaces = ["diff", "diff-b"]
  queues     = ["training"]
  guaranteed = 10000
  limit      = 10000
}
tenant "other" {
  namespaces = ["other"]
  queues     = ["inference"]
  guaranteed = 10000
  limit      = 10000
}
`

// diffGPUsPerNode is generous: every request in the corpus fits at once.
const diffGPUsPerNode = 512

type diffEnv struct {
	t      *testing.T
	nomad  *testcluster.Nomad
	broker *testcluster.Broker
}

// in is e bound to a subtest's t, as env.in.
func (e *diffEnv) in(t *testing.T) *diffEnv {
	c := *e
	c.t = t
	return &c
}

func TestGateDifferential(t *testing.T) {
	t.Parallel()
	consul := testcluster.StartConsul(t)
	plugin := func(prefix string) string {
		return fmt.Sprintf(`
    backend            = "fake"
    fingerprint_period = "2s"
    stats_period       = "30s" # 512 GPUs a node: the comparison reads no stats
    fake {
      count     = %d
      id_prefix = %q
    }`, diffGPUsPerNode, prefix)
	}
	n := testcluster.StartNomad(t, testcluster.NomadOptions{Name: "diff-1", Server: true, Client: true,
		ConsulAddr: consul.Addr, PluginConfig: plugin("d1")})
	testcluster.StartNomad(t, testcluster.NomadOptions{Name: "diff-2", Client: true, Join: []string{n.RPCAddr},
		ConsulAddr: consul.Addr, PluginConfig: plugin("d2")})
	n.WaitForNodes(t, 2)
	for _, ns := range []string{"diff", "diff-b", "other", "free"} {
		if _, err := n.API.Namespaces().Register(&api.Namespace{Name: ns}, nil); err != nil {
			t.Fatal(err)
		}
	}
	policyDir := t.TempDir()
	writeFile(t, filepath.Join(policyDir, "policy.hcl"), diffPolicy)
	d := &diffEnv{t: t, nomad: n, broker: testcluster.StartBroker(t, n, consul, policyDir)}
	testcluster.WaitFor(t, 60*time.Second, "broker to see both nodes' GPUs", func() error {
		probe := job("diff", "probe", api.JobTypeSystem).group("g", ptr(1), nil, task(dev("gpu", 1))).body(nil, canonical)
		status, out := d.send(http.MethodPut, "/v1/job/probe/plan", probe)
		if status != http.StatusOK || !strings.Contains(out, ", 2 GPUs,") {
			return fmt.Errorf("plan of a one-GPU system job: %d %s", status, out)
		}
		return nil
	})

	var checks []diffCheck
	rng := rand.New(rand.NewSource(20261130))
	for i := 0; i < 40; i++ {
		checks = append(checks, d.generated(rng, i))
	}
	checks = append(checks, d.special()...)
	// Each check has a job of its own: verify them 4 at a time (each mostly
	// waits for Nomad's placements to settle).
	var wg sync.WaitGroup
	slots := make(chan struct{}, 4)
	for _, c := range checks {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			t.Run(c.name, func(t *testing.T) { d.verify(t, c) })
		}()
	}
	wg.Wait()
	t.Run("every job write on every job state", d.routesOnStates)
}

// diffCheck is one request sent and what to compare afterwards.
type diffCheck struct {
	name    string
	request string // what was sent, for the failure message
	status  int
	answer  string
	ns, id  string // where Nomad must have the job when admitted
	refused bool   // the broker must refuse it
	plan    bool   // a plan: compare with Nomad's planned placements
}

// generated builds a random request from the corpus dimensions, sends it, and
// returns what to check.
func (e *diffEnv) generated(rng *rand.Rand, i int) diffCheck {
	types := []string{api.JobTypeService, api.JobTypeBatch, api.JobTypeSystem, api.JobTypeSysbatch}
	typ := types[rng.Intn(len(types))]
	id := fmt.Sprintf("gen-%02d", i)
	system := typ == api.JobTypeSystem || typ == api.JobTypeSysbatch
	jb := job("", id, typ)
	for g := 0; g < 1+rng.Intn(2); g++ {
		var count *int
		var scaling *api.ScalingPolicy
		switch form := rng.Intn(4); {
		case typ == api.JobTypeSysbatch: // count on every node
			if rng.Intn(3) > 0 {
				count = ptr(1 + rng.Intn(3))
			}
		case system || form == 0:
			if rng.Intn(2) == 0 {
				count = ptr(1)
			}
		case form == 1:
			count = ptr(1 + rng.Intn(3))
		case form == 2: // no count: the scaling block's min
			scaling = &api.ScalingPolicy{Min: ptr(int64(1 + rng.Intn(3))), Max: ptr(int64(5))}
		default:
			count = ptr(1 + rng.Intn(2))
			scaling = &api.ScalingPolicy{Min: ptr(int64(1)), Max: ptr(int64(5))}
		}
		var tasks []*api.Task
		for k := 0; k < 1+rng.Intn(2); k++ {
			var devs []*api.RequestedDevice
			for d := 0; d < 1+rng.Intn(2); d++ {
				devs = append(devs, dev(deviceForms[rng.Intn(len(deviceForms))], uint64(1+rng.Intn(2))))
			}
			tasks = append(tasks, task(devs...))
		}
		jb.group(fmt.Sprintf("g%d", g), count, scaling, tasks...)
	}
	// Where the namespace comes from, and which one Nomad will use.
	extra := map[string]any{}
	query := ""
	ns := "diff"
	switch rng.Intn(5) {
	case 0:
		jb.j.Namespace = ptr("diff")
	case 1:
		extra["Namespace"] = "diff-b"
		ns = "diff-b"
	case 2:
		query = "?namespace=diff-b"
		ns = "diff-b"
	case 3: // the query wins over the job's own, which belongs to no tenant
		jb.j.Namespace = ptr("free")
		query = "?namespace=other"
		ns = "other"
	default: // the body's wins over the job's
		jb.j.Namespace = ptr("other")
		extra["Namespace"] = "diff"
	}
	if rng.Intn(2) == 0 {
		jb.j.Priority = ptr(99) // never survives
		jb.j.Meta = map[string]string{"nomad-gpu.borrowed": "true", "NOMAD-GPU.tenant": "other", "team": "cv"}
	}
	style := styles[rng.Intn(len(styles))]
	body := jb.body(extra, style)
	routes := []string{"PUT /v1/jobs", "POST /v1/jobs", "PUT /v1/job/" + id, "POST /v1/job/" + id, "PUT /v1/job/"}
	method, path, _ := strings.Cut(routes[rng.Intn(len(routes))], " ")
	status, answer := e.send(method, path+query, body)
	return diffCheck{name: id, request: method + " " + path + query + " " + body, status: status, answer: answer, ns: ns, id: id}
}

// special are the cases that need a current version, a second call, or must
// be refused.
func (e *diffEnv) special() []diffCheck {
	var out []diffCheck
	send := func(name, method, path, body, ns, id string, refused bool) {
		status, answer := e.send(method, path, body)
		out = append(out, diffCheck{name: name, request: method + " " + path + " " + body, status: status, answer: answer,
			ns: ns, id: id, refused: refused, plan: strings.HasSuffix(path, "/plan")})
	}
	must := func(method, path, body string) {
		if status, answer := e.send(method, path, body); status != http.StatusOK {
			e.t.Fatalf("%s %s: %d %s", method, path, status, answer)
		}
	}

	// Canaries of a service update run beside the current allocations.
	web := func(env string) string {
		jb := job("diff", "canary", api.JobTypeService).group("web", ptr(2), nil, task(dev("nvidia/gpu", 1)))
		jb.j.Update = &api.UpdateStrategy{Canary: ptr(1), AutoPromote: ptr(false), MaxParallel: ptr(1)}
		jb.j.TaskGroups[0].Tasks[0].Env = map[string]string{"V": env}
		return jb.body(nil, canonical)
	}
	must(http.MethodPut, "/v1/jobs", web("1"))
	e.waitAllocated("diff", "canary", 2)
	send("canary update", http.MethodPut, "/v1/jobs", web("2"), "diff", "canary", false)

	// PreserveCounts keeps the running count, not the body's.
	scaled := func(count int) *jobBuilder {
		return job("diff", "preserve", api.JobTypeService).group("g", ptr(count), nil, task(dev("gpu", 2)))
	}
	must(http.MethodPut, "/v1/jobs", scaled(3).body(nil, canonical))
	e.waitAllocated("diff", "preserve", 6)
	send("PreserveCounts", http.MethodPut, "/v1/jobs", scaled(1).body(map[string]any{"PreserveCounts": true}, lower), "diff", "preserve", false)

	// Scale, dispatch, periodic force and revert are decided on their result.
	// (A batch job: Nomad refuses to scale a service job during its deployment.)
	must(http.MethodPut, "/v1/jobs", job("diff", "scaled", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("gpu", 1))).body(nil, canonical))
	send("scale", http.MethodPut, "/v1/job/scaled/scale?namespace=diff", `{"count":4,"Target":{"Group":"g"}}`, "diff", "scaled", false)

	param := job("diff", "param", api.JobTypeBatch).group("g", ptr(2), nil, task(dev("gpu", 1)))
	param.j.ParameterizedJob = &api.ParameterizedJobConfig{}
	must(http.MethodPut, "/v1/jobs", param.body(nil, canonical))
	status, answer := e.send(http.MethodPut, "/v1/job/param/dispatch?namespace=diff", `{"Meta":{}}`)
	var dispatched api.JobDispatchResponse
	json.Unmarshal([]byte(answer), &dispatched)
	out = append(out, diffCheck{name: "dispatch", status: status, answer: answer, ns: "diff", id: dispatched.DispatchedJobID})

	rev := func(count int) string {
		return job("diff", "revert", api.JobTypeService).group("g", ptr(count), nil, task(dev("gpu", 1))).body(nil, canonical)
	}
	must(http.MethodPut, "/v1/jobs", rev(1))
	must(http.MethodPut, "/v1/jobs", rev(3))
	send("revert", http.MethodPut, "/v1/job/revert/revert?namespace=diff", `{"JobID":"revert","JobVersion":0}`, "diff", "revert", false)

	// A plan: Nomad's planned placements against what the broker would charge.
	plan := job("diff", "planned", api.JobTypeBatch).group("g", nil, &api.ScalingPolicy{Min: ptr(int64(3)), Max: ptr(int64(4))},
		task(dev("//", 2)))
	send("plan", http.MethodPut, "/v1/job/planned/plan", plan.body(nil, upper), "diff", "planned", false)

	// Ids with a slash, and the bare /v1/job/ path.
	send("id with a slash", http.MethodPut, "/v1/job/team/slashed",
		job("diff", "team/slashed", api.JobTypeBatch).group("g", ptr(2), nil, task(dev("nvidia/gpu", 2))).body(nil, canonical),
		"diff", "team/slashed", false)

	// Refused: what Nomad could read two ways, and namespaces of no tenant.
	dup := job("diff", "dup", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("gpu", 1))).body(nil, canonical)
	send("count twice", http.MethodPut, "/v1/jobs", strings.Replace(dup, `"Count":1`, `"Count":1,"count":50`, 1), "diff", "dup", true)
	send("job twice", http.MethodPut, "/v1/jobs", strings.Replace(dup, `{"Job":`, `{"job":{"ID":"dup"},"Job":`, 1), "diff", "dup", true)
	send("devices spelled with a long s", http.MethodPut, "/v1/jobs",
		strings.Replace(dup, `"Devices":[`, `"Deviceſ":[{"Name":"gpu","Count":40}],"Devices":[`, 1), "diff", "dup", true)
	send("body namespace of no tenant", http.MethodPut, "/v1/jobs",
		job("diff", "unmapped", api.JobTypeBatch).group("g", ptr(1), nil, task(dev("gpu", 1))).body(map[string]any{"Namespace": "free"}, canonical),
		"free", "unmapped", true)
	return out
}

var admittedRe = regexp.MustCompile(`admitted: tenant \S+, queue \S+, priority (\d+), (\d+) GPUs`)

func (e *diffEnv) verify(t *testing.T, c diffCheck) {
	if c.refused {
		if c.status < 400 || c.status >= 500 {
			t.Fatalf("want a refusal, got %d %s\nrequest: %s", c.status, c.answer, c.request)
		}
		if jobs, _, err := e.nomad.API.Jobs().List(&api.QueryOptions{Namespace: "*", Prefix: c.id}); err != nil || len(jobs) != 0 {
			t.Errorf("refused, yet Nomad has %d jobs %q (%v)", len(jobs), c.id, err)
		}
		return
	}
	m := admittedRe.FindStringSubmatch(c.answer)
	if c.status != http.StatusOK || m == nil {
		// Nomad itself may refuse a generated job; then nothing may be in it.
		if c.status >= 400 && c.status < 500 && !strings.Contains(c.answer, "nomad-gpu") {
			if jobs, _, _ := e.nomad.API.Jobs().List(&api.QueryOptions{Namespace: "*", Prefix: c.id}); len(jobs) != 0 {
				t.Errorf("Nomad refused (%d %s) yet has the job", c.status, c.answer)
			}
			t.Logf("Nomad refused it: %s", c.answer)
			return
		}
		t.Fatalf("not admitted: %d %s\nrequest: %s", c.status, c.answer, c.request)
	}
	priority, _ := strconv.Atoi(m[1])
	charged, _ := strconv.Atoi(m[2])
	if c.plan {
		var plan api.JobPlanResponse
		if err := json.Unmarshal([]byte(c.answer), &plan); err != nil || plan.Annotations == nil {
			t.Fatalf("plan answer: %v %s", err, c.answer)
		}
		placed := 0
		for _, u := range plan.Annotations.DesiredTGUpdates {
			placed += int(u.Place + u.Canary)
		}
		if placed*2 != charged { // the planned job's allocations have 2 GPUs each
			t.Errorf("plan: Nomad would place %d allocations of 2 GPUs, the broker charged %d", placed, charged)
		}
		return
	}
	got := e.waitAllocated(c.ns, c.id, charged)
	if got != charged {
		t.Errorf("Nomad allocated %d GPUs to %s/%s, the broker charged %d\nrequest: %s\nNomad's evaluations: %s",
			got, c.ns, c.id, charged, c.request, e.evaluations(c.ns, c.id))
	}
	j, _, err := e.nomad.API.Jobs().Info(c.id, &api.QueryOptions{Namespace: c.ns})
	if err != nil {
		t.Fatalf("job not in namespace %s: %v", c.ns, err)
	}
	if *j.Priority != priority {
		t.Errorf("Nomad runs it at priority %d, the broker decided %d", *j.Priority, priority)
	}
	for k := range j.Meta {
		if strings.HasPrefix(strings.ToLower(k), "nomad-gpu.") && !strings.HasPrefix(k, "nomad-gpu.") {
			t.Errorf("the caller's meta %q survived", k)
		}
	}
	if jobs, _, _ := e.nomad.API.Jobs().List(&api.QueryOptions{Namespace: "*", Prefix: c.id}); len(jobs) > 1 && !strings.Contains(c.id, "/") {
		for _, s := range jobs {
			if s.ID == c.id && s.Namespace != c.ns {
				t.Errorf("job also registered in namespace %s", s.Namespace)
			}
		}
	}
}

// waitAllocated waits until the GPUs Nomad allocated to a job's live
// allocations reach want and stay there, and returns the last count.
func (e *diffEnv) waitAllocated(ns, id string, want int) int {
	deadline := time.Now().Add(20 * time.Second)
	got, stable := -1, 0
	for time.Now().Before(deadline) {
		got = e.allocated(ns, id)
		if got == want {
			if stable++; stable == 3 {
				return got
			}
		} else {
			stable = 0
		}
		time.Sleep(300 * time.Millisecond)
	}
	return got
}

func (e *diffEnv) allocated(ns, id string) int {
	stubs, _, err := e.nomad.API.Jobs().Allocations(id, false, &api.QueryOptions{Namespace: ns})
	if err != nil {
		return -1
	}
	total := 0
	for _, s := range stubs {
		if s.DesiredStatus != api.AllocDesiredStatusRun || s.ClientStatus == api.AllocClientStatusComplete ||
			s.ClientStatus == api.AllocClientStatusFailed || s.ClientStatus == api.AllocClientStatusLost {
			continue
		}
		a, _, err := e.nomad.API.Allocations().Info(s.ID, &api.QueryOptions{Namespace: ns})
		if err != nil || a.AllocatedResources == nil {
			return -1
		}
		for _, tr := range a.AllocatedResources.Tasks {
			for _, d := range tr.Devices {
				total += len(d.DeviceIDs)
			}
		}
	}
	return total
}

// evaluations says why Nomad placed what it placed.
func (e *diffEnv) evaluations(ns, id string) string {
	evals, _, err := e.nomad.API.Jobs().Evaluations(id, &api.QueryOptions{Namespace: ns})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, ev := range evals {
		line := ev.Status + " " + ev.StatusDescription
		for tg, m := range ev.FailedTGAllocs {
			b, _ := json.Marshal(m)
			line += fmt.Sprintf(" [%s: %s]", tg, b)
		}
		out = append(out, line)
	}
	stubs, _, _ := e.nomad.API.Jobs().Allocations(id, true, &api.QueryOptions{Namespace: ns})
	for _, a := range stubs {
		line := fmt.Sprintf("alloc %s on %s: %s/%s", a.ID[:8], a.NodeName, a.DesiredStatus, a.ClientStatus)
		for task, st := range a.TaskStates {
			for _, ev := range st.Events {
				line += fmt.Sprintf(" [%s: %s %s]", task, ev.Type, ev.DisplayMessage)
			}
		}
		out = append(out, line)
	}
	return strings.Join(out, "; ")
}

func (e *diffEnv) send(method, path, body string) (int, string) {
	return send(e.t, e.broker.Addr, method, path, body)
}

// The corpus' dimensions.
var deviceForms = []string{"gpu", "nvidia/gpu", "/gpu", "nvidia//" + testbuild.H100, "//", "nvidia/gpu/" + testbuild.H100, "//" + testbuild.H100}

type keyStyle func(string) string

var (
	canonical keyStyle = func(k string) string { return k }
	lower     keyStyle = strings.ToLower
	upper     keyStyle = strings.ToUpper
	alternate keyStyle = func(k string) string {
		b := []byte(k)
		for i := range b {
			if i%2 == 1 {
				b[i] = strings.ToLower(string(b[i]))[0]
			} else {
				b[i] = strings.ToUpper(string(b[i]))[0]
			}
		}
		return string(b)
	}
	styles = []keyStyle{canonical, lower, upper, alternate}
)

type jobBuilder struct{ j *api.Job }

func job(ns, id, typ string) *jobBuilder {
	j := &api.Job{ID: ptr(id), Type: ptr(typ), Datacenters: []string{"*"}}
	if ns != "" {
		j.Namespace = ptr(ns)
	}
	return &jobBuilder{j: j}
}

func (b *jobBuilder) group(name string, count *int, scaling *api.ScalingPolicy, tasks ...*api.Task) *jobBuilder {
	for i, t := range tasks {
		t.Name = fmt.Sprintf("t%d", i)
	}
	b.j.TaskGroups = append(b.j.TaskGroups, &api.TaskGroup{Name: ptr(name), Count: count, Scaling: scaling, Tasks: tasks,
		RestartPolicy: &api.RestartPolicy{Attempts: ptr(0), Mode: ptr("fail")}})
	return b
}

func task(devs ...*api.RequestedDevice) *api.Task {
	// Nomad's mock driver, without a log collector: these tests read
	// placements and allocations, never a task's process or output, and a
	// `nomad executor` and a `nomad logmon` process per task are CPU the
	// suite needs elsewhere. (Devices are reserved for it as for any driver.)
	return &api.Task{Driver: "mock_driver", Config: map[string]any{"run_for": "600s"},
		LogConfig: &api.LogConfig{Disabled: ptr(true)},
		Resources: &api.Resources{CPU: ptr(10), MemoryMB: ptr(16), Devices: devs}}
}

func dev(name string, count uint64) *api.RequestedDevice {
	return &api.RequestedDevice{Name: name, Count: ptr(count)}
}

// body is the register request with extra top-level fields, every struct key
// written in style (data maps keep their keys: Meta, Env, Config).
func (b *jobBuilder) body(extra map[string]any, style keyStyle) string {
	req := map[string]any{"Job": b.j}
	for k, v := range extra {
		req[k] = v
	}
	raw, _ := json.Marshal(req)
	var generic any
	json.Unmarshal(raw, &generic)
	out, _ := json.Marshal(restyle(generic, style))
	return string(out)
}

func restyle(v any, style keyStyle) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range t {
			if val == nil {
				continue // absent rather than null: one spelling per key
			}
			if k == "Meta" || k == "Env" || k == "Config" {
				out[style(k)] = val
				continue
			}
			out[style(k)] = restyle(val, style)
		}
		return out
	case []any:
		for i := range t {
			t[i] = restyle(t[i], style)
		}
	}
	return v
}
