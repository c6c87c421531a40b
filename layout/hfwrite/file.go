package hfwrite

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/safetensors"
)

// File is one file being written: a spool file until it is committed or
// dropped.
//
// Its writes go through its stream (stream.go), and a tensor file is
// resharded while it is written (eager.go).
//
// Two locks: mu, and the stream's, taken after mu and never held while
// taking another. mu is never held during I/O on the whole file, nor while
// taking Session.mu, so Size and writes do not wait for a commit. Commit and
// Abort run once (settle), the first under Session.commitMu.
type File struct {
	s       *Session
	seq     uint64 // numbers the files of the session
	spool   string // its name in the session's directory
	started time.Time
	listed  bool    // a new file: shown under its name while written
	stream  *stream // the writes on their way to the spool, and what is there

	mu        sync.Mutex
	settling  chan struct{} // GUARDED_BY(mu): closed when the Commit or Abort that started is done; nil before
	name      string        // GUARDED_BY(mu)
	kind      Kind          // GUARDED_BY(mu)
	f         *os.File      // GUARDED_BY(mu); nil once done
	handles   int           // GUARDED_BY(mu): open handles
	writer    *Handle       // GUARDED_BY(mu): the handle open for writing, nil if none
	released  chan struct{} // GUARDED_BY(mu): closed by letGo; nil if no open waits
	changed   bool          // GUARDED_BY(mu): created, written or truncated
	sealed    bool          // GUARDED_BY(mu): a commit or drop started; writes and renames fail
	size      int64         // GUARDED_BY(mu): size when done
	done      bool          // GUARDED_BY(mu)
	err       error         // GUARDED_BY(mu): the result of Commit
	eager     *eagerRun     // GUARDED_BY(mu): the eager reshard, nil if none was started
	usedEager bool          // GUARDED_BY(mu): the commit used the eager reshard
}

// Seq numbers the file among those the session started (from 1).
func (f *File) Seq() uint64 { return f.seq }

// Started is when the file was started.
func (f *File) Started() time.Time { return f.started }

// Name is the file's name in the directory.
func (f *File) Name() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.name
}

// Kind is how the file will be committed.
func (f *File) Kind() Kind {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kind
}

// Eager reports whether the file was committed from its eager reshard
// (resharded while it was written) rather than resharded at Commit.
func (f *File) Eager() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usedEager
}

func (f *File) handle(write bool) (*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done || (write && f.sealed) {
		return nil, fmt.Errorf("%w: %s", ErrDone, f.name)
	}
	return f.f, nil
}

// markChanged records that a writer changed the file (created, wrote or
// truncated it): its last release commits it.
func (f *File) markChanged() {
	f.mu.Lock()
	f.changed = true
	f.mu.Unlock()
}

// WriteAt writes to the file (a change: its last release commits it).
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.writeAt(p, off)
	if n > 0 || err == nil {
		f.markChanged()
	}
	return n, err
}

// spoolWriter writes to the spool without it counting as a change (the
// copy a rewrite of a stored file starts from).
type spoolWriter struct{ f *File }

func (w spoolWriter) WriteAt(p []byte, off int64) (int, error) { return w.f.writeAt(p, off) }

func (f *File) writeAt(p []byte, off int64) (int, error) {
	fd, err := f.handle(true)
	if err != nil {
		return 0, err
	}
	n := int64(len(p))
	if err := f.stream.begin(off, n); err != nil {
		if errors.Is(err, ErrDone) {
			err = fmt.Errorf("%w: %s", err, f.Name())
		}
		return 0, err
	}
	if n > 0 && f.stream.queue(p, off) {
		return len(p), nil
	}
	// Not queued (too large, or the disk nearly full): written here,
	// after those queued.
	if err := f.stream.drain(); err != nil {
		f.stream.end(off, n, 0)
		return 0, err
	}
	written, err := fd.WriteAt(p, off)
	f.stream.end(off, n, int64(written))
	return written, err
}

// spooled returns the spool once every write is in it.
func (f *File) spooled(write bool) (*os.File, error) {
	fd, err := f.handle(write)
	if err != nil {
		return nil, err
	}
	return fd, f.stream.drain()
}

// ReadAt reads back from the spool.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	fd, err := f.spooled(false)
	if err != nil {
		return 0, err
	}
	return fd.ReadAt(p, off)
}

// Truncate changes the size of the file (a change: its last release
// commits it).
func (f *File) Truncate(size int64) error {
	fd, err := f.spooled(true)
	if err != nil {
		return err
	}
	f.markChanged()
	return f.stream.truncate(size, func() error { return fd.Truncate(size) })
}

// Size is the number of bytes written so far (or when it was committed).
func (f *File) Size() (int64, error) {
	fd, err := f.handle(false)
	if err != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.size, nil
	}
	// A failed write shows in the size; the commit reports it.
	_ = f.stream.drain()
	fi, err := fd.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Complete reports whether the spool holds a whole safetensors file: a
// valid header and exactly the data it declares. A writer that renames its
// open temp file into place (safetensors' save_file) is done writing then,
// and committing at the rename lets the rename report errors that close
// would otherwise report to a writer that ignores them.
func (f *File) Complete() bool {
	f.mu.Lock()
	kind, fd, ok := f.kind, f.f, !f.done && !f.sealed
	f.mu.Unlock()
	if !ok || kind != TensorFile || f.stream.drain() != nil {
		return false
	}
	fi, err := fd.Stat()
	if err != nil {
		return false
	}
	_, err = safetensors.ReadHeader(fd, fi.Size())
	return err == nil
}

// Done reports whether the file was committed or dropped, and the result
// of Commit.
func (f *File) Done() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done, f.err
}

// rename gives the file a new name (and so maybe a new kind), as the
// write-to-temp-then-rename pattern does before it closes the file. It
// fails once a commit has started.
func (f *File) rename(name string) error {
	kind, err := KindOf(name)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done || f.sealed {
		return fmt.Errorf("%w: %s", ErrDone, f.name)
	}
	f.name, f.kind = name, kind
	if kind == IndexFile {
		f.stream.abandon()
	} else {
		f.startEager() // if none was: the file was an index
	}
	return nil
}

// Commit makes the file part of the directory (see the package doc) and
// removes its spool. It runs once; later calls return the first result,
// and Options.OnCommit is told the first. On success the committed state
// is durable when Commit returns. Every error wraps ErrCommit, and nothing
// of the file was committed.
func (f *File) Commit() error {
	return f.settle(f.commitOnce)
}

func (f *File) commitOnce() error {
	f.mu.Lock()
	f.sealed = true
	name, kind := f.name, f.kind
	f.mu.Unlock()
	start := time.Now()

	// The eager reshard finishes the tail and fsyncs before the commit
	// takes the session's lock; its result is used only if nothing it read
	// changed since.
	f.stream.seal()
	rs := f.takeEager()
	if rs != nil && (kind != TensorFile || !f.stream.valid()) {
		rs.Discard()
		rs = nil
	}
	s := f.s
	var used bool
	err := f.stream.drain()
	if err == nil {
		s.commitMu.Lock()
		err = f.commit(name, kind, rs, &used)
		s.commitMu.Unlock()
	} else if rs != nil {
		rs.Discard()
	}
	if err != nil {
		err = &CommitError{Name: name, Dir: s.path, Err: err}
	}
	f.mu.Lock()
	f.usedEager = used && err == nil
	f.mu.Unlock()
	// Reported before the file leaves the session: whoever sees it gone
	// (a listing, a waiting test) also sees its report.
	if s.opts.OnCommit != nil {
		size, _ := f.Size()
		s.opts.OnCommit(Report{Path: filepath.Join(s.path, name), Size: size, Started: f.started,
			Took: time.Since(start), Eager: used && err == nil, Err: err})
	}
	f.finish(err)
	return err
}

// Abort drops the file: nothing is committed and the spool is removed.
func (f *File) Abort() {
	f.settle(func() error {
		f.stream.stop()
		if rs := f.takeEager(); rs != nil {
			rs.Discard()
		}
		err := fmt.Errorf("%w: %s: dropped", ErrCommit, f.Name())
		f.finish(err)
		return err
	})
}

// settle runs fn, the file's Commit or Abort, once: a later or concurrent
// call waits for the first to finish and returns its result.
func (f *File) settle(fn func() error) error {
	f.mu.Lock()
	if ch := f.settling; ch != nil {
		f.mu.Unlock()
		<-ch
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.err
	}
	ch := make(chan struct{})
	f.settling = ch
	f.mu.Unlock()
	defer close(ch)
	return fn()
}

// finish closes and removes the spool, as the file's Commit or Abort.
func (f *File) finish(err error) {
	_ = f.stream.drain() // nothing is written to the spool once it is closed
	f.mu.Lock()
	f.sealed = true // its name stays: no rename moves it in the session now
	name := f.name
	f.mu.Unlock()
	// Out of the session, and its commit in the directory's content, before
	// it is done: an open that finds it done (ErrStale) looks the name up
	// again, and must find what replaced it.
	f.s.forget(f, name)
	if err == nil {
		f.s.bump()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fi, serr := f.f.Stat(); serr == nil {
		f.size = fi.Size()
	}
	f.f.Close()
	f.f = nil
	f.s.root.Remove(f.spool) // gone already when a sidecar was renamed into place
	f.done, f.err = true, err
	f.letGo()
}

// commit does the work of Commit, holding the session's commitMu. The
// file is sealed: its name and kind are fixed and f.f stays
// open. rs, the finished eager reshard of a tensor file or nil, is
// committed or discarded.
func (f *File) commit(name string, kind Kind, rs *dcpwrite.Reshard, used *bool) error {
	if kind != SidecarFile {
		return commitWhole(f.s, f.f, name, kind, rs, used)
	}
	if err := f.f.Sync(); err != nil {
		return err
	}
	if err := f.s.root.Rename(f.spool, name); err != nil {
		return err
	}
	if err := f.s.root.Sync("."); err != nil {
		return fmt.Errorf("stored, but fsync of %s failed: %w", f.s.path, err)
	}
	return nil
}

// commitWhole commits the complete tensor file or shard index src as name.
// rs, the finished eager reshard of src or nil, is committed or discarded;
// used is set when it was committed. Holding s.commitMu.
func commitWhole(s *Session, src *os.File, name string, kind Kind, rs *dcpwrite.Reshard, used *bool) error {
	defer func() {
		if rs != nil {
			rs.Discard()
		}
	}()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return ErrEmpty
	}
	if kind == IndexFile {
		return s.checkIndex(src, fi.Size(), name)
	}
	h, err := safetensors.ReadHeader(src, fi.Size())
	if err != nil {
		return err
	}
	if s.index != nil {
		for _, t := range h.Tensors {
			if got, ok := s.index[t.Name]; !ok || got != name {
				return fmt.Errorf("%w: %s maps tensor %q to %s", ErrIndex, s.indexOf, t.Name, orNone(got))
			}
		}
	}
	if rs != nil && rs.Matches(h) {
		err = rs.Commit()
		rs = nil
		if used != nil {
			*used = true
		}
	} else {
		err = s.dir.Commit(src, h)
	}
	if err != nil {
		return err
	}
	for _, t := range h.Tensors {
		s.received[t.Name] = name
	}
	return nil
}

// checkIndex checks the shard index src (size bytes) against the tensors
// received and makes it the index later files are checked against.
func (s *Session) checkIndex(src io.ReaderAt, size int64, name string) error {
	if size > hfdir.MaxIndexBytes {
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrIndex, name, size, hfdir.MaxIndexBytes)
	}
	b, err := io.ReadAll(io.NewSectionReader(src, 0, size))
	if err != nil {
		return err
	}
	idx, err := hfdir.ParseIndex(b, name)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrIndex, err)
	}
	names := make([]string, 0, len(s.received))
	for n := range s.received {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if got := idx.WeightMap[n]; got != s.received[n] {
			return fmt.Errorf("%w: tensor %q was received in %s but %s maps it to %s", ErrIndex, n, s.received[n], name, orNone(got))
		}
	}
	for n, file := range idx.WeightMap {
		if k, err := KindOf(file); err != nil || k != TensorFile {
			return fmt.Errorf("%w: %s maps tensor %q to %q, not a safetensors file name", ErrIndex, name, n, file)
		}
	}
	s.index, s.indexOf = idx.WeightMap, name
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "no file"
	}
	return s
}

// CommitError is the error of a failed commit.
type CommitError struct {
	Name string // file name
	Dir  string // the session's directory
	Err  error
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("hfwrite: %s: %s not committed: %v", e.Dir, e.Name, e.Err)
}

// Unwrap returns ErrCommit and the cause.
func (e *CommitError) Unwrap() []error { return []error{ErrCommit, e.Err} }
