package nomadjob_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

func TestGPURequestMirrorsNomadsDeviceMatching(t *testing.T) {
	cases := []struct {
		name, model string
		gpu         bool
	}{
		{"gpu", "", true},
		{"nvidia/gpu", "", true},
		{"nvidia/gpu/NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", true},
		{"/gpu", "", true},             // vendor left empty: any vendor
		{"nvidia/", "", true},          // type left empty: any type
		{"nvidia//H100", "H100", true}, // type empty, model given
		{"//", "", true},               // matches every device
		{"//H100/with/slashes", "H100/with/slashes", true},
		{"Nvidia/gpu", "", false}, // Nomad compares case-sensitively
		{"nvidia/GPU", "", false},
		{"amd/gpu", "", false},
		{"fpga", "", false},
		{"nvidia/fpga", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		model, ok := nomadjob.GPURequest(c.name)
		if ok != c.gpu || model != c.model {
			t.Errorf("%q: got (%q, %v), want (%q, %v)", c.name, model, ok, c.model, c.gpu)
		}
	}
}

func groups(t *testing.T, job *api.Job, pl nomadjob.Placement) string {
	t.Helper()
	gs, err := nomadjob.Groups(job, pl)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, g := range gs {
		parts = append(parts, g.Name+":"+itoa(g.Count)+"x"+itoa(g.GPUsPerAlloc)+":"+g.Model)
	}
	return strings.Join(parts, " ")
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestGroupsCountAsNomadPlaces(t *testing.T) {
	min3 := testbuild.Job("vision", "j").Group("g", 1, 2, "gpu").Build()
	min3.TaskGroups[0].Count = nil
	min3.TaskGroups[0].Scaling = &api.ScalingPolicy{Min: ptr(int64(3)), Max: ptr(int64(9))}
	if got := groups(t, min3, nomadjob.Placement{}); got != "g:3x2:" {
		t.Errorf("no count, scaling min 3: %s", got)
	}
	noCount := testbuild.Job("vision", "j").Group("g", 1, 2, "gpu").Build()
	noCount.TaskGroups[0].Count = nil
	if got := groups(t, noCount, nomadjob.Placement{}); got != "g:1x2:" {
		t.Errorf("no count: %s", got)
	}

	current := testbuild.Job("vision", "j").Group("g", 5, 1, "gpu").Build()
	body := testbuild.Job("vision", "j").Group("g", 1, 1, "gpu").Build()
	if got := groups(t, body, nomadjob.Placement{Current: current, PreserveCounts: true}); got != "g:5x1:" {
		t.Errorf("PreserveCounts keeps the running count: %s", got)
	}
	if got := groups(t, body, nomadjob.Placement{Current: current}); got != "g:1x1:" {
		t.Errorf("without PreserveCounts: %s", got)
	}

	canary := testbuild.Job("vision", "j").Group("g", 2, 1, "gpu").Canary(1).Build()
	if got := groups(t, canary, nomadjob.Placement{}); got != "g:2x1:" {
		t.Errorf("first version places no canaries: %s", got)
	}
	if got := groups(t, canary, nomadjob.Placement{Current: current}); got != "g:6x1:" {
		t.Errorf("update: 5 current allocations run beside 1 canary: %s", got)
	}

	sys := testbuild.Job("vision", "s").Type(api.JobTypeSysbatch).Group("g", 1, 2, "nvidia/gpu/H100").Build()
	fits := func(model string, gpus int) int {
		if model == "H100" && gpus == 2 {
			return 7
		}
		return 0
	}
	if got := groups(t, sys, nomadjob.Placement{NodesFitting: fits}); got != "g:7x2:H100" {
		t.Errorf("sysbatch places one per fitting node: %s", got)
	}
	sys3 := testbuild.Job("vision", "s").Type(api.JobTypeSysbatch).Group("g", 3, 2, "nvidia/gpu/H100").Build()
	if got := groups(t, sys3, nomadjob.Placement{NodesFitting: fits}); got != "g:21x2:H100" {
		t.Errorf("sysbatch of count 3 places 3 on each of 7 fitting nodes: %s", got)
	}
	sys0 := testbuild.Job("vision", "s").Type(api.JobTypeSystem).Group("g", 0, 2, "nvidia/gpu/H100").Build()
	if got := groups(t, sys0, nomadjob.Placement{NodesFitting: fits}); got != "g:0x2:H100" {
		t.Errorf("a system job of count 0 places nothing: %s", got)
	}

	two := testbuild.Job("vision", "m").Group("g", 2, 4, "nvidia/gpu/A100").Build()
	two.TaskGroups[0].Tasks = append(two.TaskGroups[0].Tasks, &api.Task{Name: "u", Resources: &api.Resources{
		Devices: []*api.RequestedDevice{{Name: "nvidia/gpu/H100", Count: ptr(uint64(2))}, {Name: "amd/fpga"}, {Name: "/gpu"}}}})
	if got := groups(t, two, nomadjob.Placement{}); got != "g:2x4:A100 g:2x2:H100 g:2x1:" {
		t.Errorf("models of one group are counted apart: %s", got)
	}
}

// A request counts as replicas only when nothing but a shared group can meet
// it: by its name, or a constraint that Nomad reads as shared == true.
func TestSharedOnlyReadsTheRequestAsNomadMatchesIt(t *testing.T) {
	shared := func(op, val string) *api.RequestedDevice {
		return &api.RequestedDevice{Name: "nvidia/gpu", Constraints: []*api.Constraint{{LTarget: "${device.attr.shared}", Operand: op, RTarget: val}}}
	}
	for _, c := range []struct {
		name string
		dev  *api.RequestedDevice
		want bool
	}{
		{"the shared group by name", &api.RequestedDevice{Name: "nvidia/gpu/NVIDIA H100 80GB HBM3 (shared)"}, true},
		{"any GPU", &api.RequestedDevice{Name: "nvidia/gpu"}, false},
		{"a model, whole", &api.RequestedDevice{Name: "nvidia/gpu/NVIDIA H100 80GB HBM3"}, false},
		{"= true", shared("=", "true"), true},
		{"== True", shared("==", "True"), true},
		{"is t", shared("is", "t"), true},
		{"no operand (Nomad's default =) TRUE", shared("", "TRUE"), true},
		{"= 1 (an int to Nomad, never equal to a bool)", shared("=", "1"), false},
		{"!= true", shared("!=", "true"), false},
		{"= false", shared("=", "false"), false},
	} {
		if got := nomadjob.SharedOnly(c.dev); got != c.want {
			t.Errorf("%s: shared only %t, want %t", c.name, got, c.want)
		}
	}
	other := &api.RequestedDevice{Name: "nvidia/gpu", Constraints: []*api.Constraint{{LTarget: "${device.attr.mig}", Operand: "=", RTarget: "true"}}}
	if nomadjob.SharedOnly(other) {
		t.Error("a constraint on another attribute")
	}
	job := testbuild.Job("vision", "j").Group("g", 2, 1, "nvidia/gpu/H100 (shared)").Group("h", 1, 1, "nvidia/gpu").Build()
	gs, err := nomadjob.Groups(job, nomadjob.Placement{})
	if err != nil || len(gs) != 2 || !gs[0].Shared || gs[1].Shared {
		t.Errorf("groups %+v (%v): want g shared, h not", gs, err)
	}
}

func TestGroupsRefuseAbsurdAndNullEntries(t *testing.T) {
	cases := map[string]func(j *api.Job){
		"null task group": func(j *api.Job) { j.TaskGroups = append(j.TaskGroups, nil) },
		"null task":       func(j *api.Job) { j.TaskGroups[0].Tasks = append(j.TaskGroups[0].Tasks, nil) },
		"null device": func(j *api.Job) {
			j.TaskGroups[0].Tasks[0].Resources.Devices = append(j.TaskGroups[0].Tasks[0].Resources.Devices, nil)
		},
		"negative count":  func(j *api.Job) { j.TaskGroups[0].Count = ptr(-1) },
		"huge count":      func(j *api.Job) { j.TaskGroups[0].Count = ptr(1 << 40) },
		"uint64 max gpus": func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Count = ptr(^uint64(0)) },
	}
	for name, mutate := range cases {
		j := testbuild.Job("vision", "j").Group("g", 1, 1, "gpu").Build()
		mutate(j)
		if _, err := nomadjob.Groups(j, nomadjob.Placement{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func read(t *testing.T, body string, query string) (*nomadjob.Request, error) {
	t.Helper()
	q, _ := url.ParseQuery(query)
	return nomadjob.ReadRequest(nomadjob.Register, []byte(body), q)
}

func TestReadRequestRefusesWhatNomadCouldReadTwoWays(t *testing.T) {
	refused := map[string]string{
		"same key twice":          `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Count":1,"Count":9}]}}`,
		"two spellings of a key":  `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Count":1,"count":9}]}}`,
		"two Job objects":         `{"Job":{"ID":"j"},"job":{"ID":"j","TaskGroups":[]}}`,
		"unicode fold of a key":   `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"gpu","Count":1}],"Deviceſ":[]}}]}]}}`,
		"repeated meta key":       `{"Job":{"ID":"j","Meta":{"nomad-gpu.queue":"a","nomad-gpu.queue":"b"}}}`,
		"repeated unknown key":    `{"Job":{"ID":"j","FutureField":1,"futurefield":2}}`,
		"trailing data":           `{"Job":{"ID":"j"}} {"Job":{"ID":"k"}}`,
		"no job":                  `{"Jobs":{"ID":"j"}}`,
		"job not an object":       `{"Job":[1]}`,
		"no job id":               `{"Job":{"Name":"j"}}`,
		"count of the wrong type": `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Count":"9"}]}}`,
		"multiregion":             `{"Job":{"ID":"j","Multiregion":{"Regions":[{"Name":"a"}]}}}`,
		"deep nesting":            `{"Job":{"ID":"j","Meta":` + strings.Repeat(`{"a":`, 70) + `1` + strings.Repeat(`}`, 70) + `}}`,
		"invalid JSON":            `{"Job":`,
	}
	for name, body := range refused {
		if _, err := read(t, body, ""); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReadRequestReadsKeysAsNomadDoes(t *testing.T) {
	body := `{"job":{"id":"j","PRIORITY":99,"taskgroups":[{"name":"g","COUNT":3,"tasks":[{"name":"t",
	  "resources":{"devices":[{"name":"nvidia/gpu","count":2}]}}]}],"FutureField":{"kept":[1,"x"]}}}`
	r, err := read(t, body, "")
	if err != nil {
		t.Fatal(err)
	}
	gs, err := r.Groups(nil, nil)
	if err != nil || len(gs) != 1 || gs[0].Count != 3 || gs[0].GPUsPerAlloc != 2 || *r.Job.Priority != 99 {
		t.Fatalf("read %+v %v", gs, err)
	}
	r.Stamp(admission.Decision{Priority: 60, Tenant: "vision", Queue: "training"}, "v2:sig")
	r.Pin()
	out := string(r.Body())
	for _, want := range []string{`"Job":{`, `"ID":"j"`, `"Priority":60`, `"Count":3`, `"FutureField":{"kept":[1,"x"]}`,
		`"Namespace":"default"`, `"nomad-gpu.admission":"v2:sig"`} {
		if !strings.Contains(out, want) {
			t.Errorf("forwarded body lacks %s:\n%s", want, out)
		}
	}
	var back api.JobRegisterRequest
	if err := json.Unmarshal(r.Body(), &back); err != nil || *back.Job.Priority != 60 || *back.Job.TaskGroups[0].Count != 3 {
		t.Errorf("Nomad would read the forwarded body differently: %v %s", err, out)
	}
}

// Admit pins a request to the nodes admission placed it on before it
// stamps it, so that the stamp Nomad's copy carries binds those nodes.
func TestAdmitPinsThenStamps(t *testing.T) {
	body := `{"Job":{"ID":"j","Namespace":"vision","Type":"batch",
	  "TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]}]}}`
	r, err := read(t, body, "")
	if err != nil {
		t.Fatal(err)
	}
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Outcome: admission.Admit, Tenant: "vision", Queue: "training", Priority: 60,
		Placed: admission.Placed{"g": {"n2", "n1"}}}
	if pinned := r.Admit(d, s); !strings.Contains(pinned, `task group "g" on node n1, n2`) {
		t.Errorf("said %q, want the nodes pinned", pinned)
	}
	var back api.JobRegisterRequest
	if err := json.Unmarshal(r.Body(), &back); err != nil {
		t.Fatal(err)
	}
	if cs := back.Job.TaskGroups[0].Constraints; len(cs) != 1 || cs[0].RTarget != "n1,n2" || !s.Verify(back.Job) {
		t.Fatalf("constraints %+v, verified %v", cs, s.Verify(back.Job))
	}
	back.Job.TaskGroups[0].Constraints[0].RTarget = "n1"
	if s.Verify(back.Job) {
		t.Errorf("the stamp verified with another pin")
	}
}

func TestStampReplacesTheCallersBrokerMetaWhateverTheSpelling(t *testing.T) {
	body := `{"Job":{"ID":"j","Priority":90,"Meta":{"NOMAD-GPU.borrowed":"false","nomad-gpu.admission":"v2:copied","Nomad-Gpu.Tenant":"x","team":"cv",
	  "nomad-gpu.ttl":"2h","Nomad-GPU.TTL":"9h"},
	  "TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"gpu"}]}}]}]}}`
	r, err := read(t, body, "")
	if err != nil {
		t.Fatal(err)
	}
	d := admission.Decision{Outcome: admission.AdmitBorrowed, Priority: 20, Tenant: "vision", Queue: "training"}
	r.Stamp(d, "v2:sig")
	var back api.JobRegisterRequest
	json.Unmarshal(r.Body(), &back)
	// The caller's own lifetime stays (exactly so spelt: what admission read).
	want := map[string]string{"team": "cv", "nomad-gpu.tenant": "vision", "nomad-gpu.queue": "training", "nomad-gpu.workload": "",
		"nomad-gpu.borrowed": "true", "nomad-gpu.admission": "v2:sig", "nomad-gpu.ttl": "2h"}
	if len(back.Job.Meta) != len(want) || *back.Job.Priority != 20 {
		t.Fatalf("meta %v priority %d", back.Job.Meta, *back.Job.Priority)
	}
	for k, v := range want {
		if back.Job.Meta[k] != v {
			t.Errorf("meta %s = %q, want %q", k, back.Job.Meta[k], v)
		}
	}
}

func TestNamespaceAndRegionAsNomadResolvesThem(t *testing.T) {
	job := `{"Namespace":%s,"Region":%s,"Job":{"ID":"j","Namespace":"job-ns","Region":"job-region"}}`
	cases := []struct{ bodyNS, bodyRegion, query, ns, region string }{
		{`""`, `""`, "", "job-ns", "job-region"},
		{`"body-ns"`, `""`, "", "body-ns", "job-region"},
		{`"body-ns"`, `"body-region"`, "namespace=q-ns&region=q-region", "q-ns", "body-region"},
		{`""`, `""`, "namespace=q-ns&region=q-region", "q-ns", "q-region"},
		{`""`, `"global"`, "", "job-ns", ""},
	}
	for _, c := range cases {
		body := strings.Replace(strings.Replace(job, "%s", c.bodyNS, 1), "%s", c.bodyRegion, 1)
		r, err := read(t, body, c.query)
		if err != nil {
			t.Fatal(err)
		}
		if r.Namespace != c.ns || r.Region != c.region {
			t.Errorf("%s ?%s: namespace %q region %q, want %q %q", body, c.query, r.Namespace, r.Region, c.ns, c.region)
		}
	}
	r, _ := read(t, `{"Job":{"ID":"j"}}`, "")
	if r.Namespace != "default" {
		t.Errorf("no namespace anywhere: %q", r.Namespace)
	}
}

func TestStampCoversWhatAdmissionDecidedOn(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	build := func() *api.Job {
		return testbuild.Job("vision", "train").Priority(60).Group("g", 2, 4, "nvidia/gpu").Build()
	}
	stamped := func() *api.Job {
		j := build()
		for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", j, d)) {
			j.Meta[k] = v
		}
		return j
	}
	if !s.Verify(stamped()) {
		t.Fatal("own stamp not verified")
	}
	changes := map[string]func(j *api.Job){
		"priority":  func(j *api.Job) { j.Priority = ptr(80) },
		"namespace": func(j *api.Job) { j.Namespace = ptr("search") },
		"job id":    func(j *api.Job) { j.ID = ptr("other") },
		"count":     func(j *api.Job) { j.TaskGroups[0].Count = ptr(3) },
		"gpus":      func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Count = ptr(uint64(8)) },
		"model":     func(j *api.Job) { j.TaskGroups[0].Tasks[0].Resources.Devices[0].Name = "nvidia/gpu/H100" },
		"borrowed":  func(j *api.Job) { j.Meta[nomadjob.MetaBorrowed] = "true" },
		"tenant":    func(j *api.Job) { j.Meta[nomadjob.MetaTenant] = "search" },
		"ttl":       func(j *api.Job) { j.Meta[nomadjob.MetaTTL] = "99h" },
		"another group": func(j *api.Job) {
			j.TaskGroups = append(j.TaskGroups, build().TaskGroups[0])
		},
	}
	for name, change := range changes {
		j := stamped()
		change(j)
		if s.Verify(j) {
			t.Errorf("the stamp survived a change of %s", name)
		}
	}
	if (nomadjob.Stamper{Key: []byte("other")}).Verify(stamped()) {
		t.Error("another key verified the stamp")
	}
}

func ptr[T any](v T) *T { return &v }

// A stamp binds the nodes a job was pinned to: a system job's (N7: a copy of
// the stamp on the job without its pin grew onto a node that joined), and
// any job's the broker placed (placement mode broker).
func TestStampBindsAJobsPin(t *testing.T) {
	for _, typ := range []string{api.JobTypeSystem, api.JobTypeBatch} {
		t.Run(typ, func(t *testing.T) { testStampBindsPin(t, typ) })
	}
}

func testStampBindsPin(t *testing.T, typ string) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	pin := func(ids string) *api.Constraint {
		return &api.Constraint{LTarget: "${node.unique.id}", Operand: "set_contains_any", RTarget: ids}
	}
	stamped := func() *api.Job {
		j := testbuild.Job("vision", "agent").Type(typ).Priority(60).Group("g", 1, 1, "nvidia/gpu").Build()
		j.TaskGroups[0].Constraints = []*api.Constraint{pin("n2,n1")}
		for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", j, d)) {
			j.Meta[k] = v
		}
		return j
	}
	if j := stamped(); !s.Verify(j) || !strings.HasPrefix(j.Meta[nomadjob.MetaAdmission], "v5:") {
		t.Fatalf("own stamp %q not verified, or not v5", j.Meta[nomadjob.MetaAdmission])
	}
	reordered := stamped()
	reordered.TaskGroups[0].Constraints = []*api.Constraint{pin("n1,n2")}
	if !s.Verify(reordered) {
		t.Errorf("the same nodes in another order: not verified")
	}
	for name, change := range map[string]func(j *api.Job){
		"pin removed":        func(j *api.Job) { j.TaskGroups[0].Constraints = nil },
		"a node added":       func(j *api.Job) { j.TaskGroups[0].Constraints = []*api.Constraint{pin("n1,n2,n3")} },
		"a job pin added":    func(j *api.Job) { j.Constraints = []*api.Constraint{pin("n1")} },
		"another constraint": func(j *api.Job) { j.TaskGroups[0].Constraints = []*api.Constraint{pin("n3")} },
	} {
		j := stamped()
		change(j)
		if s.Verify(j) {
			t.Errorf("the stamp survived: %s", name)
		}
	}
}

func TestAScaleThroughTheBrokerKeepsTheJobVerifiable(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	j := testbuild.Job("vision", "train").Priority(60).Group("g", 2, 4, "nvidia/gpu").Build()
	for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", j, d)) {
		j.Meta[k] = v
	}
	stamp := j.Meta[nomadjob.MetaAdmission]
	grant := nomadjob.ScaleGrant{Stamp: stamp, Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3}}
	j.TaskGroups[0].Count = ptr(3) // scaled to what the broker admitted
	if s.Verify(j) || !s.VerifyScaled(j, grant) {
		t.Errorf("scaled through the broker: Verify %t (want false), VerifyScaled %t (want true)", s.Verify(j), s.VerifyScaled(j, grant))
	}
	for name, g := range map[string]nomadjob.ScaleGrant{
		"scaled past the broker":      {Stamp: stamp, Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 5}},
		"a grant for another stamp":   {Stamp: "v2:other", Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3}},
		"stamped counts made up":      {Stamp: stamp, Stamped: map[string]int{"g": 3}, Admitted: map[string]int{"g": 3}},
		"a group the grant never saw": {Stamp: stamp, Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3, "h": 1}},
	} {
		if s.VerifyScaled(j, g) {
			t.Errorf("%s: verified", name)
		}
	}
	j.Meta[nomadjob.MetaAdmission] = "v2:"
	if s.Verify(j) || s.VerifyScaled(j, nomadjob.ScaleGrant{Stamp: "v2:", Admitted: map[string]int{"g": 3}}) {
		t.Error("an empty signature verified")
	}
}

// A borrowed job promoted in place keeps its stamp (made for the borrowed
// priority): its grant names that priority, and it verifies at the new one
// by the grant only; a priority changed past the broker does not.
func TestAPromotionKeepsTheJobVerifiable(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 20, Outcome: admission.AdmitBorrowed}
	j := testbuild.Job("vision", "train").Priority(20).Group("g", 2, 4, "nvidia/gpu").Build()
	for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", j, d)) {
		j.Meta[k] = v
	}
	grant := nomadjob.ScaleGrant{Stamp: j.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 2},
		StampedPriority: 20}
	if !s.VerifyScaled(j, grant) || grant.Promoted(j) {
		t.Errorf("before the new priority: VerifyScaled %t (want true), Promoted %t (want false)", s.VerifyScaled(j, grant), grant.Promoted(j))
	}
	j.Priority = ptr(60)
	if s.Verify(j) || !s.VerifyScaled(j, grant) || !grant.Promoted(j) {
		t.Errorf("promoted: Verify %t (want false), VerifyScaled %t, Promoted %t (want true)", s.Verify(j), s.VerifyScaled(j, grant), grant.Promoted(j))
	}
	grant.Priority = 60
	if !s.VerifyScaled(j, grant) {
		t.Error("promoted to the priority the grant names: not verified")
	}
	if j.Priority = ptr(70); s.VerifyScaled(j, grant) {
		t.Error("a promoted job's priority changed past the broker: verified")
	}
	j.Priority = ptr(24)
	grant.Priority, grant.SubBand = 24, true
	if !s.VerifyScaled(j, grant) || grant.Promoted(j) {
		t.Errorf("in a sub-band: VerifyScaled %t (want true), Promoted %t (want false: still borrowed)", s.VerifyScaled(j, grant), grant.Promoted(j))
	}
	if !s.VerifyCounting(j) || s.Verify(j) {
		t.Error("the view does not count a borrowed job in a sub-band as the broker's")
	}
	grant.StampedPriority = 0
	if s.VerifyScaled(j, grant) {
		t.Error("a priority changed without the grant saying so verified")
	}
	for prio, want := range map[int]bool{20: true, 29: true, 30: false, 60: false, 19: false} {
		if j.Priority = ptr(prio); s.VerifyCounting(j) != want {
			t.Errorf("borrowed, stamped at 20, at priority %d: counted as the broker's %t, want %t", prio, !want, want)
		}
	}
	j.Priority, j.Meta[nomadjob.MetaBorrowed] = ptr(24), "false"
	if s.VerifyCounting(j) {
		t.Error("a job not borrowed 4 above its stamp's priority counted as the broker's")
	}
}

// A child dispatched through the broker carries its parent's stamp, made for
// the parent's id: its grant names the parent; without one it does not verify.
func TestAChildDispatchedThroughTheBrokerVerifiesByItsGrant(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k")}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	parent := testbuild.Job("vision", "fan-out").Priority(60).Type("batch").Group("g", 1, 2, "nvidia/gpu").Build()
	parent.ParameterizedJob = &api.ParameterizedJobConfig{}
	for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", parent, d)) {
		parent.Meta[k] = v
	}
	child := func() *api.Job {
		c := testbuild.Job("vision", "fan-out/dispatch-1700000000-abcd1234").Priority(60).Type("batch").Group("g", 1, 2, "nvidia/gpu").Build()
		c.Meta, c.ParentID, c.Dispatched = parent.Meta, ptr("fan-out"), true
		return c
	}
	grant := nomadjob.ScaleGrant{Stamp: parent.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 1}, Admitted: map[string]int{"g": 1}, Parent: "fan-out"}
	if c := child(); s.Verify(c) || !s.VerifyScaled(c, grant) {
		t.Errorf("the child: Verify %t (want false), VerifyScaled %t (want true)", s.Verify(c), s.VerifyScaled(c, grant))
	}
	for name, change := range map[string]func(*api.Job){
		"another parent":       func(c *api.Job) { c.ParentID = ptr("other") },
		"not dispatched":       func(c *api.Job) { c.Dispatched = false },
		"more than admitted":   func(c *api.Job) { c.TaskGroups[0].Count = ptr(2) },
		"another priority now": func(c *api.Job) { c.Priority = ptr(70) },
	} {
		c := child()
		change(c)
		if s.VerifyScaled(c, grant) {
			t.Errorf("%s: verified", name)
		}
	}
}

func TestAWorkloadWritesWhatTheJobLeavesOpen(t *testing.T) {
	body := `{"Job":{"ID":"j","Meta":{"team":"cv"},"TaskGroups":[
	  {"Name":"open","Tasks":[{"Name":"a","Resources":{"Devices":[{"Name":"gpu"}]}},{"Name":"b","KillTimeout":300000000000}]},
	  {"Name":"set","RestartPolicy":{"Attempts":0},"Tasks":[{"Name":"c","KillTimeout":1000000000,"Resources":{"Devices":[{"Name":"gpu"}]}}]},
	  {"Name":"cpu","Tasks":[{"Name":"d"}]}]}}`
	r, err := read(t, body, "")
	if err != nil {
		t.Fatal(err)
	}
	w := &policy.Workload{Name: "training", DefaultTTL: 8 * time.Hour, RestartAttempts: 3, CheckpointGrace: 2 * time.Minute}
	notes := r.ApplyWorkload(w)
	var back api.JobRegisterRequest
	if err := json.Unmarshal(r.Body(), &back); err != nil {
		t.Fatal(err)
	}
	groups := back.Job.TaskGroups
	if back.Job.Meta["nomad-gpu.ttl"] != "8h0m0s" || back.Job.Meta["team"] != "cv" {
		t.Errorf("meta %v", back.Job.Meta)
	}
	if groups[0].RestartPolicy == nil || *groups[0].RestartPolicy.Attempts != 3 || *groups[1].RestartPolicy.Attempts != 0 || groups[2].RestartPolicy != nil {
		t.Errorf("restart: %+v %+v %+v", groups[0].RestartPolicy, groups[1].RestartPolicy, groups[2].RestartPolicy)
	}
	if *groups[0].Tasks[0].KillTimeout != 2*time.Minute || *groups[0].Tasks[1].KillTimeout != 5*time.Minute ||
		*groups[1].Tasks[0].KillTimeout != 2*time.Minute || groups[2].Tasks[0].KillTimeout != nil {
		t.Errorf("kill timeouts: %v %v %v", *groups[0].Tasks[0].KillTimeout, *groups[0].Tasks[1].KillTimeout, *groups[1].Tasks[0].KillTimeout)
	}
	for _, dev := range []*api.RequestedDevice{groups[0].Tasks[0].Resources.Devices[0], groups[1].Tasks[0].Resources.Devices[0]} {
		if len(dev.Constraints) != 1 || *dev.Constraints[0] != (api.Constraint{LTarget: "${device.attr.shared}", Operand: "!=", RTarget: "true"}) {
			t.Errorf("a training GPU may land on a replica: constraints %v", dev.Constraints)
		}
	}
	if len(notes) != 6 || r.Admission(nil).TTL != "8h0m0s" {
		t.Errorf("notes %q, admission ttl %q", notes, r.Admission(nil).TTL)
	}
	// A shared workload may take replicas; a request that says something of
	// sharing, or names the shared group, is left as it is.
	for name, c := range map[string]struct {
		dev    string
		shared bool
	}{
		"shared workload":        {`{"Name":"gpu"}`, true},
		"its own constraint":     {`{"Name":"gpu","Constraints":[{"LTarget":"${device.attr.shared}","Operand":"=","RTarget":"false"}]}`, false},
		"the shared group named": {`{"Name":"nvidia/gpu/H100 (shared)"}`, false},
	} {
		r, _ = read(t, `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[`+c.dev+`]}}]}]}}`, "")
		before := string(r.Body())
		if notes := r.ApplyWorkload(&policy.Workload{Name: "w", Shared: c.shared}); len(notes) != 0 || string(r.Body()) != before {
			t.Errorf("%s: wrote %q", name, notes)
		}
	}
	// A job that sets its own lifetime keeps it.
	r, _ = read(t, `{"Job":{"ID":"j","Meta":{"nomad-gpu.ttl":"1h"},"TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"gpu"}]}}]}]}}`, "")
	if r.ApplyWorkload(&policy.Workload{Name: "dev", DefaultTTL: 8 * time.Hour}); r.Admission(nil).TTL != "1h" {
		t.Errorf("own ttl overridden: %q", r.Admission(nil).TTL)
	}
}

// A call's namespace and region are the query's; where the query has none,
// the body's, for the calls whose body Nomad reads a WriteRequest from.
func TestCallTarget(t *testing.T) {
	q, _ := url.ParseQuery("idempotency_token=q")
	for body, want := range map[string]string{`{}`: "q", `{"IdempotencyToken":"b"}`: "q"} {
		if got, err := nomadjob.CallTarget(q, []byte(body), true); err != nil || got.IdempotencyToken != want {
			t.Errorf("token of %s with the query's: %+v %v", body, got, err)
		}
	}
	if got, _ := nomadjob.CallTarget(url.Values{}, []byte(`{"idempotencytoken":"b"}`), true); got.IdempotencyToken != "b" {
		t.Errorf("the body's token where the query has none: %+v", got)
	}
	if got, _ := nomadjob.CallTarget(url.Values{}, []byte(`{"authTOKEN":"s3cret"}`), true); got.AuthToken != "s3cret" {
		t.Errorf("the ACL token in the body, which Nomad acts on without a header: %+v", got)
	}
	if got, _ := nomadjob.CallTarget(url.Values{}, []byte(`{"AuthToken":"s3cret"}`), false); got.AuthToken != "" {
		t.Errorf("a body Nomad does not read (a scale's): %+v", got)
	}
	for _, c := range []struct {
		name, query, body string
		bodyCounts        bool
		ns, region, err   string
	}{
		{name: "nothing given", ns: "default"},
		{name: "the query", query: "namespace=vision&region=eu", body: `{"Namespace":"search","Region":"us"}`, bodyCounts: true, ns: "vision", region: "eu"},
		{name: "the body where the query has none", body: `{"JobID":"x","Namespace":"vision","Region":"us"}`, bodyCounts: true, ns: "vision", region: "us"},
		{name: "the query's region, the body's namespace", query: "region=eu", body: `{"Namespace":"vision","Region":"us"}`, bodyCounts: true, ns: "vision", region: "eu"},
		{name: "the body's keys in any case, as encoding/json reads them", body: `{"nAMESPACE":"vision"}`, bodyCounts: true, ns: "vision"},
		{name: "a body Nomad does not read it from", body: `{"Namespace":"vision"}`, ns: "default"},
		{name: "an empty body", bodyCounts: true, ns: "default"},
		{name: "a namespace given twice", body: `{"Namespace":"a","namespace":"b"}`, bodyCounts: true, err: "namespace"},
		{name: "not JSON", body: `{`, bodyCounts: true, err: "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, _ := url.ParseQuery(c.query)
			got, err := nomadjob.CallTarget(q, []byte(c.body), c.bodyCounts)
			ns, region := got.Namespace, got.Region
			if c.err != "" {
				if err == nil || !strings.Contains(strings.ToLower(err.Error()), c.err) {
					t.Fatalf("want an error about %s, got %v", c.err, err)
				}
				return
			}
			if err != nil || ns != c.ns || region != c.region {
				t.Errorf("got %q %q %v, want %q %q", ns, region, err, c.ns, c.region)
			}
		})
	}
}

// What a job spec shows of GPUs used without a device request.
func TestUndeclaredGPUAccess(t *testing.T) {
	task := func(driver string, env map[string]string, config map[string]any, devices ...string) *api.Job {
		tk := &api.Task{Name: "t", Driver: driver, Env: env, Config: config, Resources: &api.Resources{}}
		for _, d := range devices {
			name, zero := strings.CutSuffix(d, ":0")
			count := uint64(1)
			if zero {
				count = 0
			}
			tk.Resources.Devices = append(tk.Resources.Devices, &api.RequestedDevice{Name: name, Count: ptr(count)})
		}
		return &api.Job{TaskGroups: []*api.TaskGroup{{Name: ptr("g"), Tasks: []*api.Task{tk}}}}
	}
	for _, c := range []struct {
		name string
		job  *api.Job
		want string // "" for none
	}{
		{"a CPU job", task("raw_exec", map[string]string{"HOME": "/tmp"}, map[string]any{"command": "sleep"}), ""},
		{"NVIDIA_VISIBLE_DEVICES by hand", task("raw_exec", map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}, nil), "sets NVIDIA_VISIBLE_DEVICES"},
		{"CUDA_VISIBLE_DEVICES by hand, a GPU asked for: the plugin's replaces it", task("raw_exec", map[string]string{"CUDA_VISIBLE_DEVICES": "0"}, nil, "nvidia/gpu"), ""},
		{"GPUs hidden: NVIDIA_VISIBLE_DEVICES=void", task("docker", map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}, nil), ""},
		{"GPUs hidden: CUDA_VISIBLE_DEVICES=-1", task("raw_exec", map[string]string{"CUDA_VISIBLE_DEVICES": "-1"}, nil), ""},
		{"GPUs hidden: CUDA_VISIBLE_DEVICES empty", task("raw_exec", map[string]string{"CUDA_VISIBLE_DEVICES": ""}, nil), ""},
		{"CUDA_VISIBLE_DEVICES=0 without a GPU", task("raw_exec", map[string]string{"CUDA_VISIBLE_DEVICES": "0"}, nil), "sets CUDA_VISIBLE_DEVICES"},
		{"privileged as a string", task("docker", nil, map[string]any{"image": "cuda", "privileged": "true"}), "runs privileged"},
		{"a device path with a double slash", task("docker", nil, map[string]any{"devices": []any{map[string]any{"host_path": "/dev//nvidia0"}}}), "NVIDIA devices"},
		{"a device by its major number", task("docker", nil, map[string]any{"devices": []any{map[string]any{"host_path": "/dev/char/195:0"}}}), "NVIDIA devices"},
		{"/dev mounted", task("docker", nil, map[string]any{"volumes": []any{"/dev:/dev"}}), "mounts /dev"},
		{"an NVIDIA device bind-mounted", task("docker", nil, map[string]any{"mount": []any{map[string]any{"type": "bind", "source": "/dev/./nvidia0", "target": "/dev/nvidia0"}}}), "mounts /dev"},
		{"a data volume", task("docker", nil, map[string]any{"volumes": []any{"/data:/data"}}), ""},
		{"the nvidia runtime, a device of count 0", task("docker", nil, map[string]any{"runtime": "nvidia"}, "nvidia/gpu:0"), "nvidia runtime without asking"},
		{"privileged", task("docker", nil, map[string]any{"image": "cuda", "privileged": true}), "runs privileged"},
		{"not privileged", task("docker", nil, map[string]any{"image": "cuda", "privileged": false}), ""},
		{"a /dev/nvidia device", task("docker", nil, map[string]any{"devices": []any{map[string]any{"host_path": "/dev/nvidia0"}}}), "NVIDIA devices"},
		{"a /dev/nvidia device as a string", task("podman", nil, map[string]any{"devices": []any{"/dev/nvidiactl:/dev/nvidiactl"}}), "NVIDIA devices"},
		{"another device", task("docker", nil, map[string]any{"devices": []any{map[string]any{"host_path": "/dev/fuse"}}}), ""},
		{"the nvidia runtime, no GPU asked for", task("docker", nil, map[string]any{"runtime": "nvidia"}), "nvidia runtime without asking for a GPU"},
		{"the nvidia runtime with a GPU device", task("docker", nil, map[string]any{"runtime": "nvidia"}, "nvidia/gpu"), ""},
	} {
		if c.job == nil {
			continue
		}
		got := strings.Join(nomadjob.UndeclaredGPUAccess(c.job), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// Template env overrides the device plugin's, whether the task asks for
	// GPUs or not.
	for text, want := range map[string]bool{
		"NVIDIA_VISIBLE_DEVICES=all":                               true,
		"FOO=1\nCUDA_VISIBLE_DEVICES = {{ key \"gpus\" }}":         true,
		"CUDA_VISIBLE_DEVICES=-1":                                  false,
		`NVIDIA_VISIBLE_DEVICES="void"`:                            false,
		"DB_URL=postgres://x\nNOTE=no NVIDIA_VISIBLE_DEVICES here": true,
	} {
		j := task("raw_exec", nil, nil, "nvidia/gpu")
		j.TaskGroups[0].Tasks[0].Templates = []*api.Template{{EmbeddedTmpl: ptr(text), Envvars: ptr(true)}}
		if got := nomadjob.UndeclaredGPUAccess(j); (len(got) > 0) != want {
			t.Errorf("template env %q: %q, want flagged %t", text, got, want)
		}
	}
}

// A system job's GPU groups are pinned to the nodes fitting at admission:
// counted on those alone, a node that joins adds nothing; pinned again, the
// pin keeps within what it allowed (or the user's own node-id set).
func TestASystemJobIsPinnedToTheNodesItWasCountedOn(t *testing.T) {
	read := func(body string) *nomadjob.Request {
		r, err := nomadjob.ReadRequest(nomadjob.Register, []byte(body), url.Values{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const system = `{"Job":{"ID":"mon","Namespace":"vision","Type":"system","TaskGroups":[{"Name":"g",%s
	  "Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu","Count":1}]}}]},
	  {"Name":"cpu","Tasks":[{"Name":"t"}]}]}}`
	fitting := func(ids ...string) func(string, int) []string { return func(string, int) []string { return ids } }
	three := func(string, int) int { return 3 }

	r := read(fmt.Sprintf(system, ""))
	r.PinNodes(fitting("n1", "n2"))
	groups, err := r.Groups(nil, three)
	if err != nil || len(groups) != 1 || groups[0].Count != 2 {
		t.Fatalf("pinned to 2 of 3 fitting nodes: %+v %v", groups, err)
	}
	var sent struct{ Job api.Job }
	json.Unmarshal(r.Body(), &sent)
	if c := sent.Job.TaskGroups[0].Constraints; len(c) != 1 || c[0].LTarget != "${node.unique.id}" || c[0].Operand != "set_contains_any" || c[0].RTarget != "n1,n2" {
		t.Errorf("the pin Nomad gets: %+v", c)
	}
	if len(sent.Job.TaskGroups[1].Constraints) != 0 {
		t.Errorf("a group without GPUs was pinned")
	}
	// Queued, then admitted when a third node has joined: still n1 and n2.
	again := read(string(r.Body()))
	again.PinNodes(fitting("n1", "n2", "n3"))
	if groups, _ := again.Groups(nil, three); groups[0].Count != 2 || len(again.Job.TaskGroups[0].Constraints) != 1 {
		t.Errorf("pinned again: %+v, constraints %+v", groups, again.Job.TaskGroups[0].Constraints)
	}
	// The user's own node-id set bounds the pin.
	own := read(fmt.Sprintf(system, `"Constraints":[{"LTarget":"${node.unique.id}","Operand":"set_contains_any","RTarget":"n2, n9"}],`))
	own.PinNodes(fitting("n1", "n2"))
	if c := own.Job.TaskGroups[0].Constraints; len(c) != 1 || c[0].RTarget != "n2" {
		t.Errorf("within the user's set: %+v", c)
	}
	// A service job is left as it is.
	svc := read(`{"Job":{"ID":"s","Type":"service","TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Resources":{"Devices":[{"Name":"nvidia/gpu"}]}}]}]}}`)
	svc.PinNodes(fitting("n1"))
	if len(svc.Job.TaskGroups[0].Constraints) != 0 {
		t.Errorf("a service job was pinned")
	}
}

// A stamp binds the job's type and region, as Nomad stores them (P5, P6:
// a batch job's stamp copied onto a sysbatch job of the same groups, and
// a job admitted in east registered straight in west, verified). A job
// naming no region, or "global", is stored in the broker's own; stamps
// made before (v4) verify as they did.
func TestAStampBindsTheJobsTypeAndRegion(t *testing.T) {
	s := nomadjob.Stamper{Key: []byte("k"), Region: "east"}
	d := admission.Decision{Tenant: "vision", Queue: "training", Priority: 60}
	stamped := func(region *string) *api.Job {
		j := testbuild.Job("vision", "train").Type(api.JobTypeBatch).Priority(60).Group("g", 2, 1, "nvidia/gpu").Build()
		j.Region = region
		for k, v := range nomadjob.BrokerMeta(d, s.Stamp("vision", j, d)) {
			j.Meta[k] = v
		}
		return j
	}
	for _, region := range []*string{nil, ptr("global"), ptr("east")} {
		j := stamped(region)
		j.Region = ptr("east") // as Nomad stores it
		if !s.Verify(j) {
			t.Errorf("admitted naming region %v, stored in east: not verified", region)
		}
	}
	for name, change := range map[string]func(j *api.Job){
		"sysbatch":         func(j *api.Job) { j.Type = ptr(api.JobTypeSysbatch) },
		"service":          func(j *api.Job) { j.Type = nil },
		"stored in west":   func(j *api.Job) { j.Region = ptr("west") },
		"another broker's": func(j *api.Job) { j.Region = nil; s.Region = "west" },
	} {
		s.Region = "east"
		j := stamped(ptr("east"))
		change(j)
		if s.Verify(j) {
			t.Errorf("the stamp survived: %s", name)
		}
	}
}

// A job is live unless stopped, or dead after the index its version was
// registered at: dead at that very index is Nomad's first step of a
// registration, before its evaluation makes it pending.
func TestAJobIsLiveUnlessStoppedOrDeadAfterItsRegistration(t *testing.T) {
	for name, c := range map[string]struct {
		job  *api.Job
		want bool
	}{
		"running":                     {testbuild.Job("vision", "a").Build(), true},
		"stopped":                     {testbuild.Job("vision", "a").Stopped().Build(), false},
		"dead after its registration": {testbuild.Job("vision", "a").ModifyIndex(7).Dead().Build(), false},
		"dead at its registration": {func() *api.Job {
			j := testbuild.Job("vision", "a").ModifyIndex(7).Build()
			j.Status, j.ModifyIndex = ptr("dead"), ptr(uint64(7))
			return j
		}(), true},
	} {
		if got := nomadjob.Live(c.job); got != c.want {
			t.Errorf("%s: live %t, want %t", name, got, c.want)
		}
	}
}
