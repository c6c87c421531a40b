// Package hfwrite is the write session of a ckptfs mount, without FUSE: the
// files of a HuggingFace model directory, written one at a time into a
// directory, become a DCP checkpoint, and the directory shows the HF view
// of what is committed so far.
//
// A Session owns one directory. Each file written into it goes to a spool
// file in the hidden SpoolDir beside the checkpoint (on the same disk,
// never in memory) and is committed as a whole (File.Commit):
//
//   - "*.safetensors" (TensorFile): the header is read and validated with
//     the strict rules of safetensors.ReadHeader, checked against a shard
//     index received earlier, and the file is resharded into DCP shard files
//     by dcpwrite, which rewrites .metadata atomically. Usually the file was
//     resharded while it was written (eager.go, over the file's stream:
//     stream.go) and the commit only finishes that: the result is the
//     same.
//   - "*.safetensors.index.json" (IndexFile): parsed and checked against the
//     tensors received; it is not stored, since the view of the checkpoint
//     generates its own index.
//   - any other name (SidecarFile: config.json, tokenizer files, ...):
//     fsynced and renamed into the directory as-is.
//
// A failed commit leaves the committed state as it was and removes the
// spool file; every such error wraps ErrCommit. A tensor file or index that
// is empty when committed is not a file of the model: it is not committed
// (ErrEmpty).
//
// The rules of the directory, as a file system shows them (Session.Create,
// Open, Remove, Rename, Truncate, Entries):
//
//   - A name being written is busy (ErrBusy) for another writer, a rename
//     onto it, and a rewrite; a new file shows under its name while it is
//     written, shadowing anything else of that name. A file has one handle
//     open for writing at a time (File.Open); readers are not writers.
//   - Names longer than NAME_MAX are refused where they are created
//     (CheckName: ENAMETOOLONG), not when the commit needs them.
//   - A file is committed at the first Flush of a handle that wrote to it
//     (close(2), which returns the result), or, if no handle that wrote was
//     flushed (a file only created or truncated), at the last Release; a
//     file no handle changed is dropped then.
//   - A file being written that is renamed when it holds a whole safetensors
//     file is committed then, so that rename(2) reports a failure
//     (safetensors' save_file never checks close). A stored file renamed to
//     a tensor or index name is committed as such a file.
//   - Stored files can be rewritten (the spool starts as a copy unless
//     truncated), renamed and removed. What is committed from tensor files
//     cannot be (ErrCommitted); only a file being written changes size
//     (ErrReadOnly). The checkpoint's own names are refused (ErrReserved).
//   - The view of what is committed (View) is built once per change, by
//     the session, from the metadata its last commit wrote, and closed when
//     the last reader of it lets go.
//
// Every file of the directory is created, renamed, removed and locked
// through its source.Dir (os.Root): no name leads out of it. Spool files of
// a session that died, and the shard files its commit under way left, are
// removed by CleanStale, unless a live session holds the spool's lock.
package hfwrite

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

// SpoolDir is the hidden directory, inside a session's directory, that holds
// the files being written.
const SpoolDir = ".ckptfs-spool"

var (
	// ErrCommit is wrapped by every error of a commit: the file was not
	// committed and the checkpoint is as it was before.
	ErrCommit = errors.New("hfwrite: file not committed")
	// ErrIndex is wrapped when a shard index and the tensors received
	// disagree.
	ErrIndex = errors.New("hfwrite: shard index does not match the tensors received")
	// ErrEmpty is wrapped when a tensor file or an index is empty when it is
	// committed (touch, `: >`): there is nothing to commit.
	ErrEmpty = errors.New("hfwrite: empty file: nothing to commit")
	// ErrReserved is returned for names the checkpoint itself uses
	// (.metadata, *.distcp, the spool): writing them would corrupt it.
	ErrReserved = errors.New("hfwrite: name is reserved for the checkpoint's own files")
	// ErrDone is returned by reads and writes of a File that was committed
	// or dropped.
	ErrDone = errors.New("hfwrite: file already committed or dropped")
	// ErrBusy is returned for a name being written.
	ErrBusy = errors.New("hfwrite: file is being written")
	// ErrCommitted is returned for removing or renaming what was committed
	// from tensor files.
	ErrCommitted = errors.New("hfwrite: committed tensors cannot be removed or renamed")
	// ErrReadOnly is returned for changing the size of a file that is not
	// being written.
	ErrReadOnly = errors.New("hfwrite: only a file being written can change")
	// ErrStale is returned for opening a file that was committed or dropped
	// meanwhile, or a view that a later change replaced: look it up again.
	ErrStale = errors.New("hfwrite: file was replaced; look it up again")
)

// Options configure a Session.
type Options struct {
	// Target is the layout of the DCP checkpoint written.
	Target dcpwrite.Target
	// Tree is the directory as its view reads it (a mount passes its own
	// tree's, so that the view is confined as every other); nil: the
	// directory alone.
	Tree source.Tree
	// Plan shapes the view of what is committed.
	Plan view.Options
	// OnCommit, when set, is told the outcome of every commit of a file,
	// whoever started it (a flush, the last release, a rename): the one
	// place to count and log them.
	OnCommit func(Report)
	// Limits bounds what the session holds at once, together with every
	// session sharing them; nil: NewLimits, the session's own.
	Limits *Limits
}

// Report is the outcome of a commit, for Options.OnCommit.
type Report struct {
	// Path is the file's path in the directory.
	Path string
	// Size is its size in bytes.
	Size int64
	// Started is when its writing started; Took how long the commit took.
	Started time.Time
	Took    time.Duration
	// Eager is set when the file was resharded while it was written.
	Eager bool
	// Err is nil when it was committed, else it wraps ErrCommit.
	Err error
}

// Session is one directory being written into. Its methods are safe for
// concurrent use; commits are serialized.
type Session struct {
	dir  *dcpwrite.Dir
	root *source.Dir // the directory: every file of it is created, renamed and removed through it
	path string
	opts Options

	// Lock order: commitMu, then viewMu, then mu, then a File's locks
	// (File.mu is never held while taking mu).
	commitMu sync.Mutex
	received map[string]string // GUARDED_BY(commitMu): tensor name → file it was committed from
	index    map[string]string // GUARDED_BY(commitMu): weight_map of the last index, nil if none
	indexOf  string            // GUARDED_BY(commitMu): name of that index file

	viewMu sync.Mutex
	view   *View  // GUARDED_BY(viewMu): the current view, nil until built
	views  uint64 // GUARDED_BY(viewMu): views built

	mu      sync.Mutex
	lock    *source.Lock     // GUARDED_BY(mu): the spool's, held while it exists; nil until the first file
	seq     uint64           // GUARDED_BY(mu): files started
	writing map[string]*File // GUARDED_BY(mu): files being written, by name
	gen     uint64           // GUARDED_BY(mu): changes of the directory's content
	tensors int              // GUARDED_BY(mu): tensors in the committed checkpoint
	closed  bool             // GUARDED_BY(mu)
}

// CreateIn opens the directory root, opened already (created through its
// parent's Dir, so that no name leads it out), as a DCP directory to write
// into. Leftovers of an earlier session that died are removed: its spool
// (CleanStale) and the shard files its .metadata does not name
// (dcpwrite.Open). It takes root: the session closes it, and CreateIn does
// when it fails.
func CreateIn(root *source.Dir, opts Options) (*Session, error) {
	if opts.Limits == nil {
		opts.Limits = NewLimits()
	}
	d, err := dcpwrite.Open(root, opts.Target, opts.Limits.reshard)
	if err != nil {
		return nil, err
	}
	if _, err := CleanStale(d.Root()); err != nil {
		d.Close()
		return nil, err
	}
	return &Session{
		dir: d, root: d.Root(), path: d.Path(), opts: opts,
		received: map[string]string{}, writing: map[string]*File{}, tensors: len(d.Committed()),
	}, nil
}

// Path is the directory.
func (s *Session) Path() string { return s.path }

// Generation counts the changes of the directory's content (commits,
// stored files removed or renamed).
func (s *Session) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Tensors is the number of tensors in the committed checkpoint.
func (s *Session) Tensors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tensors
}

// Create starts writing a new file name (a single path component), shown
// under its name until it is committed, and returns its first handle.
// Nothing of it is in the directory until its commit.
func (s *Session) Create(name string) (*Handle, error) { return s.start(name, true) }

// Open starts rewriting the existing file name: a stored file's spool
// starts as a copy of it unless trunc, a tensor file's starts empty. The
// name goes on showing what it shows until the file is committed.
func (s *Session) Open(name string, trunc bool) (*Handle, error) {
	h, err := s.start(name, false)
	if err != nil {
		return nil, err
	}
	if f := h.File(); !trunc && f.Kind() == SidecarFile {
		if err := copyStored(f, s.root, name); err != nil {
			f.Abort()
			return nil, fmt.Errorf("hfwrite: %s: %w", name, err)
		}
	}
	return h.opened(trunc)
}

func copyStored(dst *File, root *source.Dir, name string) error {
	in, err := root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.Close()
	_, err = io.Copy(io.NewOffsetWriter(spoolWriter{dst}, 0), in)
	return err
}

// start registers a new file being written under name, and returns its
// first handle, its writer: counted before the file shows, so that no other
// open can become its writer first.
func (s *Session) start(name string, created bool) (*Handle, error) {
	kind, err := KindOf(name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, fmt.Errorf("hfwrite: %s: session closed", s.path)
	case s.writing[name] != nil:
		return nil, fmt.Errorf("%w: %s", ErrBusy, name)
	}
	if s.lock == nil {
		if err := s.root.Mkdir(SpoolDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("hfwrite: %w", err)
		}
		// Held for the session's life: CleanStale leaves a locked spool alone.
		lock, err := s.root.TryLock(SpoolDir)
		if err != nil {
			return nil, fmt.Errorf("hfwrite: spool of another writer: %w", err)
		}
		s.lock = lock
	}
	s.seq++
	sp := path.Join(SpoolDir, strconv.FormatUint(s.seq, 10)+".part")
	// The spool dir is private (0700); the mode is the one a stored sidecar keeps.
	fd, err := s.root.Create(sp, 0o644)
	if err != nil {
		return nil, fmt.Errorf("hfwrite: spooling %s: %w", name, err)
	}
	f := &File{s: s, seq: s.seq, spool: sp, started: time.Now(), listed: created,
		name: name, kind: kind, f: fd, changed: created, stream: newStream(fd, s.opts.Limits), handles: 1}
	h := &Handle{f: f, write: true}
	f.writer = h
	if kind != IndexFile {
		// Also under another name: safetensors' save_file writes a temp
		// file (.tmpXXXXXX) and renames it when complete. The attempt gives
		// up at once on content that is not safetensors.
		f.startEager()
	}
	s.writing[name] = f
	return h, nil
}

// forget removes f from the files being written as it is finished (its
// name no longer changes then), before it is done.
func (s *Session) forget(f *File, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writing[name] == f {
		delete(s.writing, name)
	}
}

// Close drops the files still being written, removes the spool, and lets
// go of the view. Committed files stay.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	files := make([]*File, 0, len(s.writing))
	for _, f := range s.writing {
		files = append(files, f)
	}
	s.mu.Unlock()
	for _, f := range files {
		f.Abort()
	}
	s.viewMu.Lock()
	s.view.Release()
	s.view = nil
	s.viewMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.dir.Close()
	if s.lock == nil {
		return nil
	}
	err := s.root.RemoveAll(SpoolDir)
	s.lock.Release()
	s.lock = nil
	return err
}

// Pending returns the tensor names of the last shard index that no
// committed file has delivered yet, sorted; nil without an index.
func (s *Session) Pending() []string {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	var out []string
	for n := range s.index {
		if _, ok := s.received[n]; !ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// CleanStale removes what a session that died left in the directory root:
// its spool, unless a live session holds its lock, and first the shard
// files its .metadata does not name (dcpwrite.RemoveStale), so that the
// spool stays the sign of a dead session until they are gone. It reports
// whether there was such a spool.
func CleanStale(root *source.Dir) (bool, error) {
	removed, err := root.SweepStale(SpoolDir, func() error {
		if _, err := dcpwrite.RemoveStale(root); err != nil {
			return err
		}
		return root.RemoveAll(SpoolDir)
	})
	if err != nil {
		return false, fmt.Errorf("hfwrite: removing stale spool: %w", err)
	}
	return removed, nil
}
