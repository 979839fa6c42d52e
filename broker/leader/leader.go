// Package leader elects one broker through a Consul lock. The leader runs the
// queue and takes every GPU admission, since the other brokers send their
// callers' GPU requests to it. So all decisions about quota happen in one
// place, one after the other, and two brokers can never each admit the last
// GPUs of a tenant.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Elector holds or follows the leader lock at Key. The lock's value is the
// leader's address, where the others send GPU admissions.
type Elector struct {
	Client  *consul.Client
	Key     string
	Address string // this broker's address for the others, e.g. http://127.0.0.1:4649
	Log     hclog.Logger
	Clock   clock.Clock

	leading atomic.Bool

	mu       sync.Mutex
	cached   string
	cachedAt time.Time
}

// addressTTL is how long a follower reuses the leader's address it read.
const addressTTL = time.Second

// IsLeader reports whether this broker holds the lock now.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// LeaderAddress is the address of the broker holding the lock, read from
// Consul (at most once a second); an error when none holds it.
func (e *Elector) LeaderAddress(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cached != "" && e.Clock.Now().Sub(e.cachedAt) < addressTTL {
		return e.cached, nil
	}
	pair, _, err := e.Client.KV().Get(e.Key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("read the leader from Consul: %w", err)
	}
	if pair == nil || pair.Session == "" || len(pair.Value) == 0 {
		return "", fmt.Errorf("no broker is leader right now")
	}
	e.cached, e.cachedAt = string(pair.Value), e.Clock.Now()
	return e.cached, nil
}

// Run runs work while this broker holds the lock, taking it again whenever it
// is lost, until ctx ends.
func (e *Elector) Run(ctx context.Context, work func(context.Context)) {
	stale := "" // a session of ours not ended yet
	for ctx.Err() == nil {
		if stale != "" {
			// Until it ends, a session that held the key holds it for up to
			// two TTLs after Consul is back, and no broker leads.
			if err := e.endSession(ctx, stale); err != nil {
				e.Log.Debug("ending an old leader session", "session", stale, "error", err)
				sleep(ctx, time.Second)
				continue
			}
			stale = ""
		}
		t, err := e.take(ctx)
		if err != nil {
			if t.session != "" {
				close(t.renew)
				stale = t.session
			}
			if ctx.Err() == nil {
				e.Log.Warn("cannot take the leader lock, retrying", "error", err)
				sleep(ctx, 5*time.Second)
			}
			continue
		}
		e.Log.Info("leader: running the queue and taking GPU admissions", "address", e.Address)
		leaderCtx, cancel := context.WithCancel(ctx)
		e.leading.Store(true)
		go func() {
			select {
			case <-t.lost:
				e.leading.Store(false)
				e.Log.Warn("leader lock lost")
			case <-leaderCtx.Done():
			}
			cancel()
		}()
		work(leaderCtx)
		e.leading.Store(false)
		cancel()
		if !e.stepDown(ctx, t) {
			stale = t.session
		}
	}
}

// A term is one session's hold of the lock.
type term struct {
	session string
	renew   chan struct{} // closed: the session is no longer renewed
	lost    <-chan struct{}
}

// Session options: a crashed leader's session expires within two TTLs, and
// the short lock delay lets the next broker take over right after.
const (
	sessionTTL = "10s"
	lockDelay  = time.Second
)

// monitorRetries is how many times, a second apart, the lock is checked
// again after a Consul error before it counts as lost.
const monitorRetries = 5

// take makes a session and takes the lock with it, waiting while another
// broker holds it. The broker makes and renews the session itself, so that
// it knows which one to end (the Consul client's Lock does not tell). It
// takes the key itself too: Lock, finding a lock delay in force, waits 5 s
// before it tries again. The session comes back with an error too, to be
// ended.
func (e *Elector) take(ctx context.Context) (t term, err error) {
	t.session, _, err = e.Client.Session().Create(&consul.SessionEntry{Name: "gpu-broker leader", TTL: sessionTTL,
		LockDelay: lockDelay, Behavior: consul.SessionBehaviorRelease}, (&consul.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return t, fmt.Errorf("create a session: %w", err)
	}
	t.renew = make(chan struct{})
	go func() { _ = e.Client.Session().RenewPeriodic(sessionTTL, t.session, nil, t.renew) }()
	if err := e.acquire(ctx, t.session); err != nil {
		return t, err
	}
	// The key is the session's: Lock only watches it. It rides out Consul
	// blips (an election takes about 2 s) for up to monitorRetries seconds
	// before the leader steps down: stepping down on the first error left
	// GPU registrations refused until the TTL ran out.
	lock, err := e.Client.LockOpts(&consul.LockOptions{Key: e.Key, Value: []byte(e.Address), Session: t.session,
		MonitorRetries: monitorRetries, MonitorRetryTime: time.Second})
	if err != nil {
		return t, err
	}
	if t.lost, err = lock.Lock(ctx.Done()); err == nil && t.lost == nil {
		err = ctx.Err()
	}
	return t, err
}

// acquire takes the key for session, waiting while another session holds
// it, and trying again four times a lock delay while the delay of a session
// that ended is in force.
//
// A leader SIGKILLed leaves its session to expire, two TTLs (about 20 s)
// during which no broker leads. So while it waits, a broker checks the
// leader's address. When connections to it are refused deadRefusals times
// in a row, nothing listens there any more, and it ends the leader's
// session: a live broker always serves its address, and a network cut
// times out rather than refuses. A leader that is alive after all and
// reaches Consul sees that at once and steps down.
func (e *Elector) acquire(ctx context.Context, session string) error {
	kv := e.Client.KV()
	mine := e.lockPair(session)
	var index uint64
	refused, holder, warned := 0, "", false
	for {
		// Reads only while another holds the key: a try to take it is a
		// write through Consul's log.
		pair, meta, err := kv.Get(e.Key, (&consul.QueryOptions{WaitIndex: index, WaitTime: probeEvery}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("read the leader key: %w", err)
		}
		index = meta.LastIndex
		if pair == nil || pair.Session == "" {
			ok, _, err := kv.Acquire(mine, (&consul.WriteOptions{}).WithContext(ctx))
			if err != nil {
				return fmt.Errorf("take the leader key: %w", err)
			}
			if ok {
				return nil
			}
			sleep(ctx, lockDelay/4) // the lock delay of a session that ended
			index = 0
		} else {
			if pair.Session != holder {
				refused, holder = 0, pair.Session
			}
			var dead bool
			if refused, dead = e.leaderDead(ctx, string(pair.Value), refused, &warned); dead {
				e.Log.Warn("the leader's address refuses connections: ending its session", "leader", string(pair.Value), "session", pair.Session)
				if _, err := e.Client.Session().Destroy(pair.Session, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
					return fmt.Errorf("end the session of the leader that refuses connections: %w", err)
				}
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// lockPair is the key as session holds it: the Consul client's Lock reads
// the flag, and followers read the address.
func (e *Elector) lockPair(session string) *consul.KVPair {
	return &consul.KVPair{Key: e.Key, Value: []byte(e.Address), Flags: consul.LockFlagValue, Session: session}
}

// The leader's address is checked every probeEvery; deadRefusals refused
// connections in a row end its session.
const (
	probeEvery   = 500 * time.Millisecond
	deadRefusals = 3
)

// leaderDead counts a refused connection to the leader's address after n
// (see refusals) and says whether the leader is dead: deadRefusals refusals
// in a row, while this broker's own address takes connections. When it
// refuses too, the advertised addresses are wrong rather than the leader
// dead (brokers sharing one mistaken template), and ending sessions on that
// would pass the lock from broker to broker every few seconds; it says so
// once (warned).
func (e *Elector) leaderDead(ctx context.Context, leader string, n int, warned *bool) (int, bool) {
	if n = refusals(ctx, leader, n); n < deadRefusals {
		return n, false
	}
	if refusals(ctx, e.Address, 0) > 0 {
		if !*warned {
			e.Log.Error("this broker's advertise address refuses connections, so it does not end the leader's session when the leader's refuses too: check advertise",
				"advertise", e.Address, "leader", leader)
			*warned = true
		}
		return 0, false
	}
	return 0, true
}

// refusals is n+1 if a connection to address (a URL) is refused, 0 if
// anything else happens: only a refusal says nothing listens there.
func refusals(ctx context.Context, address string, n int) int {
	u, err := url.Parse(address)
	if err != nil || u.Host == "" {
		return 0
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	ctx, cancel := context.WithTimeout(ctx, probeEvery)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", host)
	if err == nil {
		conn.Close()
		return 0
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return n + 1
	}
	return 0
}

// endSession releases the key if the session still holds it (a release
// sets no lock delay; the session's end would) and destroys the session,
// then reads the key back. Only the destroy must succeed: a session gone
// already is no error, and a key it still held is freed by its end, a lock
// delay later. The read back is what says it ended. A Consul server just
// elected answers a destroy before it has replayed its log: it finds no
// such session and does nothing, and the key stayed held until the
// session's TTL ran out, two TTLs after the election. The read is
// consistent, which Consul refuses until it has caught up.
func (e *Elector) endSession(ctx context.Context, id string) error {
	wo := (&consul.WriteOptions{}).WithContext(ctx)
	_, _, _ = e.Client.KV().Release(e.lockPair(id), wo)
	if _, err := e.Client.Session().Destroy(id, wo); err != nil {
		return err
	}
	pair, _, err := e.Client.KV().Get(e.Key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("read the leader key back: %w", err)
	}
	if pair != nil && pair.Session == id {
		return fmt.Errorf("session %s still holds the leader key after its destroy", id)
	}
	return nil
}

// stepDown releases the lock and ends the term's session, trying again for
// a few seconds through a Consul blip; false if the session could not be
// ended. Its renewal stops after the release: a session that ends first
// leaves a lock delay behind.
func (e *Elector) stepDown(ctx context.Context, t term) bool {
	defer close(t.renew)
	ctx = context.WithoutCancel(ctx) // a broker shutting down hands over too
	for try := 0; ; try++ {
		err := e.endSession(ctx, t.session)
		if err == nil {
			return true
		}
		if try == 4 {
			e.Log.Warn("leader session not ended; ending it once Consul answers", "session", t.session, "error", err)
			return false
		}
		sleep(ctx, time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
