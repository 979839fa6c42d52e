package cluster

import (
	"testing"
	"time"
)

// A reservation is acted on by its own seq alone. Confirmed, it ends once
// the job as recorded covers it at the index Nomad took it at, with a short
// grace while it does not. One confirmed under another id moves there. A
// stop after the registration Nomad took ends it, and each expires.
func TestReservationsLiveUntilTheirJobShowsOrTheyExpire(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	train, child := jobKey{"vision", "train"}, jobKey{"vision", "train/dispatch-1"}
	rs := newReservations()
	old := rs.add(train, map[string]int{"H100": 2}, false, t0.Add(ReservationHold))
	seq := rs.add(train, map[string]int{"H100": 2}, false, t0.Add(ReservationHold)) // registered again
	if rs.confirm(train, old, 7, t0) || !rs.confirm(train, seq, 9, t0) {
		t.Fatalf("confirm by the replaced seq, or by its own")
	}
	if !rs.registers(train, 9) || rs.registers(train, 8) {
		t.Errorf("the version the broker registers: 9, not 8")
	}
	rs.settle(train, true, map[string]int{"H100": 2}, 8, t0) // an older version's event
	rs.settle(train, true, map[string]int{"H100": 1}, 9, t0) // less than reserved: a grace
	if !rs.live(train, t0.Add(settleGrace-time.Second)) || rs.live(train, t0.Add(settleGrace)) {
		t.Errorf("a reservation its job does not cover yet: kept settleGrace, no more")
	}
	rs.settle(train, true, map[string]int{"H100": 2}, 9, t0)
	if rs.live(train, t0) {
		t.Errorf("a reservation its job covers at its index is not ended")
	}

	seq = rs.add(train, map[string]int{"H100": 1}, true, t0.Add(ReservationHold))
	if rs.move(train, child, seq+1, 12) || !rs.move(train, child, seq, 12) || rs.live(train, t0) || !rs.live(child, t0) {
		t.Errorf("a dispatch's reservation moves to its child by its own seq alone")
	}
	rs.stopped(child, 11) // a stop before Nomad took it: not this registration's
	if !rs.live(child, t0) {
		t.Errorf("a stop before the registration ended it")
	}
	rs.stopped(child, 13)
	if rs.live(child, t0) {
		t.Errorf("a stop after the registration Nomad took did not end it")
	}

	seq = rs.add(train, map[string]int{"H100": 1}, false, t0.Add(ReservationHold))
	rs.confirm(train, seq, 0, t0) // Nomad made the job under another id
	if len(rs.unexpired(t0.Add(settleGrace-time.Second))) != 1 || len(rs.unexpired(t0.Add(settleGrace))) != 0 {
		t.Errorf("confirmed under another id: kept settleGrace, then dropped")
	}
	seq = rs.add(train, map[string]int{"H100": 1}, false, t0.Add(ReservationHold))
	rs.withdraw(train, seq+1)
	if !rs.live(train, t0) {
		t.Errorf("withdrawn by another seq")
	}
	rs.withdraw(train, seq)
	if rs.live(train, t0) {
		t.Errorf("not withdrawn by its own seq")
	}
}
