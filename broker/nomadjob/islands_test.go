package nomadjob_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
)

const h100 = "NVIDIA H100 80GB HBM3"

// A job that names a model some node offers per NVLink island is asked of
// that model's island groups too, by name or by a ${device.model} equality.
// The job read back (from Nomad, as the view reads it) still counts as that
// model. A model without islands, a shared group and an island's own name
// are left as written.
func TestAJobNamingAModelOfferedPerIslandMatchesItsIslands(t *testing.T) {
	islanded := func(model string) bool { return model == h100 }
	body := `{"Job":{"ID":"j","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Resources":{"Devices":[` +
		`{"Name":"nvidia/gpu/` + h100 + `","Count":2},` +
		`{"Name":"gpu","Count":1,"Constraints":[{"LTarget":"${device.model}","Operand":"=","RTarget":"` + h100 + `"}]},` +
		`{"Name":"nvidia/gpu/Tesla T4","Count":1},` +
		`{"Name":"nvidia/gpu/` + h100 + ` (shared)","Count":1},` +
		`{"Name":"nvidia/gpu/` + h100 + ` (island 1)","Count":1}` +
		`]}}]}]}}`
	r, err := read(t, body, "")
	if err != nil {
		t.Fatal(err)
	}
	notes := r.MatchIslands(islanded)
	if len(notes) != 2 || !strings.Contains(notes[0], `device "nvidia/gpu/`+h100+`" is asked as "nvidia/gpu"`) || !strings.Contains(notes[1], `constraint ${device.model} = "`+h100+`"`) {
		t.Errorf("notes %q", notes)
	}
	var back api.JobRegisterRequest
	if err := json.Unmarshal(r.Body(), &back); err != nil {
		t.Fatal(err)
	}
	devs := back.Job.TaskGroups[0].Tasks[0].Resources.Devices
	names := []string{"nvidia/gpu", "gpu", "nvidia/gpu/Tesla T4", "nvidia/gpu/" + h100 + " (shared)", "nvidia/gpu/" + h100 + " (island 1)"}
	for i, want := range names {
		if devs[i].Name != want {
			t.Errorf("device %d: name %q, want %q", i, devs[i].Name, want)
		}
	}
	for _, d := range devs[:2] {
		c := d.Constraints[len(d.Constraints)-1]
		if c.LTarget != "${device.model}" || c.Operand != "regexp" {
			t.Fatalf("device %q: constraint %+v", d.Name, c)
		}
		re := regexp.MustCompile(c.RTarget)
		for group, want := range map[string]bool{h100: true, h100 + " (island 0)": true, h100 + " (island 12)": true,
			h100 + " (shared)": false, "NVIDIA H100 80GB HBM3e": false, "x" + h100: false, h100 + " (island )": false} {
			if re.MatchString(group) != want {
				t.Errorf("%s matches %q: %v, want %v", c.RTarget, group, !want, want)
			}
		}
	}
	groups, err := nomadjob.Groups(back.Job, nomadjob.Placement{})
	if err != nil {
		t.Fatal(err)
	}
	models := map[string]int{}
	for _, g := range groups {
		models[g.Model] += g.GPUsPerAlloc
	}
	if models[h100] != 3 || models["Tesla T4"] != 1 || models[h100+" (island 1)"] != 1 {
		t.Errorf("the job read back asks %v, want 3 GPUs of %s among them", models, h100)
	}
	// A regexp of the user's own is not read as a model.
	own := &api.Job{ID: new("j"), TaskGroups: []*api.TaskGroup{{Name: new("g"), Tasks: []*api.Task{{Name: "t", Resources: &api.Resources{Devices: []*api.RequestedDevice{
		{Name: "gpu", Constraints: []*api.Constraint{{LTarget: "${device.model}", Operand: "regexp", RTarget: "^NVIDIA H100.*$|^x$"}}}}}}}}}}
	if groups, _ := nomadjob.Groups(own, nomadjob.Placement{}); len(groups) != 1 || groups[0].Model != "" {
		t.Errorf("a regexp of the user's own read as model %q", groups[0].Model)
	}
}
