// Package vfs is the go-fuse node tree of a ckptfs mount: the source tree
// shown read-only, checkpoint directories replaced by their HF views, view
// files, and the .ckptfs stats file. In a writable mount, directories
// created with mkdir are write targets whose files are spooled and
// committed into DCP checkpoints (write.go). Every node shows the owner,
// group and mode of what it is made of, which the kernel checks, and a
// writable mount creates as its caller (attr.go, as.go). It holds no format
// or plan logic; that lives in layout.
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
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/vfs/readpath"
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
	// files: 0 is DefaultMetadataBudget (see metabudget.go).
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
	seed     maphash.Seed

	// Bounds on the open views (see fdBudget): the shard descriptors they may
	// hold, from RLIMIT_NOFILE at mount time, and how many stay open.
	// Set before serving starts (tests lower them).
	fdBudget int
	maxViews int
	metaMax  int64
	// openHook, for tests, is called before a directory is looked at
	// ("detect") and before a checkpoint is opened ("open").
	openHook func(stage, dir string)

	// Lock order: target.mu, then mu; viewEntry.build, then mu.
	mu      sync.Mutex
	views   map[string]*viewEntry // GUARDED_BY(mu); by source.Info.ID of the directory
	lru     list.List             // GUARDED_BY(mu); of *viewInst: the resident views, most recently used first
	openFDs int                   // GUARDED_BY(mu); descriptors the views not yet closed may hold
	meta    int64                 // GUARDED_BY(mu); metadata bytes the views not yet closed hold
	targets map[string]*target    // GUARDED_BY(mu); write targets, by real path
	cleaned map[string]bool       // GUARDED_BY(mu); dirs whose stale spool was looked at
	swept   map[string]bool       // GUARDED_BY(mu); source dirs (rel) sweepStale ran in
	noted   map[string]bool       // GUARDED_BY(mu); source dirs (rel) whose Unrecognised line was logged
	sweeps  sync.WaitGroup        // sweepStale runs; Close waits for them
	closed  bool                  // GUARDED_BY(mu)

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
	f := &FS{opts: opts, log: opts.Logger, root: root, tree: opts.Tree, local: local, views: map[string]*viewEntry{},
		targets: map[string]*target{}, cleaned: map[string]bool{}, swept: map[string]bool{}, noted: map[string]bool{},
		seed: maphash.MakeSeed(), fdBudget: fdBudget(), maxViews: defaultMaxViews, metaMax: opts.metadataBudget(), started: time.Now(),
		detached: make(chan struct{}, maxDetached), objects: DefaultObjects(), errLog: newErrorLog(opts.Logger)}
	if opts.Objects != nil {
		f.objects = *opts.Objects
	}
	if !local {
		f.tree = newOutageTree(opts.Tree, opts.Logger)
	}
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

// Open views are bounded. A checkpoint's view (viewInst: its parsed
// metadata, and the shard files it opens on first read) is opened on first
// use and closed again, least recently used first, when the open views may
// hold more descriptors than fdBudget or number more than maxViews. What
// stays for the life of the mount is the checkpoint's viewEntry: a line
// per view file (listings and the kernel's nodes need no open view) and
// what a re-open is checked against.
//
// Whole views are evicted rather than descriptors alone (opening shard
// files per read, or an LRU of descriptors below the view): that would
// bound descriptors but not the metadata, which can be large; evicting
// views bounds both with one mechanism, and reads keep their open files.
// A view in use is never closed under its user: every handle, read and
// prefill holds a reference (viewInst.refs), residence in the LRU one more,
// and the view closes when the last one goes.

// defaultMaxViews is how many views stay open at most.
const defaultMaxViews = 64

// fdBudget is the share of RLIMIT_NOFILE that open views may hold in shard
// files: half, less a reserve. The rest is for /dev/fuse, the files shown
// as they are (each open holds one), write targets and the cache's disk
// tier. Go raises the soft limit to the hard one at start, so under
// systemd's LimitNOFILE=256 this is 96.
func fdBudget() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	n := int64(min(rl.Cur, 1<<20))
	return int(max(16, (n-64)/2))
}

// errClosed is a view used after the mount was closed.
var errClosed = errors.New("vfs: view closed")

// viewEntry is one checkpoint directory of the source, for the life of the
// mount.
type viewEntry struct {
	dir    string      // the directory's name in the source, for stats and logs
	reader ckpt.Reader // its format, as the lookup that found it detected it

	// build is held while the view is opened, so that one caller opens it
	// and the others wait for that view. Lock order: build, then FS.mu.
	build sync.Mutex

	// Set by the first open that succeeds, under build and FS.mu, and
	// never changed after: read under either, or after FS.view returned.
	shown   bool
	files   []viewFileInfo
	note    string // View.Note
	format  string
	tensors int
	bytes   int64
	digest  uint64       // viewDigest of that view
	sources []*ckpt.File // the files its bytes come from, as then

	err  error     // GUARDED_BY(FS.mu); the view cannot be shown, for good
	inst *viewInst // GUARDED_BY(FS.mu); the open view; nil when there is none
}

// viewFileInfo is a file of a view as listed.
type viewFileInfo struct {
	name    string
	size    int64
	modTime time.Time
	id      uint64 // cache id, the same in every re-open (see reopened)
	access  source.Access
}

// viewInst is one opening of a checkpoint's view.
type viewInst struct {
	e     *viewEntry
	view  *view.View
	files map[string]*view.File
	fds   int   // shard files it may hold open
	meta  int64 // its resident metadata, as opened (View.ResidentBytes)

	// refs counts the users (handles, reads, prefill jobs) plus one while
	// the view is in FS.lru. At 0 the view is closed, and a reference is
	// never taken again (ref).
	refs atomic.Int64
	dead atomic.Bool   // its files are closed (by unref, or FS.Close while in use)
	elem *list.Element // GUARDED_BY(FS.mu); its place in FS.lru, nil when evicted
}

// ref takes a reference unless the view is closed or closing.
func (i *viewInst) ref() bool {
	for {
		n := i.refs.Load()
		if n <= 0 {
			return false
		}
		if i.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// close closes the view's files, once.
func (i *viewInst) close() {
	if i.dead.CompareAndSwap(false, true) {
		i.view.Close()
	}
}

// view returns the entry of the checkpoint in the source directory dir,
// after opening its view once. Paths to one directory (a `latest` symlink
// and the step it names) share one entry, and so one set of cached blocks.
func (f *FS) view(dir string, format ckpt.Reader) *viewEntry {
	key := dir
	if info, err := f.tree.Stat(dir); err == nil && info.ID != "" {
		key = info.ID
	}
	f.mu.Lock()
	e, ok := f.views[key]
	if !ok {
		e = &viewEntry{dir: dir, reader: format}
		f.views[key] = e
	}
	f.mu.Unlock()
	e.build.Lock()
	defer e.build.Unlock()
	if !e.shown && f.viewErr(e) == nil {
		if i, err := f.open(e); err == nil {
			f.unref(i) // it stays in the LRU: its files are about to be read
		}
	}
	return e
}

// viewErr is why e's view cannot be shown, or nil.
func (f *FS) viewErr(e *viewEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return e.err
}

// acquire returns e's open view with a reference for the caller, opening
// it again if it was evicted. e was shown (FS.view).
func (f *FS) acquire(e *viewEntry) (*viewInst, error) {
	if i, err := f.resident(e); i != nil || err != nil {
		return i, err
	}
	e.build.Lock()
	defer e.build.Unlock()
	if i, err := f.resident(e); i != nil || err != nil {
		return i, err
	}
	return f.open(e)
}

// resident returns e's open view with a reference, or e's error, or
// neither when there is no open view.
func (f *FS) resident(e *viewEntry) (*viewInst, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, errClosed
	}
	if e.err != nil {
		f.mu.Unlock()
		return nil, e.err
	}
	i := e.inst
	if i == nil || !i.ref() {
		f.mu.Unlock()
		return nil, nil
	}
	var evicted []*viewInst
	if i.elem == nil {
		// Evicted while in use, and used again: back into the LRU.
		i.refs.Add(1)
		i.elem = f.lru.PushFront(i)
		evicted = f.evictLocked(i)
	} else {
		f.lru.MoveToFront(i.elem)
	}
	f.mu.Unlock()
	f.unrefAll(evicted)
	return i, nil
}

// open opens e's view, with a reference for the caller, and puts it in the
// LRU. The first open that succeeds fills e's listing; a later one must
// give the same view (reopened). Called with e.build held.
func (f *FS) open(e *viewEntry) (*viewInst, error) {
	var read *readFiles // what the first open reads, for the view's owners and modes
	if !e.shown {
		read = &readFiles{}
	}
	v, err := f.openView(e.dir, e.reader, read)
	if err != nil {
		if !e.shown && !isSourceFailing(err) {
			// As before eviction existed: a view that failed stays failed,
			// unless the source failed (an outage), which says nothing of
			// the checkpoint.
			f.mu.Lock()
			e.err = err
			f.mu.Unlock()
		}
		return nil, err
	}
	digest := viewDigest(f.seed, v)
	if e.shown {
		if err := f.reopened(e, v, digest); err != nil {
			v.Close()
			if errors.Is(err, ckpt.ErrSourceChanged) {
				f.log.Error("checkpoint changed since it was shown", "dir", f.tree.Path(e.dir), "err", err)
				f.mu.Lock()
				e.err = err
				f.mu.Unlock()
			}
			return nil, err
		}
	}
	var access []source.Access
	if !e.shown {
		access = f.viewAccess(e.dir, v, read)
	}
	i := &viewInst{e: e, view: v, files: map[string]*view.File{}}
	sources := map[*ckpt.File]bool{}
	for _, vf := range v.Files {
		i.files[vf.Name] = vf
		for _, s := range vf.Sources() {
			sources[s] = true
		}
	}
	i.fds = len(sources)
	i.meta = v.ResidentBytes()
	i.refs.Store(2) // the LRU's and the caller's
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		v.Close()
		return nil, errClosed
	}
	if !e.shown {
		e.shown, e.digest, e.note = true, digest, v.Note
		e.format, e.tensors, e.bytes = string(v.Checkpoint.Format), len(v.Tensors), v.TotalSize()
		for n, vf := range v.Files {
			e.files = append(e.files, viewFileInfo{name: vf.Name, size: vf.Size, modTime: vf.ModTime, id: f.nextID.Add(1),
				access: access[n]})
		}
		for s := range sources {
			e.sources = append(e.sources, s)
		}
	}
	e.inst = i
	f.openFDs += i.fds
	f.meta += i.meta
	i.elem = f.lru.PushFront(i)
	evicted := f.evictLocked(i)
	f.mu.Unlock()
	f.unrefAll(evicted)
	return i, nil
}

// reopened checks that a view opened again after eviction is the one first
// shown: the kernel may hold the first one's sizes and pages, and the block
// cache its blocks under the same ids. It is when what its bytes are made
// of (viewDigest) is the same and none of the files they come from has
// changed since the first open (size, mtime, ctime; an object's ETag): then
// every byte is the same. Anything else is ckpt.ErrSourceChanged, as a
// changed source is for a view that stayed open.
func (f *FS) reopened(e *viewEntry, v *view.View, digest uint64) error {
	if digest != e.digest {
		return fmt.Errorf("%w: %s: the checkpoint was rewritten", ckpt.ErrSourceChanged, f.tree.Path(e.dir))
	}
	for _, s := range e.sources {
		if err := s.CheckFresh(); err != nil {
			return err
		}
	}
	return nil
}

// evictLocked takes the least recently used views but keep out of the LRU
// while the open views may hold more descriptors than the budget, or more
// metadata than metaMax, or are more than maxViews, and returns them for
// unrefAll, which closes those not in use. A view in use closes when its last user is done; until then
// its descriptors still count, and so make room elsewhere.
func (f *FS) evictLocked(keep *viewInst) []*viewInst {
	var out []*viewInst
	fds, n, meta := f.openFDs, f.lru.Len(), f.meta
	for el := f.lru.Back(); el != nil && (fds > f.fdBudget || n > f.maxViews || meta > f.metaMax); {
		prev := el.Prev()
		if i := el.Value.(*viewInst); i != keep {
			f.lru.Remove(el)
			i.elem = nil
			out = append(out, i)
			fds, n, meta = fds-i.fds, n-1, meta-i.meta
		}
		el = prev
	}
	return out
}

func (f *FS) unrefAll(is []*viewInst) {
	for _, i := range is {
		f.unref(i)
	}
}

// unref drops a reference to i, closing its view with the last one.
func (f *FS) unref(i *viewInst) {
	if i.refs.Add(-1) != 0 {
		return
	}
	f.mu.Lock()
	if i.e.inst == i {
		i.e.inst = nil
	}
	f.openFDs -= i.fds
	f.meta -= i.meta
	f.mu.Unlock()
	i.close()
}

// viewDigest sums what a view's bytes are made of besides the bytes of its
// source files: its files' names, sizes and generated bytes (safetensors
// headers, the index), where every chunk lies in the source files, and the
// training arguments a mapping may read. A checkpoint whose metadata was
// rewritten gives another sum, even with its shard files untouched.
func viewDigest(seed maphash.Seed, v *view.View) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var b [8]byte
	num := func(n int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		h.WriteString(s)
	}
	for _, vf := range v.Files {
		str(vf.Name)
		num(int64(vf.Kind))
		num(vf.Size)
		str(vf.Path)
		n := vf.DataOffset()
		if vf.Kind == view.KindGenerated {
			n = vf.Size
		}
		if n > 0 {
			buf := make([]byte, n)
			vf.ReadAt(buf, 0) // in memory: header or generated bytes
			h.Write(buf)
		}
	}
	c := v.Checkpoint
	if c == nil {
		return h.Sum64()
	}
	for _, t := range c.Tensors {
		str(t.Name)
		str(string(t.DType))
		num(int64(len(t.Shape)))
		for _, d := range t.Shape {
			num(d)
		}
		num(int64(len(t.Chunks)))
		for _, ch := range t.Chunks {
			for _, d := range ch.Offsets {
				num(d)
			}
			for _, d := range ch.Sizes {
				num(d)
			}
			switch s := ch.Source.(type) {
			case *ckpt.Section:
				str(s.File.Rel)
				num(s.Offset)
				num(s.Length)
			case nil:
			default:
				str(s.String())
			}
		}
	}
	str(fmt.Sprint(c.Record)) // Megatron args: a map, printed sorted
	return h.Sum64()
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
		if !isSourceFailing(err) { // an outage is logged as it begins and ends
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
	for _, t := range targets {
		if err := t.s.Close(); err != nil {
			f.log.Error("closing write target", "dir", t.s.Path(), "err", err)
		}
	}
	if f.wroot != nil {
		f.sweeps.Wait()
		f.wroot.Close()
	}
	f.mu.Lock()
	var open []*viewInst
	for _, e := range f.views {
		if e.inst != nil {
			open = append(open, e.inst)
		}
	}
	f.mu.Unlock()
	for _, i := range open {
		i.close()
	}
}
