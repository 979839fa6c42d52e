// Package policystore keeps the policy in force: loaded from a directory of
// HCL files, reloaded when they change (polled) or on SIGHUP, and an invalid
// set refused with its diagnostics while the last good one stays.
package policystore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/nomad-gpu/nomad-gpu/broker/policy"
	"github.com/nomad-gpu/nomad-gpu/broker/policyhcl"
	"github.com/nomad-gpu/nomad-gpu/internal/clock"
)

// Store holds the policy in force and reloads it; an invalid set is refused and
// the last good one kept.
type Store struct {
	dir      string
	log      hclog.Logger
	capacity func() int
	current  atomic.Pointer[policy.Policy]
	stamp    string
	reloaded chan struct{}
	// Reloads, when set (before Watch), is told of every reload: whether
	// it took effect, and what it loaded or why it was refused.
	Reloads func(took bool, detail string)
	// AllowNoTenants takes a reload with no tenants while the policy in
	// force has some (else refused: it is what an empty file reads as).
	AllowNoTenants bool
	// Clock times the reloads in Status (New: the real one).
	Clock clock.Clock

	mu     sync.Mutex
	status Status
}

// Status is the policy in force and how its last reload went.
type Status struct {
	Dir      string    `json:"dir"`
	LoadedAt time.Time `json:"loaded_at"` // when the policy in force was read
	Queues   int       `json:"queues"`
	Tenants  int       `json:"tenants"`
	// Stale: the files changed since, and the last reload was refused
	// (LastError says why): the policy in force is older than the files.
	Stale        bool      `json:"stale"`
	LastReloadAt time.Time `json:"last_reload_at,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
}

// Status is the policy in force and how its last reload went.
// Loaded is when the policy in force was read, and whether the files have
// changed since in a way that was refused (the metrics' view of Status).
func (s *Store) Loaded() (at time.Time, stale bool) {
	st := s.Status()
	return st.LoadedAt, st.Stale
}

func (s *Store) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// took records a policy now in force.
func (s *Store) took(p *policy.Policy) {
	s.current.Store(p)
	now := s.Clock.Now().UTC()
	s.mu.Lock()
	s.status = Status{Dir: s.dir, LoadedAt: now, Queues: len(p.Queues), Tenants: len(p.Tenants), LastReloadAt: now}
	s.mu.Unlock()
}

// refused records a reload that was refused, and why.
func (s *Store) refused(why string) {
	s.mu.Lock()
	s.status.Stale, s.status.LastReloadAt, s.status.LastError = true, s.Clock.Now().UTC(), why
	s.mu.Unlock()
	s.log.Error("policy reload refused, the last good policy stays in force", "dir", s.dir, "reason", why)
	s.tell(false, "refused, the last good policy stays in force: "+why)
}

// New loads dir; it fails when the first load is invalid.
func New(dir string, capacity func() int, log hclog.Logger) (*Store, hcl.Diagnostics) {
	s := &Store{dir: dir, log: log, capacity: capacity, reloaded: make(chan struct{}, 1), Clock: clock.Real}
	p, diags := policyhcl.LoadDir(dir, capacity())
	if p == nil {
		return nil, diags
	}
	s.took(p)
	s.stamp = dirStamp(dir)
	return s, diags
}

// Current is the policy in force.
func (s *Store) Current() *policy.Policy { return s.current.Load() }

// Preemption is Nomad's scheduler preemption the policy in force asks for.
func (s *Store) Preemption() (batch, service bool) {
	p := s.Current()
	return p.Preemption.Batch, p.Preemption.Service
}

// Reload reads the files again; it reports whether the new set took effect.
func (s *Store) Reload() bool {
	p, diags := policyhcl.LoadDir(s.dir, s.capacity())
	s.stamp = dirStamp(s.dir)
	if p == nil {
		s.refused(policyhcl.FormatDiagnostics(diags))
		return false
	}
	if len(p.Tenants) == 0 && len(s.Current().Tenants) > 0 && !s.AllowNoTenants {
		s.refused(fmt.Sprintf("the files in %s define no tenant, while the policy in force has %d (an empty or truncated file, or a template rendered empty?); "+
			"to take such a policy, set allow_policy_without_tenants = true in the broker's configuration", s.dir, len(s.Current().Tenants)))
		return false
	}
	if len(diags) > 0 {
		s.log.Warn("policy warnings", "diagnostics", policyhcl.FormatDiagnostics(diags))
	}
	s.took(p)
	s.log.Info("policy loaded", "dir", s.dir, "queues", len(p.Queues), "tenants", len(p.Tenants))
	s.tell(true, fmt.Sprintf("loaded %s: %d queues, %d tenants, %d reclaim rules", s.dir, len(p.Queues), len(p.Tenants), len(p.Reclaim)))
	select {
	case s.reloaded <- struct{}{}:
	default:
	}
	return true
}

func (s *Store) tell(took bool, detail string) {
	if s.Reloads != nil {
		s.Reloads(took, detail)
	}
}

// Reloaded is signalled (at most one pending signal) when a new policy takes effect.
func (s *Store) Reloaded() <-chan struct{} { return s.reloaded }

// Watch reloads on a signal from hup and whenever a file of the directory
// changes (checked every interval), until ctx ends.
func (s *Store) Watch(ctx context.Context, hup <-chan os.Signal, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			s.Reload()
		case <-t.C:
			if dirStamp(s.dir) != s.stamp {
				s.Reload()
			}
		}
	}
}

// dirStamp changes whenever a policy file is added, removed or modified.
func dirStamp(dir string) string {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.hcl"))
	stamp := ""
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			stamp += fmt.Sprintf("%s %d %d\n", p, fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return stamp
}
