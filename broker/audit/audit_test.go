package audit_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	got, err := l.Read(start, func(e audit.Event) bool { return e.Namespace == "vision" })
	if err != nil {
		t.Fatal(err)
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
	if later, _ := l.Read(time.Now().Add(time.Hour), nil); len(later) != 0 {
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
	if _, err := l.Read(time.Time{}, nil); err == nil {
		t.Fatal("reading a log that is not configured gave no error")
	}
}
