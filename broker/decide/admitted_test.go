package decide_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

type grants struct {
	g   map[string]nomadjob.ScaleGrant
	err error
}

func (g grants) Get(_ context.Context, ns, job string) (nomadjob.ScaleGrant, bool, error) {
	v, ok := g.g[ns+"/"+job]
	return v, ok, g.err
}

// stamped is a job the broker admitted borrowed at priority 20, stamped.
func stamped(st nomadjob.Stamper) *api.Job {
	d := admission.Decision{Outcome: admission.AdmitBorrowed, Tenant: "vision", Queue: "training", Priority: 20}
	j := testbuild.Job("vision", "train").Priority(20).Group("g", 2, 1, "nvidia/gpu").Build()
	for k, v := range nomadjob.BrokerMeta(d, st.Stamp("vision", j, d)) {
		j.Meta[k] = v
	}
	return j
}

// Check is the one rule: the stamp as the job stands, else its grant; a
// grant that cannot be read admits nothing.
func TestCheckTakesTheStampElseTheGrant(t *testing.T) {
	st := nomadjob.Stamper{Key: []byte("k")}
	ctx := context.Background()
	j := stamped(st)
	if a, err := decide.Check(ctx, st, nil, j); err != nil || !a.OK || a.ByGrant || !a.Borrowed || a.Grant.Stamped["g"] != 2 {
		t.Errorf("stamped: %+v %v", a, err)
	}
	three := 3
	j.TaskGroups[0].Count = &three // scaled: the stamp no longer verifies
	if a, _ := decide.Check(ctx, st, nil, j); a.OK {
		t.Errorf("scaled, no grant kept: %+v", a)
	}
	scaled := nomadjob.ScaleGrant{Stamp: j.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3}}
	kept := grants{g: map[string]nomadjob.ScaleGrant{"vision/train": scaled}}
	if a, err := decide.Check(ctx, st, kept, j); err != nil || !a.OK || !a.ByGrant || !a.Borrowed {
		t.Errorf("scaled through the broker: %+v %v", a, err)
	}
	down := errors.New("consul unreachable")
	if a, err := decide.Check(ctx, st, grants{err: down}, j); a.OK || !errors.Is(err, down) {
		t.Errorf("grant unreadable: %+v %v", a, err)
	}
	promoted := scaled
	promoted.StampedPriority, promoted.Priority, promoted.From = 20, 25, 20
	j.Priority = &promoted.Priority
	if a, _ := decide.Check(ctx, st, grants{g: map[string]nomadjob.ScaleGrant{"vision/train": promoted}}, j); !a.OK || a.Borrowed {
		t.Errorf("promoted: %+v, want admitted and no longer borrowed", a)
	}
	admitted, borrowed := decide.Verifier(st, kept)(ctx, stamped(st))
	if !admitted || !borrowed {
		t.Errorf("Verifier: %t %t", admitted, borrowed)
	}
}
