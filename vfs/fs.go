// Package vfs is the go-fuse node tree of a ckptfs mount: the source tree
// shown read-only, checkpoint directories replaced by their HF views, view
// files served through the block cache, and the .ckptfs stats file. In a
// writable mount, directories created with mkdir are write targets whose
// files are spooled and committed into DCP checkpoints (write.go). It holds
// no format or plan logic; that lives in layout.
package vfs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/source"
)

// Options configure a ckptfs tree.
type Options struct {
	// Source is the local directory shown at the mount root.
	Source string
	// Tree, when set, is shown instead of Source: any source tree (an
	// object store prefix), read-only. The caller closes it after the FS.
	Tree source.Tree
	// Plan shapes every view.
	Plan layout.PlanOptions
	// Cache serves view file bytes; required.
	Cache *cache.Cache
	// Logger gets one line per real problem; nil = slog.Default().
	Logger *slog.Logger
	// Prefill streams view files into the kernel page cache once a loader
	// starts reading their tensors (see prefill.go).
	Prefill bool
	// DirectReads serves the view files of a local source by reading their
	// bytes straight into each reply instead of through Cache (see
	// viewHandle.Read). A remote source is always read through Cache.
	DirectReads bool
	// ViewTimeout is how long the kernel may cache view entries and attrs
	// (views are immutable). Other entries use a short timeout so new
	// checkpoints show up promptly.
	ViewTimeout time.Duration
	// Writable makes the mount read-write: mkdir creates a directory in the
	// source, and HF files written into it become a DCP checkpoint laid out
	// by Target. Existing checkpoints stay read-only.
	Writable bool
	// Target is the layout written into new directories.
	Target dcpwrite.Target
	// CommitObserver, when set, is called after every commit of a written
	// file with how long it took and its error: the commit-duration
	// histogram of the metrics endpoint.
	CommitObserver func(took time.Duration, err error)
}

// FS is the state shared by all nodes of one mount.
type FS struct {
	opts  Options
	log   *slog.Logger
	root  string        // cleaned absolute source path, or the tree's Path(".")
	tree  source.Tree   // the source, confined: every read goes through it
	local *source.Local // tree when it is a local directory (statfs, writes); owned
	// mountpoint is where the tree is mounted, set before serving starts.
	// When it lies inside the source it is hidden: stat'ing it would make
	// the server wait on itself.
	mountpoint string

	nextID  atomic.Uint64
	prefill *prefiller // nil unless Options.Prefill
	direct  bool       // Options.DirectReads, over a local source

	// Lock order: target.mu, then mu.
	mu      sync.Mutex
	views   map[string]*viewEntry // GUARDED_BY(mu); by source.Info.ID of the directory
	targets map[string]*target    // GUARDED_BY(mu); write targets, by real path
	cleaned map[string]bool       // GUARDED_BY(mu); dirs whose stale spool was looked at
	closed  bool                  // GUARDED_BY(mu)

	bytesServed  atomic.Int64
	passServed   atomic.Int64
	readErrors   atomic.Int64
	commits      atomic.Int64
	commitErrors atomic.Int64
}

// viewEntry is the view of one checkpoint directory, built once on first use.
type viewEntry struct {
	once  sync.Once
	dir   string // the directory's name in the source, for stats and logs
	view  *layout.View
	ids   map[string]uint64 // view file name → cache id
	err   error
	built time.Time
}

// New returns the shared state of a mount of opts.Source.
func New(opts Options) (*FS, error) {
	if opts.Cache == nil {
		return nil, errors.New("vfs: Options.Cache is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ViewTimeout == 0 {
		opts.ViewTimeout = time.Hour
	}
	if opts.Tree != nil {
		// Written checkpoints are committed with local renames and fsyncs.
		if opts.Writable {
			return nil, fmt.Errorf("vfs: %s: a writable mount needs a local directory", opts.Tree.Path("."))
		}
		return newState(opts, opts.Tree.Path("."), opts.Tree, nil), nil
	}
	root, err := filepath.Abs(opts.Source)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, &fs.PathError{Op: "mount", Path: root, Err: syscall.ENOTDIR}
	}
	tree, err := source.OpenLocal(root)
	if err != nil {
		return nil, err
	}
	return newState(opts, root, tree, tree), nil
}

func newState(opts Options, root string, tree source.Tree, local *source.Local) *FS {
	f := &FS{opts: opts, log: opts.Logger, root: root, tree: tree, local: local, views: map[string]*viewEntry{},
		targets: map[string]*target{}, cleaned: map[string]bool{}, direct: opts.DirectReads && local != nil}
	if opts.Prefill {
		f.prefill = newPrefiller(f)
	}
	return f
}

// Root returns the root directory node.
func (f *FS) Root() *Dir {
	if f.local == nil {
		return &Dir{fsys: f}
	}
	return &Dir{fsys: f, real: f.root}
}

// detect returns the format of the checkpoint in the source directory dir.
func (f *FS) detect(dir string) (ckpt.Reader, bool) {
	sub, err := source.Sub(f.tree, dir)
	if err != nil {
		return nil, false
	}
	return layout.Detect(sub)
}

// view returns the view of the checkpoint in the source directory dir,
// opening it on first use. Paths to one directory (a `latest` symlink and
// the step it names) share one view, and so one set of cached blocks.
func (f *FS) view(dir string) *viewEntry {
	key := dir
	if info, err := f.tree.Stat(dir); err == nil && info.ID != "" {
		key = info.ID
	}
	f.mu.Lock()
	e, ok := f.views[key]
	if !ok {
		e = &viewEntry{dir: dir}
		f.views[key] = e
	}
	f.mu.Unlock()
	e.once.Do(func() { f.build(e, dir) })
	return e
}

// build opens the checkpoint in the source directory dir and plans its
// view into e.
func (f *FS) build(e *viewEntry, dir string) {
	e.dir = dir
	e.view, e.err = f.openView(dir)
	if e.err != nil {
		return
	}
	e.ids = map[string]uint64{}
	for _, vf := range e.view.Files {
		e.ids[vf.Name] = f.nextID.Add(1)
	}
	e.built = time.Now()
}

// openView opens the checkpoint in the source directory dir and plans its
// view: for a checkpoint of the source, and for a write target after each
// change. A view that leaves out tensors which are not optimizer state gets
// one log line: a loader would get them freshly initialised.
func (f *FS) openView(dir string) (*layout.View, error) {
	sub, err := source.Sub(f.tree, dir)
	var c *layout.Checkpoint
	if err == nil {
		c, err = layout.OpenTree(sub)
	}
	var view *layout.View
	if err == nil {
		view, err = layout.Plan(c, f.opts.Plan)
		if err != nil {
			c.Close()
		}
	}
	if err != nil {
		f.log.Error("checkpoint cannot be shown", "dir", f.tree.Path(dir), "err", err)
		return nil, err
	}
	for _, w := range view.Warnings {
		f.log.Warn(w, "dir", f.tree.Path(dir))
	}
	if left := view.LeavesOutWeights(); len(left) > 0 {
		f.log.Warn("view leaves out tensors that are not optimizer state (ckptfs inspect lists them)",
			"dir", f.tree.Path(dir), "count", len(left), "first", left[0].Name, "reason", left[0].Reason)
	}
	return view, nil
}

// inode derives a stable inode number from the path inside the mount, so
// numbers survive the kernel forgetting and re-looking-up a node.
func inode(rel string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(rel))
	ino := h.Sum64()
	if ino <= 1 {
		ino += 2 // 1 is the root
	}
	return ino
}

// Close releases the shard files of every opened checkpoint and ends the
// write targets' sessions: files still being written are dropped, spools
// removed.
func (f *FS) Close() {
	if f.prefill != nil {
		f.prefill.stop()
	}
	f.mu.Lock()
	f.closed = true
	targets := f.targets
	f.targets = map[string]*target{}
	f.mu.Unlock()
	for _, t := range targets {
		if err := t.s.Close(); err != nil {
			f.log.Error("closing write target", "dir", t.s.Path(), "err", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.views {
		if e.view != nil {
			e.view.Close()
		}
	}
	if f.local != nil {
		f.local.Close()
	}
}
