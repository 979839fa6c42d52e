package nomadjob_test

import (
	"encoding/json"
	"net/url"
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// FuzzReadRequest: whatever the body, reading it never panics, and a body the
// broker accepts is forwarded as a document Nomad (encoding/json into its api
// structs) reads with exactly the demand, namespace and priority the broker
// decided on.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte(testbuild.Job("vision", "j").Group("g", 2, 1, "nvidia/gpu").Register()), "")
	f.Add([]byte(`{"job":{"id":"j","taskgroups":[{"name":"g","scaling":{"min":3},"tasks":[{"name":"t","resources":{"devices":[{"name":"//"}]}}]}]}}`), "namespace=x")
	f.Add([]byte(`{"Namespace":"b","Job":{"ID":"j","Type":"system","TaskGroups":[{"Tasks":[{"Resources":{"Devices":[{"Name":"/gpu","Count":2}]}}]}]}}`), "")
	f.Add([]byte(`{"Job":{"ID":"j","TaskGroups":[null]}}`), "")
	f.Add([]byte(`{"Job":{"ID":"j","TaskGroups":[{"Count":1,"count":2}]}}`), "")
	f.Add([]byte(`{"PreserveCounts":true,"Job":{"ID":"j","Meta":{"NOMAD-GPU.borrowed":"true"},"TaskGroups":[{"Name":"g","Tasks":[{"Resources":{"Devices":[{"Name":"gpu","Count":18446744073709551615}]}}]}]}}`), "region=x")
	fits := func(string, int) int { return 2 }
	f.Fuzz(func(t *testing.T, body []byte, query string) {
		q, _ := url.ParseQuery(query)
		r, err := nomadjob.ReadRequest(nomadjob.Register, body, q)
		if err != nil {
			return
		}
		groups, err := r.Groups(nil, fits)
		if err != nil {
			return
		}
		r.Pin()
		d := admission.Decision{Outcome: admission.Admit, Priority: 60, Tenant: "t", Queue: "q"}
		r.Stamp(d, "v2:x")
		var nomad api.JobRegisterRequest
		if err := json.Unmarshal(r.Body(), &nomad); err != nil {
			t.Fatalf("Nomad cannot read the forwarded body: %v\n%s", err, r.Body())
		}
		again, err := nomadjob.Groups(nomad.Job, nomadjob.Placement{NodesFitting: fits})
		if err != nil || !reflect.DeepEqual(again, groups) {
			t.Fatalf("Nomad reads other demand: %+v (%v), broker charged %+v\n%s", again, err, groups, r.Body())
		}
		if nomad.Namespace != r.Namespace || nomad.Job.Namespace == nil || *nomad.Job.Namespace != r.Namespace {
			t.Fatalf("namespace: broker %q, body %q", r.Namespace, nomad.Namespace)
		}
		if nomad.PreserveCounts || nomad.Job.Priority == nil || *nomad.Job.Priority != 60 {
			t.Fatalf("PreserveCounts %v priority %v", nomad.PreserveCounts, nomad.Job.Priority)
		}
		for k, v := range nomad.Job.Meta {
			if nomadjob.IsBrokerMeta(k) && nomadjob.BrokerMeta(d, "v2:x")[k] != v {
				t.Fatalf("caller meta %q=%q survived", k, v)
			}
		}
	})
}
