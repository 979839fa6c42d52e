// Package leader elects one broker through a Consul lock. The leader runs the
// queue and takes every GPU admission: the other brokers send their callers'
// GPU requests to it, so that all decisions about quota happen in one place,
// one after the other, and two brokers can never each admit the last GPUs of
// a tenant.
package leader

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
)

// Elector holds or follows the leader lock at Key. The lock's value is the
// leader's address, where the others send GPU admissions.
type Elector struct {
	Client  *consul.Client
	Key     string
	Address string // this broker's address for the others, e.g. http://127.0.0.1:4649
	Log     hclog.Logger

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
	if e.cached != "" && time.Since(e.cachedAt) < addressTTL {
		return e.cached, nil
	}
	pair, _, err := e.Client.KV().Get(e.Key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("read the leader from Consul: %w", err)
	}
	if pair == nil || pair.Session == "" || len(pair.Value) == 0 {
		return "", fmt.Errorf("no broker is leader right now")
	}
	e.cached, e.cachedAt = string(pair.Value), time.Now()
	return e.cached, nil
}

// Run runs work while this broker holds the lock, taking it again whenever it
// is lost, until ctx ends.
func (e *Elector) Run(ctx context.Context, work func(context.Context)) {
	stale := "" // the session of a lock lost while Consul was away, not ended yet
	for ctx.Err() == nil {
		if stale != "" {
			// Until it ends, it holds the key for up to two TTLs after
			// Consul is back, and no broker leads.
			if err := e.endSession(ctx, stale); err != nil {
				e.Log.Debug("ending the lost leader session", "session", stale, "error", err)
				sleep(ctx, time.Second)
				continue
			}
			stale = ""
		}
		// A crashed leader's session expires within two TTLs; the short lock
		// delay lets the next broker take over right after. The lock rides
		// out Consul blips (an election takes about 2 s) for up to
		// monitorRetries seconds before the leader steps down: stepping down
		// on the first error left GPU registrations refused until the TTL ran
		// out.
		lock, err := e.Client.LockOpts(&consul.LockOptions{Key: e.Key, Value: []byte(e.Address),
			MonitorRetries: monitorRetries, MonitorRetryTime: time.Second,
			SessionOpts: &consul.SessionEntry{Name: "gpu-broker leader", TTL: "10s", LockDelay: lockDelay,
				Behavior: consul.SessionBehaviorRelease}})
		if err != nil {
			e.Log.Error("leader lock", "error", err)
			sleep(ctx, 5*time.Second)
			continue
		}
		e.awaitFree(ctx)
		lost, err := lock.Lock(ctx.Done())
		if err != nil || lost == nil {
			if ctx.Err() == nil {
				e.Log.Warn("cannot take the leader lock, retrying", "error", err)
				sleep(ctx, 5*time.Second)
			}
			continue
		}
		e.Log.Info("leader: running the queue and taking GPU admissions", "address", e.Address)
		session := e.sessionOf(ctx)
		leaderCtx, cancel := context.WithCancel(ctx)
		e.leading.Store(true)
		go func() {
			select {
			case <-lost:
				e.leading.Store(false)
				e.Log.Warn("leader lock lost")
			case <-leaderCtx.Done():
			}
			cancel()
		}()
		work(leaderCtx)
		e.leading.Store(false)
		cancel()
		if !e.stepDown(ctx, lock, session) {
			stale = session
		}
	}
}

// sessionOf is the session that holds the lock key now ("" if it cannot be
// read): the lock does not tell its own.
func (e *Elector) sessionOf(ctx context.Context) string {
	pair, _, err := e.Client.KV().Get(e.Key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil || pair == nil {
		return ""
	}
	return pair.Session
}

// endSession releases the key if the session still holds it (a release
// sets no lock delay; the session's end would) and destroys the session.
// Only the destroy must succeed: a session gone already is no error, and a
// key it still held is freed by its end, a lock delay later.
func (e *Elector) endSession(ctx context.Context, id string) error {
	wo := (&consul.WriteOptions{}).WithContext(ctx)
	_, _, _ = e.Client.KV().Release(&consul.KVPair{Key: e.Key, Value: []byte(e.Address), Flags: consul.LockFlagValue, Session: id}, wo)
	_, err := e.Client.Session().Destroy(id, wo)
	return err
}

// awaitFree waits until no session holds the lock key, then lets a lock
// delay pass if a session had held it: the Consul client's Lock, finding the
// delay in force, would wait 5 s before it tried again. An error is left
// to Lock to report.
func (e *Elector) awaitFree(ctx context.Context) {
	var index uint64
	for ctx.Err() == nil {
		pair, meta, err := e.Client.KV().Get(e.Key, (&consul.QueryOptions{WaitIndex: index}).WithContext(ctx))
		switch {
		case err != nil || pair == nil:
			return
		case pair.Session == "":
			sleep(ctx, lockDelay)
			return
		}
		index = meta.LastIndex
	}
}

// lockDelay is how long Consul keeps the lock from being taken after the
// session that held it ended.
const lockDelay = time.Second

// monitorRetries is how many times, a second apart, the lock is checked
// again after a Consul error before it counts as lost.
const monitorRetries = 5

// stepDown releases the lock and ends its session, trying again for a few
// seconds through a Consul blip; false if the session could not be ended.
// Unlock tries only once (called again, it says the lock is not held), so
// the retries end the session itself.
func (e *Elector) stepDown(ctx context.Context, lock *consul.Lock, session string) bool {
	err := lock.Unlock()
	if err == nil {
		return true // its renewal, stopped, ends the session
	}
	if session == "" {
		e.Log.Warn("leader lock not released; it expires with its session", "error", err)
		return true
	}
	ctx = context.WithoutCancel(ctx) // a broker shutting down hands over too
	for try := 0; ; try++ {
		if err = e.endSession(ctx, session); err == nil {
			return true
		}
		if try == 4 {
			e.Log.Warn("leader session not ended; ending it once Consul answers", "session", session, "error", err)
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
