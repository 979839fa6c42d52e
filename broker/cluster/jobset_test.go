package cluster

import (
	"maps"
	"testing"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
)

// A job counts its groups, its deployment's unpromoted canaries, and, while
// that deployment may revert, no less than its stable version. A listing
// starts from the stable versions of the jobs it still lists, and nothing
// else. A job Nomad no longer has leaves nothing behind.
func TestTheJobsTrackerCountsCanariesAndTheStableVersion(t *testing.T) {
	s := newJobSet()
	key, other := jobKey{"vision", "train"}, jobKey{"vision", "gone"}
	groups := []admission.Group{{Name: "g", Count: 2, GPUsPerAlloc: 1, Model: "A"}}
	demand := func(want map[string]int, when string) {
		t.Helper()
		if got := s.demand(key, groups); !maps.Equal(got, want) {
			t.Errorf("%s: demand %v, want %v", when, got, want)
		}
	}
	demand(map[string]int{"A": 2}, "no deployment")

	s.deployment(key, map[string]int{"g": 1}, false)
	demand(map[string]int{"A": 3}, "one canary")

	s.setStable(key, []admission.Group{{Name: "g", Count: 1, GPUsPerAlloc: 4, Model: "A"}})
	demand(map[string]int{"A": 3}, "a stable version, no revert")
	s.deployment(key, map[string]int{"g": 1}, true)
	demand(map[string]int{"A": 4}, "a deployment that may revert to 4 GPUs")

	s.deployment(key, nil, false)
	demand(map[string]int{"A": 2}, "the deployment ended")
	s.setStable(key, nil)
	if _, ok := s.stable[key]; ok {
		t.Errorf("a stable version with no GPUs is kept")
	}

	s.setStable(key, groups)
	s.setStable(other, groups)
	s.live[key], s.undeclared[key] = job{groups: groups}, "a device mount"
	s.deployment(other, map[string]int{"g": 1}, true)
	r := s.relisted(func(k jobKey) bool { return k == key })
	if len(r.stable) != 1 || r.stable[key] == nil || len(r.live)+len(r.canaries)+len(r.reverting)+len(r.undeclared) != 0 {
		t.Errorf("a listing starts from %+v, want the listed job's stable version alone", r)
	}

	s.forget(other)
	if len(s.canaries)+len(s.reverting) != 0 || s.stable[other] != nil {
		t.Errorf("a forgotten job left %+v", s)
	}
}
