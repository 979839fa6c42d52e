package nomadapi

import (
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// Only the evaluations of the version registered count: pending ones are
// waited for, a blocked one places later, a finished one without placements
// says why.
func TestEvaluatedReadsTheRegistrationsEvaluations(t *testing.T) {
	ev := func(index uint64, status, blocked string, failed map[string]*api.AllocationMetric) *api.Evaluation {
		return &api.Evaluation{JobModifyIndex: index, Status: status, BlockedEval: blocked, FailedTGAllocs: failed}
	}
	for _, c := range []struct {
		name  string
		evals []*api.Evaluation
		done  bool
		why   string
	}{
		{"none yet", []*api.Evaluation{ev(5, api.EvalStatusComplete, "", nil)}, false, ""},
		{"pending", []*api.Evaluation{ev(9, api.EvalStatusPending, "", nil)}, false, ""},
		{"blocked: waits for room", []*api.Evaluation{ev(9, api.EvalStatusBlocked, "", nil)}, true, ""},
		{"complete with a blocked one", []*api.Evaluation{ev(9, api.EvalStatusComplete, "b1", nil)}, true, ""},
		{"complete", []*api.Evaluation{ev(9, api.EvalStatusComplete, "", nil)}, true, "without placing"},
		{"complete, a group not placed", []*api.Evaluation{ev(9, api.EvalStatusComplete, "",
			map[string]*api.AllocationMetric{"g": {NodesFiltered: 2}})}, true, `group "g": 2 filtered, 0 exhausted`},
	} {
		done, why := evaluated(c.evals, 9)
		if done != c.done || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("%s: %t %q, want %t %q", c.name, done, why, c.done, c.why)
		}
	}
}
