package consulkv

import "testing"

// A write read back after the copy's query already brought a later version
// of the record leaves that version: the leader claimed a parked entry
// forever from an older one, every claim failing its version check.
func TestTheCopyNeverGoesBackToAnOlderVersion(t *testing.T) {
	m := &mirror[string]{}
	m.wrote("e", "unparked, as the query brought it", 12)
	m.wrote("e", "unparked, read back late", 11)
	if got := m.records["e"]; got.index != 12 || got.v != "unparked, as the query brought it" {
		t.Errorf("the copy went back to %+v", got)
	}
	m.wrote("e", "claimed", 13)
	if got := m.all(); len(got) != 1 || got[0] != "claimed" {
		t.Errorf("a later version not taken: %v", got)
	}
	m.removed("e")
	if got := m.all(); len(got) != 0 {
		t.Errorf("removed, still listed: %v", got)
	}
}
