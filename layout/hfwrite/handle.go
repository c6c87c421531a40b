package hfwrite

import (
	"fmt"
	"syscall"
	"time"
)

// releaseWait bounds how long an open for writing waits for the release of
// a writer that was closed without writing: the kernel sends the release of
// a closed descriptor after close(2) returns, so `touch f; echo x > f` can
// find the first open still there.
const releaseWait = time.Second

// errNotWriter is returned for changing a file through a handle opened only
// to read it.
var errNotWriter = fmt.Errorf("hfwrite: handle not open for writing: %w", syscall.EBADF)

// Handle is one open of a file being written: what close(2) and the last
// close of a file do to it (see the package doc) is decided here. A file
// has one handle open for writing at a time (File.Open), so that what a
// close commits is that writer's.
type Handle struct {
	f     *File
	write bool // opened for writing

	wrote    bool // GUARDED_BY(f.mu): data was written through this handle
	flushed  bool // GUARDED_BY(f.mu): a descriptor of it was closed
	released bool // GUARDED_BY(f.mu)
}

// Open opens another handle to the file being written: for writing (write;
// trunc: truncated to 0), or to read it back. It fails with ErrStale once
// the file was committed or dropped (its name shows what was committed
// then), and an open for writing fails with ErrBusy while another handle is
// open for writing: two writers of one file would commit a mixture at the
// first one's close.
func (f *File) Open(write, trunc bool) (*Handle, error) {
	h := &Handle{f: f, write: write}
	if err := f.attach(h); err != nil {
		return nil, err
	}
	return h.opened(trunc)
}

// attach counts h among the handles of f, and makes it the writer if it
// opens for writing. A writer that was closed without writing may only be
// waiting for its release: that is waited for, up to releaseWait.
func (f *File) attach(h *Handle) error {
	deadline := time.Now().Add(releaseWait)
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		switch {
		case f.done:
			return ErrStale
		case !h.write || f.writer == nil:
			f.handles++
			if h.write {
				f.writer = h
			}
			return nil
		case !f.writer.closed() || !time.Now().Before(deadline):
			return fmt.Errorf("%w: %s is open for writing", ErrBusy, f.name)
		}
		if f.released == nil {
			f.released = make(chan struct{})
		}
		released := f.released
		f.mu.Unlock()
		select {
		case <-released:
		case <-time.After(time.Until(deadline)):
		}
		f.mu.Lock()
	}
}

// letGo wakes the opens waiting for the writer of f to let go of it (its
// release, or the file done). Holding f.mu.
func (f *File) letGo() {
	if f.released != nil {
		close(f.released)
		f.released = nil
	}
}

// opened finishes an open: trunc truncates the file to 0.
func (h *Handle) opened(trunc bool) (*Handle, error) {
	if trunc {
		if err := h.Truncate(0); err != nil {
			h.Release()
			return nil, err
		}
	}
	return h, nil
}

// closed reports whether every descriptor of the writer h may be closed: it
// was flushed and never wrote (one that wrote commits at its flush).
// Holding h.f.mu.
func (h *Handle) closed() bool { return h.flushed && !h.wrote }

// File is the file the handle writes.
func (h *Handle) File() *File { return h.f }

// WriteAt writes to the file.
func (h *Handle) WriteAt(p []byte, off int64) (int, error) {
	if !h.write {
		return 0, errNotWriter
	}
	n, err := h.f.WriteAt(p, off)
	if n > 0 || err == nil {
		h.f.mu.Lock()
		h.wrote = true
		h.f.mu.Unlock()
	}
	return n, err
}

// ReadAt reads the file back.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) { return h.f.ReadAt(p, off) }

// Written waits until every write of the file is in its spool and
// returns the error of a write that failed after it returned (fsync's
// report; nothing is durable before the commit).
func (h *Handle) Written() error { return h.f.stream.drain() }

// Truncate changes the size of the file.
func (h *Handle) Truncate(size int64) error {
	if !h.write {
		return errNotWriter
	}
	return h.f.Truncate(size)
}

// Flush is close(2) of a descriptor of the handle (dups included): a
// handle that wrote commits the file and returns the result. A flush
// before any write (a shell's `>` redirection opens, dups and closes)
// does not commit.
func (h *Handle) Flush() error {
	h.f.mu.Lock()
	h.flushed = true
	wrote := h.wrote
	h.f.mu.Unlock()
	if !wrote {
		return nil
	}
	return h.f.Commit()
}

// Release drops the handle. The last one commits a file that was changed
// but whose writing handle was never flushed (the outcome goes to
// Options.OnCommit only), and drops a file that was not changed.
func (h *Handle) Release() {
	f := h.f
	f.mu.Lock()
	if h.released {
		f.mu.Unlock()
		return
	}
	h.released = true
	f.handles--
	last := f.handles == 0 && !f.done
	changed := f.changed
	// The last release commits or drops the file: the writer stays until
	// it is done, so that no open for writing joins that.
	if f.writer == h && !last {
		f.writer = nil
		f.letGo()
	}
	f.mu.Unlock()
	switch {
	case !last:
	case changed:
		f.Commit()
	default:
		f.Abort()
	}
}
