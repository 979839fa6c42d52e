package cluster

import "sync"

// jobLocks serialise the decisions on one job, whoever makes them (a call
// through the gate, the queue admitting an entry): each reads the job,
// decides and has Nomad's answer before the next one reads it. Reservations
// are kept per job, so two decisions on one job made at once would each
// count the job as it was, and never each other.
type jobLocks struct {
	mu    sync.Mutex
	locks map[[2]string]*jobLock
}

type jobLock struct {
	sync.Mutex
	users int // calls holding or waiting for it; the last one removes it
}

// lock waits for job namespace/id and returns its unlock.
func (l *jobLocks) lock(namespace, id string) (unlock func()) {
	key := [2]string{namespace, id}
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[[2]string]*jobLock{}
	}
	jl := l.locks[key]
	if jl == nil {
		jl = &jobLock{}
		l.locks[key] = jl
	}
	jl.users++
	l.mu.Unlock()
	jl.Lock()
	return func() {
		jl.Unlock()
		l.mu.Lock()
		if jl.users--; jl.users == 0 {
			delete(l.locks, key)
		}
		l.mu.Unlock()
	}
}

// LockJob waits until no other decision on job namespace/id is in flight
// and returns the unlock: hold it from reading the job to Nomad's answer.
func (v *View) LockJob(namespace, id string) (unlock func()) { return v.decisions.lock(namespace, id) }
