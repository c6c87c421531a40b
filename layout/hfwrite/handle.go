package hfwrite

import (
	"sync"
)

// Handle is one open of a file being written: what close(2) and the last
// close of a file do to it (see the package doc) is decided here.
type Handle struct {
	f *File

	mu       sync.Mutex
	wrote    bool // GUARDED_BY(mu): data was written through this handle
	released bool // GUARDED_BY(mu)
}

// Open opens another handle to the file being written (trunc: truncated
// to 0), or fails with ErrStale once it was committed or dropped: its name
// shows what was committed then.
func (f *File) Open(trunc bool) (*Handle, error) { return f.open(trunc) }

func (f *File) open(trunc bool) (*Handle, error) {
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		return nil, ErrStale
	}
	f.handles++
	f.mu.Unlock()
	h := &Handle{f: f}
	if trunc {
		if err := h.Truncate(0); err != nil {
			h.Release()
			return nil, err
		}
	}
	return h, nil
}

// File is the file the handle writes.
func (h *Handle) File() *File { return h.f }

// WriteAt writes to the file.
func (h *Handle) WriteAt(p []byte, off int64) (int, error) {
	n, err := h.f.WriteAt(p, off)
	if n > 0 || err == nil {
		h.mu.Lock()
		h.wrote = true
		h.mu.Unlock()
	}
	return n, err
}

// ReadAt reads the file back.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) { return h.f.ReadAt(p, off) }

// Written waits until every write of the file is in its spool and
// returns the error of a write that failed after it returned (fsync's
// report; nothing is durable before the commit).
func (h *Handle) Written() error { return h.f.behind.drain() }

// Truncate changes the size of the file.
func (h *Handle) Truncate(size int64) error { return h.f.Truncate(size) }

// Flush is close(2) of a descriptor of the handle (dups included): a
// handle that wrote commits the file and returns the result. A flush
// before any write (a shell's `>` redirection opens, dups and closes)
// does not commit.
func (h *Handle) Flush() error {
	h.mu.Lock()
	wrote := h.wrote
	h.mu.Unlock()
	if !wrote {
		return nil
	}
	return h.f.Commit()
}

// Release drops the handle. The last one commits a file that was changed
// but whose writing handle was never flushed (the outcome goes to
// Options.OnCommit only), and drops a file that was not changed.
func (h *Handle) Release() {
	h.mu.Lock()
	again := h.released
	h.released = true
	h.mu.Unlock()
	if again {
		return
	}
	f := h.f
	f.mu.Lock()
	f.handles--
	last := f.handles == 0 && !f.done
	changed := f.changed
	f.mu.Unlock()
	switch {
	case !last:
	case changed:
		f.Commit()
	default:
		f.Abort()
	}
}
