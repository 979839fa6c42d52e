// Package clock is the one way the broker's decisions and loops read time:
// the real clock in the daemon, one a test sets in tests. (Nomad's own time,
// as its answers tell it, is another matter: nomadapi.Client.NomadNow.)
package clock

import "time"

// Clock tells the time and waits.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Real is the machine's clock.
var Real Clock = real{}

type real struct{}

func (real) Now() time.Time                         { return time.Now() }
func (real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Func is a clock whose time is now's (a test's), and which waits as the
// real one does.
type Func func() time.Time

func (f Func) Now() time.Time                       { return f() }
func (Func) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Fixed is a clock stopped at a time.
func Fixed(t time.Time) Clock { return Func(func() time.Time { return t }) }
