// Package audit is the broker's audit trail: one JSON line per decision or
// act, appended to a file that rotates by size, and read back, rotated
// files included. The lines have the shape of Nomad Enterprise's and
// Vault's file audit devices, so log shippers pick them up.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-gpu/nomad-gpu/internal/clock"
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
	Promotion      = "promotion"   // a running borrowed job promoted in place to its queue's band (borrowing.promote_below)
	Repin          = "repin"       // a job the broker placed pinned again before it runs (placement mode broker)
	AutoRevert     = "auto-revert" // Nomad reverted a job whose deployment failed (observed): result admit or over-limit
	ReclaimDecided = "reclaim-decision"
	ReclaimActed   = "reclaim-action"
	ReclaimCancel  = "reclaim-cancel"
	PolicyReload   = "policy-reload"
	ApprovalAsk    = "approval-request"
	ApprovalGrant  = "approval-grant"
	ApprovalDeny   = "approval-deny"
	ApprovalExpire = "approval-expire"
	RegionDrain    = "region-drain"  // no new work goes to a region (gpu-broker region drain)
	RegionResume   = "region-resume" // a drained region takes work again
	RegionLost     = "region-lost"   // a job of a region lost past region_lost_timeout requeued (on_region_loss)
	RegionStale    = "region-stale"  // a region back: a stale copy of a job stopped, or its requeued copy withdrawn
	BrokerAct      = "broker"        // Who of the broker's own acts
)

// Log appends events to path, rotating it to path.1 … path.<maxFiles> when
// it would grow past maxBytes. A nil *Log writes nothing.
type Log struct {
	path     string
	maxBytes int64
	maxFiles int
	broker   string
	clock    clock.Clock // the records' time (Open: the real one)
	// Failed is told of every write that failed (logs and metrics).
	Failed func(error)

	mu sync.Mutex
	f  file
	// opened identifies the open file (os.SameFile): a write then stats
	// only the path.
	opened os.FileInfo
	size   int64
	// torn: a failed write left part of a line that could not be cut off;
	// the next record starts on a line of its own.
	torn bool
	wrap func(file) file // tests: a disk that fills up
}

// file is what the log writes to: an *os.File.
type file interface {
	io.Writer
	Truncate(size int64) error
	Close() error
}

// Open opens (creating) the file at path for appending.
func Open(path string, maxBytes int64, maxFiles int, broker string) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	l := &Log{path: path, maxBytes: maxBytes, maxFiles: maxFiles, broker: broker, clock: clock.Real}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	l.f, l.size, l.opened = f, st.Size(), st
	if l.size > 0 {
		// A crash may have cut the last line: the next record starts on a
		// line of its own, or it would be read as part of the fragment.
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, l.size-1); err != nil || last[0] != '\n' {
			l.torn = true
		}
	}
	if l.wrap != nil {
		l.f = l.wrap(l.f)
	}
	return nil
}

// moved reports whether the open file is no longer the one at path
// (removed or renamed away, as by logrotate without copytruncate).
func (l *Log) moved() bool {
	at, err := os.Stat(l.path)
	return err != nil || !os.SameFile(at, l.opened)
}

// Write appends e (its time and broker set here) as one line, written to
// the file before it returns: whole, or not at all (a write the disk cut
// short is cut back off the file).
func (l *Log) Write(e Event) error {
	if l == nil {
		return nil
	}
	e.Time, e.Broker = l.clock.Now().UTC(), l.broker
	line, err := json.Marshal(e)
	if err == nil && len(line) >= MaxLine {
		// Reads skip a longer line: the record is kept, its result cut.
		e.Result = e.Result[:max(0, len(e.Result)-(len(line)-MaxLine)-100)] + " … (cut: the record was over 1 MiB)"
		line, err = json.Marshal(e)
	}
	if err != nil {
		return l.failed(fmt.Errorf("audit: encode %s: %w", e.What, err))
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil && l.moved() {
		l.f.Close()
		l.f, l.torn = nil, false
	}
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
	if l.torn {
		line = append([]byte{'\n'}, line...)
	}
	n, err := l.f.Write(line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if n > 0 {
			if terr := l.f.Truncate(l.size); terr != nil {
				l.size, l.torn = l.size+int64(n), true
			}
		}
		return l.failed(fmt.Errorf("audit: write %s: %w", l.path, err))
	}
	l.size += int64(n)
	l.torn = false
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
	l.torn = false
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

// Cursor is where a page of the trail starts: the events at or after
// Since, less the first Skip of those a page accepted at exactly Since.
type Cursor struct {
	Since time.Time
	Skip  int
}

// String is the cursor as the API and the CLI pass it: <RFC 3339 time>~<skip>.
func (c Cursor) String() string {
	return c.Since.UTC().Format(time.RFC3339Nano) + "~" + strconv.Itoa(c.Skip)
}

// ParseCursor reads a Cursor's String.
func ParseCursor(s string) (Cursor, error) {
	at, skip, ok := strings.Cut(s, "~")
	t, err := time.Parse(time.RFC3339Nano, at)
	n, nerr := strconv.Atoi(skip)
	if !ok || err != nil || nerr != nil || n < 0 {
		return Cursor{}, fmt.Errorf("%q is not a cursor of the audit trail (as a page's next cursor says: <time>~<n>)", s)
	}
	return Cursor{Since: t, Skip: n}, nil
}

// MaxPage is the most events a page holds: what a read keeps in memory,
// whatever the size of the trail.
const MaxPage = 10000

// Page returns, oldest first, at most limit (≤ MaxPage) events from c on
// that keep accepts, and the cursor of the next page (false: there is none).
// It reads the trail a line at a time.
func (l *Log) Page(c Cursor, limit int, keep func(Event) bool) ([]Event, Cursor, bool, error) {
	limit = min(max(limit, 1), MaxPage)
	var out []Event
	skip := c.Skip
	more := false
	err := l.Scan(c.Since, func(e Event) bool {
		if keep != nil && !keep(e) {
			return true
		}
		if skip > 0 && e.Time.Equal(c.Since) {
			skip--
			return true
		}
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, e)
		return true
	})
	if err != nil || !more {
		return out, Cursor{}, false, err
	}
	last := out[len(out)-1].Time
	next := Cursor{Since: last}
	for i := len(out) - 1; i >= 0 && out[i].Time.Equal(last); i-- {
		next.Skip++
	}
	if last.Equal(c.Since) {
		next.Skip += c.Skip
	}
	return out, next, true, nil
}

// Scan calls visit with each event at or after since, oldest first, from
// the rotated files and the current one, until visit returns false. A line
// that cannot be read (cut by a crash or a full disk) is skipped: the rest
// still reads. Files last written before since are not read.
func (l *Log) Scan(since time.Time, visit func(Event) bool) error {
	if l == nil {
		return errors.New("no audit log is configured (broker.hcl: audit { path = \"…\" })")
	}
	files := []string{}
	for i := l.maxFiles; i >= 1; i-- {
		files = append(files, l.path+"."+strconv.Itoa(i))
	}
	files = append(files, l.path)
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("audit: read %s: %w", name, err)
		}
		if st, err := f.Stat(); err == nil && st.ModTime().Before(since) {
			f.Close()
			continue
		}
		done, err := scanFile(f, since, visit)
		f.Close()
		if err != nil {
			return fmt.Errorf("audit: read %s: %w", name, err)
		}
		if done {
			return nil
		}
	}
	return nil
}

// MaxLine is the longest line a read decodes (a longer one, written by
// hand or by another program, is skipped like a torn one): what one read
// holds in memory per line.
const MaxLine = 1 << 20

// scanFile visits the events of one file; true when visit asked to stop.
func scanFile(f *os.File, since time.Time, visit func(Event) bool) (bool, error) {
	r := bufio.NewReaderSize(f, 64<<10)
	var line []byte
	tooLong := false
	for {
		part, more, err := r.ReadLine()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if tooLong = tooLong || len(line)+len(part) > MaxLine; !tooLong {
			line = append(line, part...)
		}
		if more {
			continue
		}
		var e Event
		if !tooLong && json.Unmarshal(line, &e) == nil && !e.Time.Before(since) && !visit(e) {
			return true, nil
		}
		line, tooLong = line[:0], false
	}
}
