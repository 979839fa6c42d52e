package admitter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nomad-gpu/nomad-gpu/testing/testbuild"
)

// BenchmarkIdleTick is what one tick of the leader's queue loop costs with
// 10,000 jobs queued and nothing changed: a whole pass (every tick, every 2 s,
// before), and the check that lets it skip the pass (now).
func BenchmarkIdleTick(b *testing.B) {
	const queued = 10_000
	a, q, _, view, now := setup(b, visionPolicy, 8)
	view.ObserveJob(testbuild.Job("vision", "held").Group("g", 1, 8, "gpu").Build()) // vision at its limit: nothing admitted
	for i := 0; i < queued; i++ {
		q.Put(context.Background(), entry(fmt.Sprintf("j%05d", i), 1, time.Duration(i)*time.Second, now))
	}
	b.Run("pass", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if n, err := a.Pass(context.Background()); n != 0 || err != nil {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		tick := make(chan time.Time)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(ctx, make(chan struct{}), tick); close(done) }()
		tick <- now // after the first pass
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			tick <- now
		}
		b.StopTimer()
		cancel()
		<-done
	})
}
