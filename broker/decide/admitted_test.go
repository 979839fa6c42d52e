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
	if a, err := decide.Check(ctx, st, nil, nil, j); err != nil || !a.OK || a.ByGrant || !a.Borrowed || a.Grant.Stamped["g"] != 2 {
		t.Errorf("stamped: %+v %v", a, err)
	}
	three := 3
	j.TaskGroups[0].Count = &three // scaled: the stamp no longer verifies
	if a, _ := decide.Check(ctx, st, nil, nil, j); a.OK {
		t.Errorf("scaled, no grant kept: %+v", a)
	}
	scaled := nomadjob.ScaleGrant{Stamp: j.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3}}
	kept := grants{g: map[string]nomadjob.ScaleGrant{"vision/train": scaled}}
	if a, err := decide.Check(ctx, st, kept, nil, j); err != nil || !a.OK || !a.ByGrant || !a.Borrowed {
		t.Errorf("scaled through the broker: %+v %v", a, err)
	}
	down := errors.New("consul unreachable")
	if a, err := decide.Check(ctx, st, grants{err: down}, nil, j); a.OK || !errors.Is(err, down) {
		t.Errorf("grant unreadable: %+v %v", a, err)
	}
	promoted := scaled
	promoted.StampedPriority, promoted.Priority, promoted.From = 20, 25, 20
	j.Priority = &promoted.Priority
	if a, _ := decide.Check(ctx, st, grants{g: map[string]nomadjob.ScaleGrant{"vision/train": promoted}}, nil, j); !a.OK || a.Borrowed {
		t.Errorf("promoted: %+v, want admitted and no longer borrowed", a)
	}
	admitted, borrowed := decide.Verifier(st, kept, nil)(ctx, stamped(st))
	if !admitted || !borrowed {
		t.Errorf("Verifier: %t %t", admitted, borrowed)
	}
}

// stops keeps stopped-job records in memory.
type stops map[string]nomadjob.Stopped

func (s stops) Stopped(ns, job string) (nomadjob.Stopped, bool) { r, ok := s[ns+"/"+job]; return r, ok }
func (s stops) Put(_ context.Context, ns, job string, r nomadjob.Stopped) error {
	s[ns+"/"+job] = r
	return nil
}
func (s stops) Delete(_ context.Context, ns, job string) error { delete(s, ns+"/"+job); return nil }

// A stamp says "admitted", not "admitted for this run": once Nomad stopped
// the job, a version registered after the stop verifies only when the broker
// registered it (N6, N8); the stopped version itself still does.
func TestAStopEndsWhatTheStampStandsFor(t *testing.T) {
	st := nomadjob.Stamper{Key: []byte("k")}
	ctx := context.Background()
	at := func(index uint64) *api.Job {
		j := stamped(st)
		j.JobModifyIndex = &index
		return j
	}
	recs := stops{"vision/train": {Index: 10}}
	if a, _ := decide.Check(ctx, st, nil, recs, at(10)); !a.OK {
		t.Errorf("the stopped version: %+v", a)
	}
	if a, _ := decide.Check(ctx, st, nil, recs, at(12)); a.OK {
		t.Errorf("registered again straight in Nomad, its stamp copied: %+v", a)
	}
	settle, err := decide.Revive(ctx, recs, "vision", "train")
	if err != nil || !recs["vision/train"].Pending {
		t.Fatalf("revive: %v %+v", err, recs)
	}
	if a, _ := decide.Check(ctx, st, nil, recs, at(14)); !a.OK {
		t.Errorf("the broker's registration in flight: %+v", a)
	}
	if err := settle(true); err != nil || len(recs) != 0 {
		t.Errorf("Nomad took it: %v %+v", err, recs)
	}
	recs["vision/train"] = nomadjob.Stopped{Index: 20}
	settle, _ = decide.Revive(ctx, recs, "vision", "train")
	if err := settle(false); err != nil || recs["vision/train"].Pending {
		t.Errorf("Nomad refused it: the record stands again: %v %+v", err, recs)
	}
}
