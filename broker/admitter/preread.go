package admitter

import (
	"context"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/nomad-gpu/nomad-gpu/broker/nomadjob"
	"github.com/nomad-gpu/nomad-gpu/broker/queue"
)

// prereadWindow is how far, in entries per core, reading may run ahead of
// the entry the pass decides: the parsed jobs held at once.
const prereadWindow = 4

// preread reads the requests of a pass's entries, in the order it decides
// them, on every core while it decides: a new leader's first pass reads
// every queued job (10,000 of 20 KB took 2.5 s on one core), and reading
// one depends on nothing but its bytes.
type preread struct {
	index   map[string]int // by entry id, its place in futures
	futures []chan readResult
	reached atomic.Int64  // the entries before it the pass is past
	moved   chan struct{} // reached moved on
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

type readResult struct {
	req *nomadjob.Request
	err error
}

// readRequest reads e's request as the pass decides on it.
func readRequest(e queue.Entry) (*nomadjob.Request, error) {
	body, err := e.Body()
	if err != nil {
		return nil, err
	}
	return nomadjob.ReadRequest(nomadjob.Register, body, url.Values{"namespace": {e.Namespace}})
}

// newPreread starts reading entries' requests ahead of the pass (nil: on
// one core, or for one entry, it would gain nothing); done stops it.
func newPreread(ctx context.Context, entries []queue.Entry) *preread {
	readers := runtime.GOMAXPROCS(0)
	if len(entries) < 2 || readers < 2 {
		return nil
	}
	ctx, stop := context.WithCancel(ctx)
	pr := &preread{index: make(map[string]int, len(entries)), futures: make([]chan readResult, len(entries)),
		moved: make(chan struct{}, 1), stop: stop}
	for i, e := range entries {
		pr.index[e.ID] = i
		pr.futures[i] = make(chan readResult, 1)
	}
	next := make(chan int)
	window := int64(readers * prereadWindow)
	pr.wg.Add(1 + readers)
	go func() { // hands out the entries in order, a window ahead of the pass
		defer pr.wg.Done()
		defer close(next)
		for i := range entries {
			for int64(i) >= pr.reached.Load()+window {
				select {
				case <-pr.moved:
				case <-ctx.Done():
					return
				}
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range readers {
		go func() {
			defer pr.wg.Done()
			for i := range next {
				req, err := readRequest(entries[i])
				pr.futures[i] <- readResult{req, err} // buffered: never waits
			}
		}()
	}
	return pr
}

// read is e's request: read ahead where the pass was given e, else now.
// The entries before e are behind the pass, read or not.
func (pr *preread) read(e queue.Entry) (*nomadjob.Request, error) {
	if pr == nil {
		return readRequest(e)
	}
	i, ok := pr.index[e.ID]
	if !ok {
		return readRequest(e)
	}
	delete(pr.index, e.ID) // taken once: a second read reads again
	if int64(i+1) > pr.reached.Load() {
		pr.reached.Store(int64(i + 1))
		select {
		case pr.moved <- struct{}{}:
		default:
		}
	}
	r := <-pr.futures[i]
	return r.req, r.err
}

// done stops the readers and waits for them.
func (pr *preread) done() {
	if pr != nil {
		pr.stop()
		pr.wg.Wait()
	}
}
