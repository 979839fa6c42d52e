package decide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-gpu/nomad-gpu/broker/admission"
	"github.com/nomad-gpu/nomad-gpu/broker/decide"
	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// stamped is a job the broker admitted borrowed at priority 20, stamped.
func stamped(st nomadjob.Stamper) *api.Job {
	d := admission.Decision{Outcome: admission.AdmitBorrowed, Tenant: "vision", Queue: "training", Priority: 20}
	j := testbuild.Job("vision", "train").Priority(20).Group("g", 2, 1, "nvidia/gpu").Build()
	for k, v := range nomadjob.BrokerMeta(d, st.Stamp("vision", j, d)) {
		j.Meta[k] = v
	}
	return j
}

// train is the job stamped makes.
var train = testbuild.Ref("vision", "train")

// Check is the one rule: the stamp as the job stands, else its grant; a
// grant that cannot be read admits nothing.
func TestCheckTakesTheStampElseTheGrant(t *testing.T) {
	st := nomadjob.Stamper{Key: []byte("k")}
	ctx := context.Background()
	j := stamped(st)
	if a, err := decide.Check(ctx, st, decide.Records{}, j); err != nil || !a.OK || a.ByGrant || !a.Borrowed || a.Grant.Stamped["g"] != 2 {
		t.Errorf("stamped: %+v %v", a, err)
	}
	three := 3
	j.TaskGroups[0].Count = &three // scaled: the stamp no longer verifies
	if a, _ := decide.Check(ctx, st, decide.Records{}, j); a.OK {
		t.Errorf("scaled, no grant kept: %+v", a)
	}
	scaled := nomadjob.ScaleGrant{Stamp: j.Meta[nomadjob.MetaAdmission], Stamped: map[string]int{"g": 2}, Admitted: map[string]int{"g": 3}}
	kept := &testbuild.Grants{G: map[nomadjob.Ref]nomadjob.ScaleGrant{train: scaled}}
	if a, err := decide.Check(ctx, st, decide.Records{Grants: kept}, j); err != nil || !a.OK || !a.ByGrant || !a.Borrowed {
		t.Errorf("scaled through the broker: %+v %v", a, err)
	}
	down := errors.New("consul unreachable")
	if a, err := decide.Check(ctx, st, decide.Records{Grants: &testbuild.Grants{Err: down}}, j); a.OK || !errors.Is(err, down) {
		t.Errorf("grant unreadable: %+v %v", a, err)
	}
	promoted := scaled
	promoted.StampedPriority, promoted.Priority, promoted.From = 20, 25, 20
	j.Priority = &promoted.Priority
	if a, _ := decide.Check(ctx, st, decide.Records{Grants: &testbuild.Grants{G: map[nomadjob.Ref]nomadjob.ScaleGrant{train: promoted}}}, j); !a.OK || a.Borrowed {
		t.Errorf("promoted: %+v, want admitted and no longer borrowed", a)
	}
	admitted, borrowed := decide.Verifier(st, decide.Records{Grants: kept})(ctx, stamped(st))
	if !admitted || !borrowed {
		t.Errorf("Verifier: %t %t", admitted, borrowed)
	}
}

// at is the stamped job at JobModifyIndex index.
func at(st nomadjob.Stamper, index uint64) *api.Job {
	j := stamped(st)
	j.JobModifyIndex = &index
	return j
}

// A stamp says "admitted", not "admitted for this run". Once Nomad stopped
// the job, a version registered after the stop verifies only when the broker
// registered it (N6, N8). The stopped version itself still does, and no
// other: an older one made current again (P4: stable on v0) does not.
func TestAStopEndsWhatTheStampStandsFor(t *testing.T) {
	st := nomadjob.Stamper{Key: []byte("k")}
	ctx := context.Background()
	recs := testbuild.Stops{train: {Index: 10}}
	check := func(index uint64) bool {
		a, _ := decide.Check(ctx, st, decide.Records{Stops: recs}, at(st, index))
		return a.OK
	}
	if !check(10) {
		t.Errorf("the stopped version does not verify")
	}
	if check(12) {
		t.Errorf("registered again straight in Nomad, its stamp copied: verifies")
	}
	if check(4) {
		t.Errorf("P4: an older version made current again (stable, straight in Nomad): verifies")
	}
	settle, err := decide.Revive(ctx, recs, train)
	if err != nil || !recs[train].Pending {
		t.Fatalf("revive: %v %+v", err, recs)
	}
	if !check(14) {
		t.Errorf("the broker's registration in flight does not verify")
	}
	if err := settle(true); err != nil || len(recs) != 0 {
		t.Errorf("Nomad took it: %v %+v", err, recs)
	}
	recs[train] = nomadjob.Stopped{Index: 20}
	settle, _ = decide.Revive(ctx, recs, train)
	if err := settle(false); err != nil || recs[train].Pending {
		t.Errorf("Nomad refused it: the record stands again: %v %+v", err, recs)
	}
}

// A stamp binds the version the broker wrote (P2, P3). The same stamp on a
// version Nomad made past the broker (a revert or a scale back to the
// stamped counts, straight in Nomad) is not the broker's admission; the
// broker's own next write, once Nomad answers, is.
func TestAStampBindsTheVersionTheBrokerWrote(t *testing.T) {
	st := nomadjob.Stamper{Key: []byte("k")}
	ctx := context.Background()
	writes := testbuild.Writes{}
	check := func(j *api.Job) bool {
		a, _ := decide.Check(ctx, st, decide.Records{Registrations: writes}, j)
		return a.OK
	}
	if !check(at(st, 30)) {
		t.Errorf("no record kept (admitted before records were): the stamp alone does not verify")
	}
	settle, err := decide.Rewrite(ctx, writes, train, time.Unix(0, 0))
	if err != nil || len(writes) != 0 {
		t.Fatalf("rewrite of a job with no record: %v %+v, want none marked (the stamp alone decides meanwhile)", err, writes)
	}
	if err := settle(40); err != nil || writes[train].Pending || writes[train].Index != 40 {
		t.Fatalf("settled: %v %+v", err, writes)
	}
	settle, err = decide.Rewrite(ctx, writes, train, time.Unix(0, 0))
	if err != nil || !writes[train].Pending {
		t.Fatalf("rewrite: %v %+v", err, writes)
	}
	if !check(at(st, 44)) {
		t.Errorf("the broker's write in flight does not verify")
	}
	if err := settle(40); err != nil || writes[train].Pending || writes[train].Index != 40 {
		t.Fatalf("settled: %v %+v", err, writes)
	}
	if !check(at(st, 40)) {
		t.Errorf("the version the broker wrote does not verify")
	}
	for _, index := range []uint64{45, 38} {
		if check(at(st, index)) {
			t.Errorf("a version at %d made straight in Nomad (revert, scale back, stable on an old one) verifies", index)
		}
	}
	stopped := at(st, 50)
	stopped.Stop = ptr(true)
	if !check(stopped) {
		t.Errorf("the job stopped: its stopping allocations read as unadmitted")
	}
	settle, _ = decide.Rewrite(ctx, writes, train, time.Unix(0, 0))
	if err := settle(0); err != nil || writes[train].Index != 40 || writes[train].Pending {
		t.Errorf("Nomad refused the write: the record stands again: %v %+v", err, writes)
	}
	delete(writes, train)
	settle, _ = decide.Registering(ctx, testbuild.Stops{}, writes, train, time.Unix(0, 0))
	if err := settle(0); err != nil || len(writes) != 0 {
		t.Errorf("refused, no record before: none after: %v %+v", err, writes)
	}
}

func ptr[T any](v T) *T { return &v }
