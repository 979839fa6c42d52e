package audit_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/audit"
)

func TestEventsRotateAndReadBackInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log", "audit.log")
	l, err := audit.Open(path, 400, 3, "http://127.0.0.1:4649")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now().UTC().Add(-time.Second)
	for i := 0; i < 20; i++ {
		if err := l.Write(audit.Event{Who: "alice (acc-1)", What: audit.Admission, Job: fmt.Sprintf("job-%02d", i), Namespace: "vision",
			Result: "admit"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{path, path + ".1", path + ".2", path + ".3"} {
		if st, err := os.Stat(name); err != nil || st.Size() > 400 {
			t.Errorf("%s: %v %v", name, st, err)
		}
	}
	if _, err := os.Stat(path + ".4"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("more files kept than max_files: %v", err)
	}
	got, _, more, err := l.Page(audit.Cursor{Since: start}, audit.MaxPage, func(e audit.Event) bool { return e.Namespace == "vision" })
	if err != nil || more {
		t.Fatal(err, more)
	}
	// The oldest rotated away; the rest in order, each whole.
	if len(got) < 8 || got[len(got)-1].Job != "job-19" || got[0].Broker != "http://127.0.0.1:4649" || got[0].Who != "alice (acc-1)" {
		t.Fatalf("read %d events: first %+v last %+v", len(got), got[0], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if got[i].Job <= got[i-1].Job {
			t.Fatalf("out of order at %d: %s after %s", i, got[i].Job, got[i-1].Job)
		}
	}
	if later, _, _, _ := l.Page(audit.Cursor{Since: time.Now().Add(time.Hour)}, audit.MaxPage, nil); len(later) != 0 {
		t.Errorf("since in the future: %d events", len(later))
	}
}

func TestAFailedWriteIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, 1<<20, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	var reported error
	l.Failed = func(err error) { reported = err }
	// The file replaced by a directory: no write can be made, even as root.
	l.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(audit.Event{What: audit.Admission}); err == nil || reported == nil {
		t.Fatalf("write: %v, reported: %v", err, reported)
	}
}

func TestANilLogWritesNothing(t *testing.T) {
	var l *audit.Log
	if err := l.Write(audit.Event{What: audit.Admission}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := l.Page(audit.Cursor{}, audit.MaxPage, nil); err == nil {
		t.Fatal("reading a log that is not configured gave no error")
	}
}

// A full disk cuts a write short: the part written is cut back off, the
// request that needed the record is refused, and once there is room again
// the next record reads back whole.
func TestAWriteCutShortByAFullDiskLeavesNoTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, 1<<20, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Write(audit.Event{What: audit.Admission, Job: "before"}); err != nil {
		t.Fatal(err)
	}
	free := audit.FillDiskAfter(l, 40)
	if err := l.Write(audit.Event{What: audit.Admission, Job: "cut-short"}); err == nil {
		t.Fatal("a write the disk cut short reported no error")
	}
	free()
	if err := l.Write(audit.Event{What: audit.Admission, Job: "after"}); err != nil {
		t.Fatal(err)
	}
	got, _, _, err := l.Page(audit.Cursor{}, audit.MaxPage, nil)
	if err != nil || len(got) != 2 || got[0].Job != "before" || got[1].Job != "after" {
		t.Errorf("read back: %+v %v", got, err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "cut-short") {
		t.Errorf("the torn part is still in the file:\n%s", b)
	}
}

// A reader skips a torn line (one a crash cut) and reads the record after
// it. A cut that took the newline too leaves the fragment last in the
// file, and the first record a broker restarted on that trail writes starts
// a line of its own.
func TestATornLineIsSkippedAndTheNextRecordRead(t *testing.T) {
	for _, end := range []string{"\n", ""} {
		path := filepath.Join(t.TempDir(), "audit.log")
		if err := os.WriteFile(path, []byte(`{"time":"2026-12-01T10:00:00Z","what":"admission","job":"a"}`+"\n"+`{"time":"2026-12-01T10:00:01Z","what":"adm`+end), 0o640); err != nil {
			t.Fatal(err)
		}
		l, err := audit.Open(path, 1<<20, 2, "b")
		if err != nil {
			t.Fatal(err)
		}
		l.Write(audit.Event{What: audit.Admission, Job: "c"})
		got, _, _, err := l.Page(audit.Cursor{}, audit.MaxPage, nil)
		if err != nil || len(got) != 2 || got[0].Job != "a" || got[1].Job != "c" {
			t.Errorf("the fragment ending %q: read back %+v %v", end, got, err)
		}
		l.Close()
	}
}

// A line over MaxLine (written by another program, or by hand) is skipped
// like a torn one: it never makes reading the file fail. A record the
// broker writes that would be that long is kept, its result cut.
func TestALineOverAMebibyteIsSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	huge := `{"time":"2026-12-01T10:00:01Z","what":"admission","job":"huge","result":"` + strings.Repeat("x", 2<<20) + `"}`
	if err := os.WriteFile(path, []byte(`{"time":"2026-12-01T10:00:00Z","what":"admission","job":"a"}`+"\n"+huge+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(path, 64<<20, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Write(audit.Event{What: audit.Admission, Job: "c", Result: strings.Repeat("y", 3<<20)})
	got, _, _, err := l.Page(audit.Cursor{}, audit.MaxPage, nil)
	if err != nil || len(got) != 2 || got[0].Job != "a" || got[1].Job != "c" {
		t.Fatalf("read back: %d events %v", len(got), err)
	}
	if r := got[1].Result; len(r) > audit.MaxLine || !strings.HasSuffix(r, "(cut: the record was over 1 MiB)") {
		t.Errorf("the long record's result: %d bytes, ending %q", len(r), r[max(0, len(r)-50):])
	}
}

// logrotate without copytruncate renames the file away: the next record
// goes to a new file at the path, not to the renamed one.
func TestAFileRenamedAwayIsReopened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, 1<<20, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Write(audit.Event{What: audit.Admission, Job: "old"})
	if err := os.Rename(path, path+".rotated"); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(audit.Event{What: audit.Admission, Job: "new"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), `"job":"new"`) {
		t.Errorf("the new file: %q %v", b, err)
	}
	os.Remove(path)
	if err := l.Write(audit.Event{What: audit.Admission, Job: "removed"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), `"job":"removed"`) {
		t.Errorf("after a remove: %q %v", b, err)
	}
}

// Pages follow each other without a gap or a repeat, events of the same
// instant included.
func TestPagesFollowEachOther(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	var b strings.Builder
	for i := 0; i < 25; i++ {
		// Three events an instant: a page may end inside one.
		fmt.Fprintf(&b, `{"time":"2026-12-01T10:00:%02dZ","what":"admission","job":"j%02d"}`+"\n", i/3, i)
	}
	writeFile(t, path, b.String())
	l, err := audit.Open(path, 1<<20, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var seen []string
	c := audit.Cursor{}
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("no end of pages")
		}
		got, next, more, err := l.Page(c, 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			seen = append(seen, e.Job)
		}
		if !more {
			break
		}
		if c, err = audit.ParseCursor(next.String()); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 25 {
		t.Fatalf("%d events over the pages: %v", len(seen), seen)
	}
	for i, j := range seen {
		if j != fmt.Sprintf("j%02d", i) {
			t.Fatalf("event %d is %s: %v", i, j, seen)
		}
	}
}

// Reading a large trail holds a page, not the trail: the heap grows by far
// less than the trail's size (32 MiB here; the whole trail read into memory
// took several times its size).
func TestReadingALargeTrailHoldsAPage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	line := `{"time":"2026-12-01T10:00:00Z","broker":"http://10.0.0.5:4649","who":"ana (5f2c)","what":"admission","namespace":"vision","job":"train-` +
		strings.Repeat("x", 300) + `","tenant":"vision","queue":"training","result":"admit: within tenant \"vision\"'s guarantee"}` + "\n"
	w := bufio.NewWriter(f)
	for written := 0; written < 32<<20; written += len(line) {
		w.WriteString(line)
	}
	w.Flush()
	f.Close()
	l, err := audit.Open(path, 1<<30, 2, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}
	}()
	// Every event but one in ten thousand filtered out: the whole trail is
	// read, a page kept.
	n := 0
	got, _, more, err := l.Page(audit.Cursor{}, audit.MaxPage, func(audit.Event) bool { n++; return n%10000 == 0 })
	close(stop)
	<-sampled
	if err != nil || len(got) != n/10000 || more || n < 32<<20/len(line) {
		t.Fatalf("%d events read, %d kept, more %t: %v", n, len(got), more, err)
	}
	if grew := int64(peak.Load()) - int64(before.HeapInuse); grew > 16<<20 {
		t.Errorf("the heap grew by %d MiB reading a 32 MiB trail", grew>>20)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o640); err != nil {
		t.Fatal(err)
	}
}
