package hfwrite

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
)

// Write-behind. A write returns once its bytes are copied into one of a
// few buffers; a goroutine per file then writes them to the spool, in the
// order they came. A writer (cp, save_pretrained) waits for each write
// before it reads the next bytes of its source, and the spool's copy into
// fresh page-cache pages is the costliest step of a write: done in the
// handler, it ran serially with the writer's reads, and a third of the
// two cores' time went idle during a cp. The error of a write that
// already returned fails the next write, fsync (Handle.Written) and the
// commit, as a write-back cache reports it.
//
// A full disk is still reported by the write that does not fit: writes
// are queued only while the spool's filesystem has room for every queued
// byte and a margin (another writer filling the disk meanwhile is caught
// by the next write or the commit).
//
// The progress tracker counts a queued write as under way until it is in
// the spool, so the resharder never reads bytes not yet there, and seal
// waits for them.

// behindBufSize is the largest write that is queued: the mount's largest
// FUSE write. Larger ones are written in the handler, after those queued.
const behindBufSize = 1 << 20

// behindQueued bounds the writes queued over every file of the sessions
// sharing a Limits (8 MiB of buffers).
const behindQueued = 8

// behindMinFree is the free space below which writes are not queued: room
// for every queued byte and a margin for the filesystem's own needs.
const behindMinFree = behindQueued*behindBufSize + 64<<20

// behindRecheck is how many bytes a file queues between two looks at the
// free space: a statfs per 16 MiB rather than per write.
const behindRecheck = 16 << 20

// Limits bounds what the sessions sharing it hold at once: the write-behind
// buffers (behindQueued of behindBufSize) and the reshards of files being
// written (dcpwrite.Limits). A mount makes one for all its write targets,
// so that two mounts in one process do not share a bound; a session
// created without one has its own.
type Limits struct {
	buffers chan []byte // the free write-behind buffers; nil until first used
	reshard *dcpwrite.Limits
}

// NewLimits returns the default Limits.
func NewLimits() *Limits {
	l := &Limits{buffers: make(chan []byte, behindQueued), reshard: dcpwrite.NewLimits()}
	for range behindQueued {
		l.buffers <- nil // allocated on first use
	}
	return l
}

type pendingWrite struct {
	buf []byte
	off int64
}

// writeBehind is the queue of writes of one spool file.
type writeBehind struct {
	fd      *os.File
	buffers chan []byte                 // the session's Limits.buffers
	done    func(off, n, written int64) // told of each write once it is in fd

	mu      sync.Mutex
	idle    sync.Cond
	pending []pendingWrite // GUARDED_BY(mu)
	running bool           // GUARDED_BY(mu): a goroutine is writing pending
	err     error          // GUARDED_BY(mu): of the first write that failed
	room    int64          // GUARDED_BY(mu): bytes that may be queued before the free space is looked at again
}

func newWriteBehind(fd *os.File, limits *Limits, done func(off, n, written int64)) *writeBehind {
	w := &writeBehind{fd: fd, buffers: limits.buffers, done: done}
	w.idle.L = &w.mu
	return w
}

// failed is the error of a queued write that failed, if any.
func (w *writeBehind) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// queue copies p to be written at off. It returns false, queueing
// nothing, when p is larger than a buffer or the spool's filesystem is
// nearly full.
func (w *writeBehind) queue(p []byte, off int64) bool {
	if len(p) > behindBufSize || !w.reserve(int64(len(p))) {
		return false
	}
	buf := <-w.buffers
	if buf == nil {
		buf = make([]byte, behindBufSize)
	}
	buf = buf[:copy(buf[:cap(buf)], p)]
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = append(w.pending, pendingWrite{buf, off})
	if !w.running {
		w.running = true
		go w.run()
	}
	return true
}

// reserve takes n bytes of the room the spool's filesystem has above
// behindMinFree, looking at its free space (fstatfs) again once the room
// taken at the last look, at most behindRecheck, is used up.
func (w *writeBehind) reserve(n int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.room < n {
		var st unix.Statfs_t
		if unix.Fstatfs(int(w.fd.Fd()), &st) != nil {
			return false
		}
		w.room = min(int64(st.Bavail)*st.Bsize-behindMinFree, behindRecheck)
		if w.room < n {
			w.room = 0
			return false
		}
	}
	w.room -= n
	return true
}

// run writes the queue until it is empty.
func (w *writeBehind) run() {
	w.mu.Lock()
	for len(w.pending) > 0 {
		pw := w.pending[0]
		w.pending = w.pending[1:]
		w.mu.Unlock()
		n, err := w.fd.WriteAt(pw.buf, pw.off)
		w.done(pw.off, int64(len(pw.buf)), int64(n))
		w.buffers <- pw.buf[:0]
		w.mu.Lock()
		if err != nil && w.err == nil {
			w.err = fmt.Errorf("hfwrite: a write that returned failed: %w", err)
		}
	}
	w.pending = nil
	w.running = false
	w.idle.Broadcast()
	w.mu.Unlock()
}

// drain waits until every queued write is in the spool and returns the
// error of the first that failed.
func (w *writeBehind) drain() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.running {
		w.idle.Wait()
	}
	return w.err
}
