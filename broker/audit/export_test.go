package audit

import (
	"io"
	"syscall"
)

// FillDiskAfter makes the log's disk hold only n more bytes: a write past
// them is cut short with ENOSPC, as a full disk does; Free gives room again.
func FillDiskAfter(l *Log, n int) (free func()) {
	d := &disk{room: n}
	l.mu.Lock()
	l.wrap = func(f file) file { return &fullFile{file: f, d: d} }
	if l.f != nil {
		l.f = l.wrap(l.f)
	}
	l.mu.Unlock()
	return func() { d.room = 1 << 30 }
}

type disk struct{ room int }

type fullFile struct {
	file
	d *disk
}

func (f *fullFile) Write(p []byte) (int, error) {
	if len(p) <= f.d.room {
		f.d.room -= len(p)
		return f.file.Write(p)
	}
	n, err := f.file.Write(p[:f.d.room])
	f.d.room = 0
	if err == nil {
		err = syscall.ENOSPC
	}
	return n, err
}

var _ io.Writer = (*fullFile)(nil)
