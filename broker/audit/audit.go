// Package audit is the broker's audit trail: one JSON line per decision or
// act, appended to a file that rotates by size (the shape of Nomad
// Enterprise's and Vault's file audit devices, so log shippers pick it up),
// and read back, rotated files included.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Event is one line of the trail.
type Event struct {
	Time time.Time `json:"time"`
	// Broker is the instance that wrote it (its advertise address).
	Broker string `json:"broker"`
	// Who acted: the caller's ACL token name and accessor (never its
	// secret), "anonymous" without ACLs, or "broker" for the broker's own acts.
	Who       string `json:"who"`
	What      string `json:"what"`
	ID        string `json:"id,omitempty"` // queue entry or reclaim decision
	Namespace string `json:"namespace,omitempty"`
	Job       string `json:"job,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	Queue     string `json:"queue,omitempty"`
	Rule      string `json:"rule,omitempty"`
	Result    string `json:"result,omitempty"`
}

// What the broker audits.
const (
	Admission      = "admission"       // a GPU job decided on submission: result admit, admit-borrowed, queue, reject
	AdmissionError = "admission-error" // an admitted job Nomad did not take
	QueueAdmission = "queue-admission" // a queued job registered with Nomad
	QueuePark      = "queue-park"      // a queued job the policy now rejects: parked, never deleted
	QueueUnpark    = "queue-unpark"    // a job so parked that the policy takes again: it waits again
	QueueCancel    = "queue-cancel"
	Preemption     = "preemption"  // Nomad preempted a borrowed job's allocation (observed)
	AutoRevert     = "auto-revert" // Nomad reverted a job whose deployment failed (observed): result admit or over-limit
	ReclaimDecided = "reclaim-decision"
	ReclaimActed   = "reclaim-action"
	ReclaimCancel  = "reclaim-cancel"
	PolicyReload   = "policy-reload"
	ApprovalAsk    = "approval-request"
	ApprovalGrant  = "approval-grant"
	ApprovalDeny   = "approval-deny"
	ApprovalExpire = "approval-expire"
	BrokerAct      = "broker" // Who of the broker's own acts
)

// Log appends events to path, rotating it to path.1 … path.<maxFiles> when
// it would grow past maxBytes. A nil *Log writes nothing.
type Log struct {
	path     string
	maxBytes int64
	maxFiles int
	broker   string
	// Failed is told of every write that failed (logs and metrics).
	Failed func(error)

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (creating) the file at path for appending.
func Open(path string, maxBytes int64, maxFiles int, broker string) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	l := &Log{path: path, maxBytes: maxBytes, maxFiles: maxFiles, broker: broker}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends e (its time and broker set here) as one line, written to
// the file before it returns.
func (l *Log) Write(e Event) error {
	if l == nil {
		return nil
	}
	e.Time, e.Broker = time.Now().UTC(), l.broker
	line, err := json.Marshal(e)
	if err != nil {
		return l.failed(fmt.Errorf("audit: encode %s: %w", e.What, err))
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(line)) > l.maxBytes {
		if err := l.rotate(); err != nil {
			return l.failed(err)
		}
	}
	if l.f == nil {
		if err := l.open(); err != nil {
			return l.failed(err)
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		return l.failed(fmt.Errorf("audit: write %s: %w", l.path, err))
	}
	return nil
}

func (l *Log) failed(err error) error {
	if l.Failed != nil {
		l.Failed(err)
	}
	return err
}

// rotate shifts path.i to path.i+1 (dropping the oldest) and path to path.1.
func (l *Log) rotate() error {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	os.Remove(fmt.Sprintf("%s.%d", l.path, l.maxFiles))
	for i := l.maxFiles - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("audit: rotate %s: %w", l.path, err)
		}
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("audit: rotate %s: %w", l.path, err)
	}
	return l.open()
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Read returns the events at or after since that keep accepts, oldest
// first, from the rotated files and the current one.
func (l *Log) Read(since time.Time, keep func(Event) bool) ([]Event, error) {
	if l == nil {
		return nil, errors.New("no audit log is configured (broker.hcl: audit { path = \"…\" })")
	}
	files := []string{}
	for i := l.maxFiles; i >= 1; i-- {
		files = append(files, l.path+"."+strconv.Itoa(i))
	}
	files = append(files, l.path)
	var out []Event
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit: read %s: %w", name, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue // a line cut by a crash: the rest still reads
			}
			if !e.Time.Before(since) && (keep == nil || keep(e)) {
				out = append(out, e)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("audit: read %s: %w", name, err)
		}
	}
	return out, nil
}
