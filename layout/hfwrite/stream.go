package hfwrite

import (
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
)

// A file's bytes on their way into its spool, and what of them is there:
// one stream per file, one lock and one condition for both.
//
// Write-behind. A write returns once its bytes are copied into one of a
// few buffers; the file's eager resharder (eager.go) writes them to the
// spool in the order they came, whenever one of its workers waits for
// bytes (wait): a file being written has no goroutine of its own for them. A writer (cp, save_pretrained) waits
// for each write before it reads the next bytes of its source, and the
// spool's copy into fresh page-cache pages is the costliest step of a
// write: done in the handler, it ran serially with the writer's reads, and
// a third of the two cores' time went idle during a cp. Whoever else must
// see the queue written (the next write that is not queued, fsync, a read,
// the commit) writes what is left itself rather than wait. Writes are not
// queued when no resharder serves the file (an index or config file, a
// reshard that ended or was abandoned), when every buffer is taken (the
// resharder is busy: the writer then writes, and so helps), or when the
// spool's filesystem is nearly full: a full disk is still reported by the
// write that does not fit, as writes are queued only while the filesystem
// has room for every queued byte and a margin (another writer filling the
// disk meanwhile is caught by the next write or the commit). The error of
// a write that already returned fails the next write, fsync
// (Handle.Written) and the commit, as a write-back cache reports it.
//
// Progress. The eager reshard (eager.go) reads the file while it is
// written: it waits for the bytes it needs to be written (wait) and claims
// them; a write or truncate that changes claimed bytes breaks the attempt,
// and the commit then reshards the complete file instead. A write counts as
// under way from begin until it is in the spool (queued ones included), so
// the resharder never reads bytes not yet there, and seal waits for them.

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

// maxSpans bounds the written ranges a file tracks (a writer filling holes
// in random order); past it the eager attempt is dropped.
const maxSpans = 4096

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

type span struct{ off, end int64 }

type pendingWrite struct {
	buf []byte
	off int64
}

// stream is one file's bytes on their way into its spool fd.
type stream struct {
	fd      *os.File
	buffers chan []byte // the session's Limits.buffers

	mu   sync.Mutex
	cond sync.Cond // a write queued or landed, the attempt ended, or bytes a waiter wants written
	// Write-behind.
	pending  []pendingWrite // GUARDED_BY(mu)
	served   bool           // GUARDED_BY(mu): a resharder writes pending while it waits
	draining bool           // GUARDED_BY(mu): someone is writing the head of pending
	err      error          // GUARDED_BY(mu): of the first queued write that failed
	room     int64          // GUARDED_BY(mu): bytes that may be queued before the free space is looked at again
	// Progress.
	done     []span // GUARDED_BY(mu): bytes written, sorted, merged
	inflight []span // GUARDED_BY(mu): writes under way
	claimed  int64  // GUARDED_BY(mu): bytes below it may have been read by the resharder
	want     int64  // GUARDED_BY(mu): the least end a resharder worker waits for, 0 if none
	broken   bool   // GUARDED_BY(mu): claimed bytes may have changed: the attempt is void
	stopped  bool   // GUARDED_BY(mu): the file was aborted
	sealed   bool   // GUARDED_BY(mu): no more writes; every byte is final
}

func newStream(fd *os.File, limits *Limits) *stream {
	s := &stream{fd: fd, buffers: limits.buffers}
	s.cond.L = &s.mu
	return s
}

// begin registers a write of n bytes at off before it is done; a write of
// bytes the resharder may have read breaks the attempt. It fails once the
// file is sealed, or after a queued write failed.
func (s *stream) begin(off, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed {
		return ErrDone
	}
	if s.err != nil {
		return s.err
	}
	if n <= 0 {
		return nil
	}
	if off < s.claimed || off < 0 || off > math.MaxInt64-n {
		s.broken = true
		s.wake()
	}
	s.inflight = append(s.inflight, span{off, off + n})
	return nil
}

// end records the write registered by begin(off, n), of which written
// bytes were written.
func (s *stream) end(off, n, written int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.landed(off, n, written)
}

// landed is end, holding mu.
func (s *stream) landed(off, n, written int64) {
	if n <= 0 {
		return
	}
	for i, w := range s.inflight {
		if w == (span{off, off + n}) {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	if written > 0 && !s.broken {
		s.add(span{off, off + written})
	}
	if s.sealed && len(s.inflight) == 0 {
		s.cond.Broadcast() // seal waits for this
	}
	s.wake()
}

// queue copies p, registered with begin, to be written at off. It returns
// false, queueing nothing, when p is larger than a buffer, no resharder
// serves the file, every buffer is taken or the spool's filesystem is
// nearly full: the caller writes it (after drain) and calls end.
func (s *stream) queue(p []byte, off int64) bool {
	if len(p) > behindBufSize {
		return false
	}
	var buf []byte
	select {
	case buf = <-s.buffers:
	default:
		return false
	}
	if buf == nil {
		buf = make([]byte, behindBufSize)
	}
	buf = buf[:copy(buf[:cap(buf)], p)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.served || !s.reserve(int64(len(p))) {
		s.buffers <- buf[:0]
		return false
	}
	s.pending = append(s.pending, pendingWrite{buf, off})
	s.cond.Broadcast() // the resharder, if it waits, writes it
	return true
}

// reserve takes n bytes of the room the spool's filesystem has above
// behindMinFree, looking at its free space (fstatfs) again once the room
// taken at the last look, at most behindRecheck, is used up. Holding mu.
func (s *stream) reserve(n int64) bool {
	if s.room < n {
		var st unix.Statfs_t
		if unix.Fstatfs(int(s.fd.Fd()), &st) != nil {
			return false
		}
		s.room = min(int64(st.Bavail)*st.Bsize-behindMinFree, behindRecheck)
		if s.room < n {
			s.room = 0
			return false
		}
	}
	s.room -= n
	return true
}

// writeQueued writes the oldest queued write to the spool, unless the queue
// is empty or another is writing one, and reports whether it did. Holding
// mu, which it releases during the write.
func (s *stream) writeQueued() bool {
	if s.draining || len(s.pending) == 0 {
		return false
	}
	pw := s.pending[0]
	s.pending = s.pending[1:]
	s.draining = true
	s.mu.Unlock()
	n, err := s.fd.WriteAt(pw.buf, pw.off)
	s.buffers <- pw.buf[:0]
	s.mu.Lock()
	s.draining = false
	s.landed(pw.off, int64(len(pw.buf)), int64(n))
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("hfwrite: a write that returned failed: %w", err)
	}
	if len(s.pending) == 0 {
		s.pending = nil
	}
	s.cond.Broadcast() // one waiting in drainLocked may write the next
	return true
}

// drain makes sure every queued write is in the spool, writing those left
// itself, and returns the error of the first that failed.
func (s *stream) drain() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked()
	return s.err
}

// drainLocked is drain, holding mu.
func (s *stream) drainLocked() {
	for len(s.pending) > 0 || s.draining {
		if !s.writeQueued() {
			s.cond.Wait() // another writes the head: it broadcasts when it is in
		}
	}
}

// serve makes the file's resharder the writer of its queue, until unserve
// (called by the resharder when it ends) writes what is left.
func (s *stream) serve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served = true
}

func (s *stream) unserve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served = false
	s.drainLocked()
}

// prefix is the end of the contiguous written bytes from 0. Holding mu.
func (s *stream) prefix() int64 {
	if len(s.done) > 0 && s.done[0].off == 0 {
		return s.done[0].end
	}
	return 0
}

// wake wakes the resharder's workers if what one waits for may have
// happened; they register again what they still wait for. Holding mu.
func (s *stream) wake() {
	if s.broken || s.stopped || s.sealed || (s.want > 0 && s.prefix() >= s.want) {
		s.want = 0
		s.cond.Broadcast()
	}
}

// add merges w into done. Holding mu.
func (s *stream) add(w span) {
	i := 0
	for i < len(s.done) && s.done[i].end < w.off {
		i++
	}
	j := i
	for j < len(s.done) && s.done[j].off <= w.end {
		w.off = min(w.off, s.done[j].off)
		w.end = max(w.end, s.done[j].end)
		j++
	}
	s.done = append(s.done[:i], append([]span{w}, s.done[j:]...)...)
	if len(s.done) > maxSpans {
		s.broken, s.done = true, nil
	}
}

// truncate runs do, the truncation of the file to size, holding mu so that
// the resharder claims nothing meanwhile. Cutting bytes the resharder may
// have read breaks the attempt.
func (s *stream) truncate(size int64, do func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed {
		return ErrDone
	}
	if size < s.claimed {
		s.broken = true
	}
	err := do()
	if err != nil && size < s.maxEnd() {
		s.broken = true // the size is unknown now
	}
	// Bytes cut are no longer written (they read as zeros when extended).
	done := s.done[:0]
	for _, w := range s.done {
		if w.off < size {
			done = append(done, span{w.off, min(w.end, size)})
		}
	}
	s.done = done
	s.wake()
	return err
}

// maxEnd is the end of the last byte written or being written. Holding mu.
func (s *stream) maxEnd() int64 {
	var e int64
	if len(s.done) > 0 {
		e = s.done[len(s.done)-1].end
	}
	for _, w := range s.inflight {
		e = max(e, w.end)
	}
	return e
}

// abandon breaks the attempt (a rename to another kind of file).
func (s *stream) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.broken = true
	s.wake()
}

// stop makes the resharder give up (the file is aborted).
func (s *stream) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.wake()
}

// seal ends the writes: it waits for those under way (queued ones
// included), and from then on every byte is final and wait returns at
// once.
func (s *stream) seal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sealed = true
	for len(s.inflight) > 0 {
		if !s.writeQueued() {
			s.cond.Wait()
		}
	}
	s.cond.Broadcast()
}

// valid reports whether nothing the resharder may have read has changed.
func (s *stream) valid() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.broken && !s.stopped
}

// wait blocks until the bytes below end are written and no write under
// way changes them, then claims them: changing them later breaks the
// attempt.
func (s *stream) wait(end int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.broken || s.stopped {
			return errAbandoned
		}
		if (s.sealed && len(s.inflight) == 0) || (s.prefix() >= end && !s.writing(s.claimed, end)) {
			s.claimed = max(s.claimed, end)
			return nil
		}
		if s.writeQueued() {
			continue
		}
		if s.want == 0 || end < s.want {
			s.want = end
		}
		s.cond.Wait()
	}
}

// writing reports whether a write under way touches [off, end). Holding mu.
func (s *stream) writing(off, end int64) bool {
	for _, w := range s.inflight {
		if w.off < end && off < w.end {
			return true
		}
	}
	return false
}
