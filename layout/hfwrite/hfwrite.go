// Package hfwrite turns the files of a HuggingFace model directory, written
// one at a time, into a DCP checkpoint: the write path of a ckptfs mount,
// usable without FUSE.
//
// A Writer owns one target directory. Each file written into it goes to a
// spool file in the hidden SpoolDir beside the checkpoint (on the same
// disk, never in memory) and is committed as a whole by File.Commit:
//
//   - "*.safetensors": the header is read and validated with the strict
//     rules of safetensors.ReadHeader, checked against a shard index
//     received earlier, and the file is resharded into DCP shard files by
//     dcpwrite.Dir.Commit, which rewrites .metadata atomically. Usually the
//     file was resharded while it was written (dcpwrite.Reshard, see
//     eager.go) and Commit only finishes that: the result is the same.
//   - "*.safetensors.index.json" (a shard index): parsed and checked
//     against the tensors received; it is not stored, since the view of the
//     checkpoint generates its own index.
//   - any other name (config.json, tokenizer files, ...): fsynced and
//     renamed into the directory as-is.
//
// A failed commit leaves the committed state as it was and removes the
// spool file; every such error wraps ErrCommit. Spool files of a writer
// that died are removed by CleanStale.
package hfwrite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/safetensors"
)

// SpoolDir is the hidden directory, inside a target directory, that holds
// the files being written.
const SpoolDir = ".ckptfs-spool"

// maxIndexBytes bounds a shard index (a 1M-tensor index is ~100 MB).
const maxIndexBytes = 256 << 20

var (
	// ErrCommit is wrapped by every error of File.Commit: the file was not
	// committed and the checkpoint is as it was before.
	ErrCommit = errors.New("hfwrite: file not committed")
	// ErrIndex is wrapped when a shard index and the tensors received
	// disagree.
	ErrIndex = errors.New("hfwrite: shard index does not match the tensors received")
	// ErrReserved is returned by NewFile for names the checkpoint itself
	// uses (.metadata, *.distcp, ...): writing them would corrupt it.
	ErrReserved = errors.New("hfwrite: name is reserved for the checkpoint's own files")
	// ErrDone is returned by writes to a File that was committed or aborted.
	ErrDone = errors.New("hfwrite: file already committed or aborted")
)

// Kind is how a written file is committed.
type Kind int

const (
	// KindSidecar is stored as-is.
	KindSidecar Kind = iota
	// KindSafetensors is resharded into DCP shards.
	KindSafetensors
	// KindIndex is a shard index, checked against the tensors received.
	KindIndex
)

var (
	shardFile      = regexp.MustCompile(`^__[0-9]+_[0-9]+\.distcp$`)
	rankLocalMeta  = regexp.MustCompile(`^__[0-9]+\.metadata$`)
	reservedNames  = map[string]bool{".metadata": true, ".metadata.tmp": true, SpoolDir: true}
	indexSuffix    = ".safetensors.index.json"
	safetensorsExt = ".safetensors"
)

// KindOf returns how a file of the given name is committed, or ErrReserved.
func KindOf(name string) (Kind, error) {
	switch {
	case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return 0, fmt.Errorf("hfwrite: invalid file name %q", name)
	case reservedNames[name], shardFile.MatchString(name), rankLocalMeta.MatchString(name),
		strings.HasSuffix(name, ".distcp"):
		return 0, fmt.Errorf("%w: %q", ErrReserved, name)
	case strings.HasSuffix(name, indexSuffix):
		return KindIndex, nil
	case strings.HasSuffix(name, safetensorsExt):
		return KindSafetensors, nil
	}
	return KindSidecar, nil
}

// Writer writes HF files into one DCP directory. Its methods are safe for
// concurrent use; commits are serialized.
type Writer struct {
	dir   *dcpwrite.Dir
	path  string
	spool string
	fqn   func(string) string

	// Lock order: commitMu, then mu.
	commitMu sync.Mutex
	mu       sync.Mutex
	lock     *os.File          // GUARDED_BY(mu): the flocked spool dir, nil until the first file
	seq      int               // GUARDED_BY(mu): spool file counter
	open     map[*File]bool    // GUARDED_BY(mu): files not yet committed or aborted
	files    map[string]string // GUARDED_BY(commitMu): tensor name → file it was committed from
	index    map[string]string // GUARDED_BY(commitMu): weight_map of the last index, nil if none
	indexOf  string            // GUARDED_BY(commitMu): name of that index file
	gen      uint64            // GUARDED_BY(mu): number of successful commits
	closed   bool              // GUARDED_BY(mu)
	tensors  int               // GUARDED_BY(mu): tensors in the committed checkpoint
}

// Create opens path (creating it, not its parents, if missing) as a DCP
// directory to write into with the given target layout. Leftovers of an
// earlier writer that died are removed: its spool (CleanStale) and the shard
// files its .metadata does not name (dcpwrite.OpenDir).
func Create(path string, target dcpwrite.Target) (*Writer, error) {
	d, err := dcpwrite.OpenDir(path, target)
	if err != nil {
		return nil, err
	}
	if _, err := CleanStale(path); err != nil {
		return nil, err
	}
	return &Writer{
		dir: d, path: path, spool: filepath.Join(path, SpoolDir), fqn: target.FQN,
		open: map[*File]bool{}, files: map[string]string{},
		tensors: len(d.Committed()),
	}, nil
}

// Path is the target directory.
func (w *Writer) Path() string { return w.path }

// Generation counts the successful commits of this writer: it changes
// whenever the directory's content does.
func (w *Writer) Generation() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// Tensors is the number of tensors in the committed checkpoint.
func (w *Writer) Tensors() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tensors
}

// NewFile starts writing the file name (a single path component) into the
// directory. Nothing is visible in the directory until Commit.
func (w *Writer) NewFile(name string) (*File, error) {
	kind, err := KindOf(name)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, fmt.Errorf("hfwrite: %s: writer closed", w.path)
	}
	if w.lock == nil {
		if err := os.Mkdir(w.spool, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("hfwrite: %w", err)
		}
		lock, err := os.Open(w.spool)
		if err != nil {
			return nil, fmt.Errorf("hfwrite: %w", err)
		}
		// Held for the writer's life: CleanStale leaves a locked spool alone.
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			lock.Close()
			return nil, fmt.Errorf("hfwrite: %s is in use by another writer: %w", w.spool, err)
		}
		w.lock = lock
	}
	w.seq++
	sp := filepath.Join(w.spool, strconv.Itoa(w.seq)+".part")
	// The spool dir is private (0700); the mode is the one a stored sidecar keeps.
	f, err := os.OpenFile(sp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("hfwrite: spooling %s: %w", name, err)
	}
	file := &File{w: w, name: name, kind: kind, spool: sp, f: f, prog: newProgress()}
	if kind != KindIndex {
		// Also under another name: safetensors' save_file writes a temp
		// file (.tmpXXXXXX) and renames it when complete. The attempt gives
		// up at once on content that is not safetensors.
		file.startEager()
	}
	w.open[file] = true
	return file, nil
}

// Close aborts the files still being written, removes the spool and
// releases the directory. Committed files stay.
func (w *Writer) Close() error {
	w.mu.Lock()
	files := make([]*File, 0, len(w.open))
	for f := range w.open {
		files = append(files, f)
	}
	w.closed = true
	w.mu.Unlock()
	for _, f := range files {
		f.Abort()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lock == nil {
		return nil
	}
	err := os.RemoveAll(w.spool)
	w.lock.Close()
	w.lock = nil
	return err
}

// File is one file being written: a spool file until Commit or Abort.
//
// A safetensors file is resharded while it is written (eager.go): writes
// are tracked by prog, and a goroutine (eager) reshards what has arrived.
type File struct {
	w     *Writer
	spool string
	prog  *progress // its own lock, taken last: never held while taking another

	// Lock order: commitMu (serializes Commit and Abort of this file), then
	// Writer.commitMu, then mu, then Writer.mu. mu is never held during I/O
	// on the whole file, so Size and writes do not wait for a commit.
	commitMu  sync.Mutex
	mu        sync.Mutex
	name      string    // GUARDED_BY(mu)
	kind      Kind      // GUARDED_BY(mu)
	f         *os.File  // GUARDED_BY(mu); nil once done
	sealed    bool      // GUARDED_BY(mu): a commit started; writes fail
	size      int64     // GUARDED_BY(mu): size when done
	done      bool      // GUARDED_BY(mu)
	err       error     // GUARDED_BY(mu): the result of Commit
	eager     *eagerRun // GUARDED_BY(mu): the eager reshard, nil if none was started
	usedEager bool      // GUARDED_BY(mu): the commit used the eager reshard
}

// Eager reports whether the file was committed from its eager reshard
// (resharded while it was written) rather than resharded at Commit.
func (f *File) Eager() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usedEager
}

// startEager starts the eager reshard of the file, once. Holding mu (or
// before the File is shared).
func (f *File) startEager() {
	if f.eager != nil || f.f == nil || f.sealed || f.done {
		return
	}
	run := &eagerRun{done: make(chan struct{})}
	f.eager = run
	go f.runEager(f.f, run)
}

// takeEager waits for the eager reshard to end and returns it, ready to
// commit, or nil. The caller then owns it: it must Commit or Discard it.
// Called holding commitMu, after prog was sealed or stopped.
func (f *File) takeEager() *dcpwrite.Reshard {
	f.mu.Lock()
	run := f.eager
	f.mu.Unlock()
	if run == nil {
		return nil
	}
	<-run.done
	ec := run.ec
	run.ec = nil
	return ec
}

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

func (f *File) handle(write bool) (*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done || (write && f.sealed) {
		return nil, fmt.Errorf("%w: %s", ErrDone, f.name)
	}
	return f.f, nil
}

// WriteAt writes to the spool.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	fd, err := f.handle(true)
	if err != nil {
		return 0, err
	}
	n := int64(len(p))
	if err := f.prog.begin(off, n); err != nil {
		return 0, fmt.Errorf("%w: %s", err, f.Name())
	}
	written, err := fd.WriteAt(p, off)
	f.prog.end(off, n, int64(written))
	return written, err
}

// ReadAt reads back from the spool.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	fd, err := f.handle(false)
	if err != nil {
		return 0, err
	}
	return fd.ReadAt(p, off)
}

// Truncate changes the size of the spool.
func (f *File) Truncate(size int64) error {
	fd, err := f.handle(true)
	if err != nil {
		return err
	}
	return f.prog.truncate(size, func() error { return fd.Truncate(size) })
}

// Size is the number of bytes written so far (or when it was committed).
func (f *File) Size() (int64, error) {
	fd, err := f.handle(false)
	if err != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.size, nil
	}
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
	kind := f.kind
	f.mu.Unlock()
	fd, err := f.handle(true)
	if err != nil || kind != KindSafetensors {
		return false
	}
	fi, err := fd.Stat()
	if err != nil {
		return false
	}
	_, err = safetensors.ReadHeader(fd, fi.Size())
	return err == nil
}

// Done reports whether the file was committed or aborted, and the result
// of Commit.
func (f *File) Done() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done, f.err
}

// Commit makes the file part of the directory (see the package doc) and
// removes its spool. It runs once; later calls return the first result.
// On success the committed state is durable when Commit returns. Every
// error wraps ErrCommit, and nothing of the file was committed.
func (f *File) Commit() error {
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	f.mu.Lock()
	if f.done {
		defer f.mu.Unlock()
		return f.err
	}
	f.sealed = true
	name, kind := f.name, f.kind
	f.mu.Unlock()

	// The eager reshard finishes the tail and fsyncs before the commit
	// takes the writer's lock; its result is used only if nothing it read
	// changed since.
	f.prog.seal()
	ec := f.takeEager()
	if ec != nil && (kind != KindSafetensors || !f.prog.valid()) {
		ec.Discard()
		ec = nil
	}
	w := f.w
	var used bool
	w.commitMu.Lock()
	err := f.commit(name, kind, ec, &used)
	w.commitMu.Unlock()
	f.mu.Lock()
	f.usedEager = used && err == nil
	f.mu.Unlock()
	if err != nil {
		err = &CommitError{Name: name, Dir: w.path, Err: err}
	}
	f.finish(err)
	return err
}

// Abort drops the file: nothing is committed and the spool is removed.
func (f *File) Abort() {
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	f.mu.Lock()
	done := f.done
	f.mu.Unlock()
	if !done {
		f.prog.stop()
		if ec := f.takeEager(); ec != nil {
			ec.Discard()
		}
		f.finish(fmt.Errorf("%w: %s: aborted", ErrCommit, f.Name()))
	}
}

// finish closes and removes the spool. Called holding f.commitMu.
func (f *File) finish(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fi, serr := f.f.Stat(); serr == nil {
		f.size = fi.Size()
	}
	f.f.Close()
	f.f = nil
	os.Remove(f.spool) // gone already when a sidecar was renamed into place
	f.done, f.err = true, err
	f.w.mu.Lock()
	delete(f.w.open, f)
	f.w.mu.Unlock()
	if err == nil {
		f.w.bump()
	}
}

// commit does the work of Commit, holding f.commitMu and w.commitMu. The
// file is sealed: its name and kind are fixed and f.f stays open. ec, the
// finished eager reshard of a safetensors file or nil, is committed or
// discarded.
func (f *File) commit(name string, kind Kind, ec *dcpwrite.Reshard, used *bool) error {
	src := source{w: f.w, f: f.f, name: name, eager: ec, used: used}
	if kind == KindSidecar {
		if err := f.f.Sync(); err != nil {
			return err
		}
		if err := os.Rename(f.spool, filepath.Join(f.w.path, name)); err != nil {
			return err
		}
		if err := ckpt.SyncDir(f.w.path); err != nil {
			return fmt.Errorf("stored, but fsync of %s failed: %w", f.w.path, err)
		}
		return nil
	}
	return src.commit(kind)
}

// source is a complete file to commit as name.
type source struct {
	w     *Writer
	f     *os.File
	name  string
	eager *dcpwrite.Reshard // the eager reshard of f, or nil; committed or discarded
	used  *bool             // if not nil, set when eager was committed
}

// commit commits a safetensors file or a shard index. Holding w.commitMu.
func (s source) commit(kind Kind) error {
	fi, err := s.f.Stat()
	if err != nil {
		if s.eager != nil {
			s.eager.Discard()
		}
		return err
	}
	if kind == KindIndex {
		return s.index(fi.Size())
	}
	return s.tensors(fi.Size())
}

func (s source) tensors(size int64) error {
	w := s.w
	ec := s.eager
	defer func() {
		if ec != nil {
			ec.Discard()
		}
	}()
	h, err := safetensors.ReadHeader(s.f, size)
	if err != nil {
		return err
	}
	if w.index != nil {
		for _, t := range h.Tensors {
			if got, ok := w.index[t.Name]; !ok || got != s.name {
				return fmt.Errorf("%w: %s maps tensor %q to %s", ErrIndex, w.indexOf, t.Name, orNone(got))
			}
		}
	}
	if ec != nil && ec.Matches(h) {
		err = ec.Commit()
		ec = nil
		if s.used != nil {
			*s.used = true
		}
	} else {
		err = w.dir.Commit(s.f, h)
	}
	if err != nil {
		return err
	}
	for _, t := range h.Tensors {
		w.files[t.Name] = s.name
	}
	return nil
}

func (s source) index(size int64) error {
	w := s.w
	if size > maxIndexBytes {
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrIndex, s.name, size, maxIndexBytes)
	}
	b, err := io.ReadAll(io.NewSectionReader(s.f, 0, size))
	if err != nil {
		return err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("%w: %s is not a shard index: %v", ErrIndex, s.name, err)
	}
	if idx.WeightMap == nil {
		return fmt.Errorf("%w: %s has no weight_map", ErrIndex, s.name)
	}
	names := make([]string, 0, len(w.files))
	for n := range w.files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if got := idx.WeightMap[n]; got != w.files[n] {
			return fmt.Errorf("%w: tensor %q was received in %s but %s maps it to %s", ErrIndex, n, w.files[n], s.name, orNone(got))
		}
	}
	for n, file := range idx.WeightMap {
		if k, err := KindOf(file); err != nil || k != KindSafetensors {
			return fmt.Errorf("%w: %s maps tensor %q to %q, not a safetensors file name", ErrIndex, s.name, n, file)
		}
	}
	w.index, w.indexOf = idx.WeightMap, s.name
	return nil
}

// Rename gives a file being written a new name (and so maybe a new kind),
// as the write-to-temp-then-rename pattern does before it closes the file.
// It fails once Commit has started.
func (f *File) Rename(name string) error {
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
	if kind == KindIndex {
		f.prog.abandon()
	} else {
		f.startEager() // if none was: the file was an index
	}
	return nil
}

// RenameStored renames the stored file old of the directory (a sidecar
// committed before) to name. A sidecar name is a plain rename; a
// safetensors or index name commits the stored file as that kind of file
// (the write, close, then rename pattern) and removes it. Errors of such a
// commit wrap ErrCommit; the stored file then stays.
func (w *Writer) RenameStored(old, name string) error {
	if k, err := KindOf(old); err != nil || k != KindSidecar {
		return fmt.Errorf("hfwrite: %s is not a stored file", old)
	}
	kind, err := KindOf(name)
	if err != nil {
		return err
	}
	oldPath, newPath := filepath.Join(w.path, old), filepath.Join(w.path, name)
	w.commitMu.Lock()
	defer w.commitMu.Unlock()
	if kind == KindSidecar {
		if err := os.Rename(oldPath, newPath); err != nil {
			return fmt.Errorf("hfwrite: %w", err)
		}
		w.bump()
		return ckpt.SyncDir(w.path)
	}
	f, err := os.Open(oldPath)
	if err != nil {
		return fmt.Errorf("hfwrite: %w", err)
	}
	defer f.Close()
	if err := (source{w: w, f: f, name: name}).commit(kind); err != nil {
		return &CommitError{Name: name, Dir: w.path, Err: err}
	}
	w.bump()
	if err := os.Remove(oldPath); err != nil {
		return fmt.Errorf("hfwrite: %s committed as %s, but not removed: %w", old, name, err)
	}
	return ckpt.SyncDir(w.path)
}

// bump records a change of the directory's content.
func (w *Writer) bump() {
	n := len(w.dir.Committed())
	w.mu.Lock()
	w.gen++
	w.tensors = n
	w.mu.Unlock()
}

func orNone(s string) string {
	if s == "" {
		return "no file"
	}
	return s
}

// Pending returns the tensor names of the last shard index that no
// committed file has delivered yet, sorted; nil without an index.
func (w *Writer) Pending() []string {
	w.commitMu.Lock()
	defer w.commitMu.Unlock()
	var out []string
	for n := range w.index {
		if _, ok := w.files[n]; !ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// CommitError is the error of a failed Commit.
type CommitError struct {
	Name string // file name
	Dir  string // target directory
	Err  error
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("hfwrite: %s: %s not committed: %v", e.Dir, e.Name, e.Err)
}

// Unwrap returns ErrCommit and the cause.
func (e *CommitError) Unwrap() []error { return []error{ErrCommit, e.Err} }

// CleanStale removes the spool of dir if no live Writer holds it (the
// leftovers of a writer that was killed), and the shard files of a commit
// it had under way, which .metadata does not name (dcpwrite.RemoveStale).
// It reports whether there was a spool to remove.
func CleanStale(dir string) (bool, error) {
	sp := filepath.Join(dir, SpoolDir)
	lock, err := os.Open(sp)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("hfwrite: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // a live writer's
		}
		return false, fmt.Errorf("hfwrite: locking %s: %w", sp, err)
	}
	// A writer killed while a file was being resharded eagerly left shard
	// files that .metadata does not name: remove them first, so that the
	// spool stays as the sign of a dead writer until they are gone.
	if _, err := dcpwrite.RemoveStale(dir); err != nil {
		return false, err
	}
	if err := os.RemoveAll(sp); err != nil {
		return false, fmt.Errorf("hfwrite: removing stale spool: %w", err)
	}
	return true, nil
}
