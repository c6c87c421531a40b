// Package vfs is the go-fuse node tree of a ckptfs mount: the source tree
// shown read-only, checkpoint directories replaced by their HF views, view
// files, and the .ckptfs stats file. In a writable mount, directories
// created with mkdir are write targets whose files are spooled and
// committed into DCP checkpoints (write.go). Every node shows the owner,
// group and mode of what it is made of, which the kernel checks, and a
// writable mount creates as its caller (attr.go, as.go). It holds no format
// or plan logic; that lives in layout. The checkpoints' open views, their
// budgets and eviction live in package viewcache, which vfs asks for a view
// at each open of a view file.
//
// How a read of a view file flows. The kernel keeps a view file's pages
// (views never change: opens are KEEP_CACHE) and reads ahead of a reader
// up to the mount's read_ahead_kb, with up to 64 requests in the
// background (mount.go). Each READ reaches viewHandle.Read, which hands it
// to package readpath: it decides, once per mount from the source, whether
// bytes go straight from the shards into the reply (a local source) or
// through the block cache (an object store, --direct-reads=false), and
// owns the reply, the read's deadline and interrupt, and prefill. vfs
// counts the bytes and errors and maps the error to an errno (errno.go).
package vfs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/internal/memlimit"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/vfs/readpath"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// Options configure a ckptfs tree.
type Options struct {
	// Tree is the source shown at the mount root (see open.Open): a local
	// directory, or any other tree (an object store prefix), read-only.
	// The caller closes it after the FS.
	Tree source.Tree
	// Plan shapes every view.
	Plan view.Options
	// Cache serves view file bytes; required.
	Cache *cache.Cache
	// Logger gets one line per real problem; nil = slog.Default().
	Logger *slog.Logger
	// Prefill streams view files into the kernel page cache once a loader
	// starts reading their tensors (see readpath/prefill.go).
	Prefill bool
	// DirectReads serves the view files of a local source by reading their
	// bytes straight into each reply instead of through Cache (see package
	// readpath). A remote source is always read through Cache.
	DirectReads bool
	// ReadDeadline bounds each read served through Cache (a remote
	// source's): past it the read fails with EIO, while the fills it waited
	// for go on for the reads that follow; 0 leaves reads to the source's
	// own bounds. Reads also end at a FUSE INTERRUPT, with EINTR.
	ReadDeadline time.Duration
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
	// Objects is what a source that keeps no owners (an object store)
	// shows; nil: DefaultObjects. A local source shows its own (attr.go).
	Objects *Objects
	// StatsMode is the permission bits of .ckptfs, owned by the mounter;
	// 0: 0400, the mounter's alone (it names every checkpoint opened).
	StatsMode fs.FileMode
	// CommitObserver, when set, is called after every commit of a written
	// file with how long it took and its error: the commit-duration
	// histogram of the metrics endpoint.
	CommitObserver func(took time.Duration, err error)
	// MetadataBudget bounds the resident metadata of the open views
	// (view.View.ResidentBytes), as the descriptor budget bounds their
	// files: 0 is viewcache.DefaultMetadataBudget.
	MetadataBudget int64
}

// FS is the state shared by all nodes of one mount.
type FS struct {
	opts  Options
	log   *slog.Logger
	root  string      // the source's local directory, or its Path(".")
	tree  source.Tree // the source, confined: every read goes through it
	local bool        // root is a local directory (statfs, writes)
	wroot *source.Dir // root, for writes: nil unless Options.Writable; owned
	// limits bound what all write targets of the mount hold at once (the
	// mount's, not the process's: two mounts in one process do not share
	// them); nil unless Options.Writable.
	limits *hfwrite.Limits
	// errLog takes the lines of the errors a reader can repeat at will;
	// tree is an outageTree unless the source is local.
	errLog *errorLog
	// mountpoint is where the tree is mounted, set before serving starts.
	// When it lies inside the source it is hidden: stat'ing it would make
	// the server wait on itself.
	mountpoint string

	nextID atomic.Uint64
	reads  *readpath.Path // how view file bytes reach a reply
	// detached holds a token for each source call left running at an
	// INTERRUPT (interruptibly), at most maxDetached.
	detached chan struct{}
	// views are the checkpoints' views, open within their budgets. Set
	// before serving starts (tests lower the budgets).
	views *viewcache.Cache
	// openHook, for tests, is called before a directory is looked at
	// ("detect") and before a checkpoint is opened ("open").
	openHook func(stage, dir string)

	// Lock order: target.mu, then mu.
	mu      sync.Mutex
	targets map[string]*target // GUARDED_BY(mu); write targets, by real path
	cleaned map[string]bool    // GUARDED_BY(mu); dirs whose stale spool was looked at
	swept   map[string]bool    // GUARDED_BY(mu); source dirs (rel) sweepStale ran in
	noted   map[string]bool    // GUARDED_BY(mu); source dirs (rel) whose Unrecognised line was logged
	sweeps  sync.WaitGroup     // sweepStale runs; Close waits for them
	closed  bool               // GUARDED_BY(mu)

	// objects is Options.Objects or its default; rootAccess is what the
	// mount root shows (attr.go).
	objects    Objects
	rootAccess source.Access

	// started is the mount root's mtime: the root never touches the source
	// (see Dir.Getattr).
	started time.Time

	bytesServed  atomic.Int64
	passServed   atomic.Int64
	readErrors   atomic.Int64
	lookupErrors atomic.Int64 // see sourceErrno
	commits      atomic.Int64
	commitErrors atomic.Int64
}

// New returns the shared state of a mount of opts.Tree.
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
	if opts.Tree == nil {
		return nil, errors.New("vfs: Options.Tree is required")
	}
	root, local := source.OnDisk(opts.Tree)
	if !local {
		root = opts.Tree.Path(".")
	}
	// Written checkpoints are committed with local renames and fsyncs.
	if opts.Writable && !local {
		return nil, fmt.Errorf("vfs: %s: a writable mount needs a local directory", root)
	}
	f := newState(opts, root, local)
	if local {
		info, err := opts.Tree.Stat(".")
		if err != nil {
			return nil, err
		}
		f.rootAccess = info.Access
	}
	f.rootAccess = f.known(f.rootAccess, true)
	if opts.Writable {
		var err error
		if f.wroot, err = source.OpenDir(root); err != nil {
			return nil, err
		}
		f.limits = hfwrite.NewLimits()
	}
	return f, nil
}

func newState(opts Options, root string, local bool) *FS {
	f := &FS{opts: opts, log: opts.Logger, root: root, tree: opts.Tree, local: local,
		targets: map[string]*target{}, cleaned: map[string]bool{}, swept: map[string]bool{}, noted: map[string]bool{},
		started: time.Now(), detached: make(chan struct{}, maxDetached), objects: DefaultObjects(), errLog: newErrorLog(opts.Logger)}
	if opts.Objects != nil {
		f.objects = *opts.Objects
	}
	if !local {
		f.tree = newOutageTree(opts.Tree, opts.Logger)
	}
	f.views = f.newViews(viewcache.Limits{Meta: opts.MetadataBudget})
	f.reads = readpath.New(readpath.Options{Cache: opts.Cache, Local: local, DirectReads: opts.DirectReads,
		ReadDeadline: opts.ReadDeadline, Prefill: opts.Prefill, Logger: opts.Logger})
	return f
}

// Root returns the root directory node.
func (f *FS) Root() *Dir {
	if !f.local {
		return &Dir{fsys: f}
	}
	return &Dir{fsys: f, real: f.root}
}

// detect returns the format of the checkpoint in the source directory dir.
// A format's Detect that panics makes dir a checkpoint that cannot be shown
// (err), not a crash of the mount. A source that fails while the formats
// look (a store that does not answer) is failed: then nothing is known of
// dir, and the caller reports the failure.
func (f *FS) detect(dir string) (format ckpt.Reader, ok bool, err, failed error) {
	defer func() {
		if r := recover(); r != nil {
			format, ok, err = nil, true, f.internalError("detect "+f.tree.Path(dir), r)
			f.log.Error("checkpoint cannot be shown", "dir", f.tree.Path(dir), "err", err)
		}
	}()
	if f.openHook != nil {
		f.openHook("detect", dir)
	}
	sub, err := source.Sub(f.tree, dir)
	if err != nil {
		return nil, false, nil, nil
	}
	tree := &stopAtFailure{Tree: sub}
	format, ok = layout.Detect(tree)
	if tree.failed != nil {
		return nil, false, nil, tree.failed
	}
	return format, ok, nil, nil
}

// stopAtFailure is a tree that, once a call failed (source.IsFailure),
// fails every later call with that error at once: each
// format's Detect asks for a few names and takes a failure for "not mine",
// so against a store that does not answer, a lookup would otherwise wait
// out the store's retry budget once per format.
type stopAtFailure struct {
	source.Tree
	failed error
}

func (t *stopAtFailure) check(err error) error {
	if source.IsFailure(err) && t.failed == nil {
		t.failed = err
	}
	return err
}

func (t *stopAtFailure) Open(name string) (source.File, error) {
	if t.failed != nil {
		return nil, t.failed
	}
	f, err := t.Tree.Open(name)
	return f, t.check(err)
}

func (t *stopAtFailure) Stat(name string) (source.Info, error) {
	if t.failed != nil {
		return source.Info{}, t.failed
	}
	info, err := t.Tree.Stat(name)
	return info, t.check(err)
}

func (t *stopAtFailure) ReadDir(name string) ([]source.Info, error) {
	if t.failed != nil {
		return nil, t.failed
	}
	ents, err := t.Tree.ReadDir(name)
	return ents, t.check(err)
}

// internalError turns a recovered panic into the error of the one thing
// that failed (a view, a read); the rest of the mount goes on. The stack
// goes to the debug log; the caller logs the one error line.
func (f *FS) internalError(what string, r any) error {
	err := fmt.Errorf("internal error: %v", r)
	f.log.Debug(what, "err", err, "stack", string(debug.Stack()))
	return err
}

// view returns the entry of the checkpoint in the source directory dir,
// after opening its view once (viewcache.Cache.Show). Paths to one
// directory (a `latest` symlink and the step it names) share one entry,
// and so one set of cached blocks.
func (f *FS) view(dir string, format ckpt.Reader) *viewcache.Entry {
	key := dir
	if info, err := f.tree.Stat(dir); err == nil && info.ID != "" {
		key = info.ID
	}
	return f.views.Show(key, dir, format)
}

// newViews returns the cache of the mount's open views, within l.
func (f *FS) newViews(l viewcache.Limits) *viewcache.Cache {
	return viewcache.New(viewcache.Options{Open: f.openCheckpoint, Limits: l, Transient: isSourceFailing,
		Logger: f.log, Path: f.tree.Path})
}

// openCheckpoint opens the view of a checkpoint of the source for the
// cache (viewcache.Opener). The first open records the files its reader
// opens, for what the view's files show (attr.go), and gives each file its
// cache id.
func (f *FS) openCheckpoint(dir string, format ckpt.Reader, first bool) (*view.View, []viewcache.FileInfo, error) {
	defer memlimit.Opening()()
	var read *readFiles
	if first {
		read = &readFiles{}
	}
	v, err := f.openView(dir, format, read)
	if err != nil || !first {
		return v, nil, err
	}
	v.FindSources() // on several cores, for viewAccess and the cache
	access := f.viewAccess(dir, v, read)
	files := make([]viewcache.FileInfo, len(v.Files))
	for n, vf := range v.Files {
		files[n] = viewcache.FileInfo{Name: vf.Name, Size: vf.Size, ModTime: vf.ModTime, ID: f.nextID.Add(1), Access: access[n]}
	}
	return v, files, nil
}

// openView opens the checkpoint in the source directory dir and plans its
// view: for a checkpoint of the source (as format, which its lookup
// detected; nil detects it), and for a write target after each change. A
// view that leaves out tensors which are not optimizer state gets
// one log line: a loader would get them freshly initialised.
//
// A panic while opening (a format reader meeting input it did not expect)
// is this view's error, "internal error: ...", not the end of the mount.
//
// read, when set, records the files the reader opens (attr.go).
func (f *FS) openView(dir string, format ckpt.Reader, read *readFiles) (v *view.View, err error) {
	var c *layout.Checkpoint
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, f.internalError("open "+f.tree.Path(dir), r)
			f.log.Error("checkpoint cannot be shown", "dir", f.tree.Path(dir), "err", err)
			if c != nil {
				c.Close()
			}
		}
	}()
	if f.openHook != nil {
		f.openHook("open", dir)
	}
	sub, err := source.Sub(f.tree, dir)
	if err == nil {
		c, err = layout.OpenAsWith(format, read.tree(sub), view.OpenOptions(f.opts.Plan))
	}
	if err == nil {
		v, err = view.Plan(c, f.opts.Plan)
		if err != nil {
			c.Close()
		}
	}
	read.stop()
	if err != nil {
		if !inOutage(err) { // an outage is logged as it begins and ends
			f.log.Error("checkpoint cannot be shown", "dir", f.tree.Path(dir), "err", err)
		}
		return nil, err
	}
	for _, w := range v.Warnings {
		f.log.Warn(w, "dir", f.tree.Path(dir))
	}
	if left := v.LeavesOutWeights(); len(left) > 0 {
		f.log.Warn("view leaves out tensors that are not optimizer state (ckptfs inspect lists them)",
			"dir", f.tree.Path(dir), "count", len(left), "first", left[0].Name, "reason", left[0].Reason)
	}
	return v, nil
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

// Close releases the shard files of every opened checkpoint, in use or
// not, and ends the write targets' sessions: files still being written are
// dropped, spools removed.
func (f *FS) Close() {
	f.reads.Close()
	f.mu.Lock()
	f.closed = true
	targets := f.targets
	f.targets = map[string]*target{}
	f.mu.Unlock()
	f.views.Close()
	for _, t := range targets {
		if err := t.s.Close(); err != nil {
			f.log.Error("closing write target", "dir", t.s.Path(), "err", err)
		}
	}
	if f.wroot != nil {
		f.sweeps.Wait()
		f.wroot.Close()
	}
}
