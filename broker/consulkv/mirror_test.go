package consulkv

import (
	"slices"
	"testing"
)

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

// The list the copy keeps through this broker's own writes and deletes is
// its records, whatever their order.
func TestTheCopysListFollowsItsOwnWritesAndDeletes(t *testing.T) {
	m := &mirror[string]{}
	want := map[string]string{}
	check := func(step string) {
		t.Helper()
		got := m.all()
		if len(got) != len(want) {
			t.Fatalf("%s: %d records, want %d", step, len(got), len(want))
		}
		seen := map[string]bool{}
		for _, v := range got {
			seen[v] = true
		}
		for _, v := range want {
			if !seen[v] {
				t.Fatalf("%s: %q missing from %v", step, v, got)
			}
		}
	}
	check("empty")
	for i, name := range []string{"a", "b", "c", "d"} {
		m.wrote(name, name+"1", uint64(i+1))
		want[name] = name + "1"
	}
	check("four written")
	m.wrote("b", "b2", 10)
	want["b"] = "b2"
	check("one changed")
	for _, name := range []string{"a", "d", "c"} { // the first, the last, one moved
		m.removed(name)
		delete(want, name)
		check("removed " + name)
	}
	m.wrote("e", "e1", 11)
	want["e"] = "e1"
	check("one more")
}

// A view is never changed under its reader: the copy's own later writes
// and deletes leave it as it was handed out.
func TestAViewStaysAsItWasHandedOut(t *testing.T) {
	m := &mirror[string]{}
	m.view() // the list is made
	for i, name := range []string{"a", "b", "c"} {
		m.wrote(name, name+"1", uint64(i+1))
	}
	view := m.view() // with room to grow in place
	before := slices.Clone(view)
	m.wrote("a", "a2", 4) // changed in place
	if !slices.Equal(view, before) {
		t.Fatalf("a write changed the view from %v to %v", before, view)
	}
	view = m.view()
	before = slices.Clone(view)
	m.wrote("d", "d1", 5) // appended past the view's end
	m.removed("b")        // the last one moved into its place
	if !slices.Equal(view, before) {
		t.Errorf("a delete changed the view from %v to %v", before, view)
	}
	got := m.all()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a2", "c1", "d1"}) {
		t.Errorf("the copy holds %v, want a2, c1 and d1", got)
	}
}

// A listing answered just before this broker's own write or delete, and
// applied just after it, neither loses the write nor brings the deleted
// record back. make test once stopped a job queued a moment before: the
// stop found no entry to take out, and the entry would have been admitted.
func TestAnOlderListingKeepsThisBrokersOwnChanges(t *testing.T) {
	m := &mirror[string]{}
	m.records = map[string]mirrored[string]{"old": {"old", 5}, "gone": {"gone", 6}}
	m.wrote("new", "queued here", 9) // after the listing below was made, at 7
	m.removed("gone")
	listing := map[string]mirrored[string]{"old": {"old", 5}, "gone": {"gone", 6}}
	m.records, m.list = m.reconcile(listing, 7), nil
	got := m.all()
	slices.Sort(got)
	if !slices.Equal(got, []string{"old", "queued here"}) {
		t.Fatalf("after the older listing: %v, want the write kept and the delete held", got)
	}
	// A later listing has caught up: the delete is forgotten, and a record
	// made again under the name is taken.
	m.records, m.list = m.reconcile(map[string]mirrored[string]{"old": {"old", 5}, "new": {"queued here", 9}}, 10), nil
	if len(m.gone) != 0 {
		t.Errorf("deletes still held: %v", m.gone)
	}
	m.records, m.list = m.reconcile(map[string]mirrored[string]{"old": {"old", 5}, "new": {"queued here", 9}, "gone": {"again", 11}}, 11), nil
	if got := m.all(); len(got) != 3 {
		t.Errorf("a record made again is missing: %v", got)
	}
}
