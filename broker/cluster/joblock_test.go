package cluster

import (
	"runtime"
	"sync"
	"testing"
)

// Calls on one job run one at a time, calls on two jobs side by side, and
// nothing is kept once no call holds a job.
func TestJobLocksSerialiseOneJob(t *testing.T) {
	var l jobLocks
	var wg sync.WaitGroup
	inside := map[string]int{}
	var mu sync.Mutex
	for i := 0; i < 50; i++ {
		for _, id := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer l.lock("vision", id)()
				mu.Lock()
				inside[id]++
				if inside[id] > 1 {
					t.Errorf("two calls on job %s at once", id)
				}
				mu.Unlock()
				runtime.Gosched() // let another call try to come in
				mu.Lock()
				inside[id]--
				mu.Unlock()
			}()
		}
	}
	unlockA := l.lock("vision", "a")
	unlockB := l.lock("search", "a") // another namespace: another job
	unlockB()
	unlockA()
	wg.Wait()
	if len(l.locks) != 0 {
		t.Errorf("%d locks kept with no call holding them", len(l.locks))
	}
}
