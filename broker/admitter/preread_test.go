package admitter

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// A pass's reads ahead give each entry its own request, whichever entries
// the pass skips or takes out of turn, and stop with the pass: a pass never
// waits on a read nobody makes.
func TestReadsAheadGiveEachEntryItsOwnRequest(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	entries := make([]queue.Entry, 100)
	for i := range entries {
		entries[i] = queue.Entry{ID: fmt.Sprintf("e%03d", i), Namespace: "vision",
			Request: []byte(fmt.Sprintf(`{"Job":{"ID":"job-%03d","Namespace":"vision"}}`, i))}
	}
	entries[7].Request = []byte(`{"Job":`) // a request that cannot be read
	check := func(pr *preread, i int) {
		t.Helper()
		req, err := pr.read(entries[i])
		switch {
		case i == 7 && err == nil:
			t.Errorf("entry 7 read without an error")
		case i != 7 && (err != nil || req.JobID != fmt.Sprintf("job-%03d", i)):
			t.Errorf("entry %d read as %v, %v", i, req, err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pr := newPreread(context.Background(), entries[:90])
		for i := 0; i < 90; i += 3 { // skipping two of each three
			check(pr, i)
		}
		check(pr, 95) // not given: read now
		check(pr, 7)  // skipped, then taken: its own error
		check(pr, 3)  // behind the pass, taken out of turn
		check(pr, 3)  // a second read reads again
		pr.done()
		pr = newPreread(context.Background(), entries)
		check(pr, 0)
		pr.done() // most never read
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a read or done waited for good")
	}
}
