package main

import (
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// A table prints rows aligned under a header. Its last column is free
// text (a reason, a result) and is never cut: where the terminal is
// narrower than a row, that column wraps under itself, the way nomad
// prints long fields. At width 0 (-wide, or output to a pipe, which
// scripts read line by line) every row stays on one line.
type table struct {
	rows [][]string
}

const wideUsage = "print each row on one line, however long (default: wrap the last column to the terminal's width, or $COLUMNS)"

// narrowest is the fewest characters a wrapped last column gets beside
// the others; below it the text goes on lines of its own under the row.
const narrowest = 24

func newTable(header ...string) *table { return &table{rows: [][]string{header}} }

func (t *table) row(cols ...string) { t.rows = append(t.rows, cols) }

func (t *table) print(w io.Writer, width int) {
	n := len(t.rows[0])
	widths := make([]int, n-1)
	for _, r := range t.rows {
		for i := range widths {
			widths[i] = max(widths[i], utf8.RuneCountInString(r[i]))
		}
	}
	indent := 0
	for _, cw := range widths {
		indent += cw + 2
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.Reset()
		for i, cw := range widths {
			b.WriteString(r[i])
			b.WriteString(strings.Repeat(" ", cw+2-utf8.RuneCountInString(r[i])))
		}
		last := r[n-1]
		switch {
		case width <= 0 || indent+utf8.RuneCountInString(last) <= width:
			b.WriteString(last)
		case width-indent >= narrowest:
			b.WriteString(strings.Join(wrap(last, width-indent), "\n"+strings.Repeat(" ", indent)))
		default: // the other columns leave it too little room
			head := strings.TrimRight(b.String(), " ")
			b.Reset()
			b.WriteString(head + "\n    " + strings.Join(wrap(last, max(width-4, narrowest)), "\n    "))
		}
		io.WriteString(w, strings.TrimRight(b.String(), " ")+"\n")
	}
}

// wrap breaks text into lines of at most width characters at spaces; a
// word longer than width (an id, a URL) is split rather than lost.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		for utf8.RuneCountInString(word) > width {
			if line != "" {
				lines, line = append(lines, line), ""
			}
			cut := []rune(word)
			lines, word = append(lines, string(cut[:width])), string(cut[width:])
		}
		switch {
		case line == "":
			line = word
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
			line += " " + word
		default:
			lines, line = append(lines, line), word
		}
	}
	return append(lines, line)
}

// outputWidth is the width tables wrap to: 0 (no wrapping) with -wide;
// else $COLUMNS where set (shells do not export it unless asked); else
// the terminal's width, and 0 when standard output is not a terminal.
func outputWidth(wide bool) int {
	if wide {
		return 0
	}
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		return c
	}
	ws, err := unix.IoctlGetWinsize(int(os.Stdout.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}
