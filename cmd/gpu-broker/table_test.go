package main

import (
	"strings"
	"testing"
)

func TestATableWrapsItsLastColumnAndNeverCutsIt(t *testing.T) {
	reason := `admit-borrowed: beyond tenant "vision"'s guarantee of 8 GPUs (8 held), within its limit of 12; ` +
		"runs at the borrowing band and Nomad may preempt it; id 0123456789abcdef0123456789abcdef"
	tab := newTable("TIME", "JOB", "RESULT")
	tab.row("2026-12-02T03:00:00Z", "train-borrowed", reason)
	tab.row("2026-12-02T03:00:01Z", "dev-env", "queued")
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") }

	// At 40 the other columns leave the result too little room: it goes on
	// lines of its own under its row.
	for _, width := range []int{80, 60, 40} {
		var b strings.Builder
		tab.print(&b, width)
		out := b.String()
		for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if strings.HasSuffix(line, " ") {
				t.Errorf("width %d: a line ends in spaces: %q", width, line)
			}
			if len(line) > width && !strings.HasPrefix(line, "2026") && !strings.HasPrefix(line, "TIME") {
				t.Errorf("width %d: a line of %d characters:\n%s", width, len(line), out)
			}
		}
		// (A row's other columns may be wider than the terminal: they are
		// never cut either.) Every word is there, in order; a word longer than the room is
		// split, so compare without the spaces wrapping added.
		if flat := strings.ReplaceAll(out, " ", ""); !strings.Contains(strings.ReplaceAll(flat, "\n", ""),
			strings.ReplaceAll(reason, " ", "")) {
			t.Errorf("width %d: the result is cut:\n%s", width, out)
		}
		if !strings.Contains(words(out), words("2026-12-02T03:00:01Z dev-env queued")) {
			t.Errorf("width %d: the second row is not a row:\n%s", width, out)
		}
	}

	var b strings.Builder
	tab.print(&b, 0) // -wide, or a pipe
	if lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); len(lines) != 3 || !strings.HasSuffix(lines[1], reason) ||
		lines[0] != "TIME                  JOB             RESULT" {
		t.Errorf("wide: not one line a row, aligned:\n%s", b.String())
	}
	// At 80 columns the result wraps beside the others, under its heading.
	b.Reset()
	tab.print(&b, 80)
	if lines := strings.Split(b.String(), "\n"); !strings.HasPrefix(lines[2], strings.Repeat(" ", 38)) || lines[2][38] == ' ' {
		t.Errorf("80 columns: the result does not continue under its heading:\n%s", b.String())
	}
}

func TestOutputWidth(t *testing.T) {
	t.Setenv("COLUMNS", "93")
	if w := outputWidth(false); w != 93 {
		t.Errorf("COLUMNS=93: width %d", w)
	}
	if w := outputWidth(true); w != 0 {
		t.Errorf("-wide: width %d, want 0 (no wrapping)", w)
	}
	t.Setenv("COLUMNS", "")
	if w := outputWidth(false); w != 0 { // go test's stdout is not a terminal
		t.Errorf("not a terminal: width %d, want 0", w)
	}
}
