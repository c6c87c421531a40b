// Package viewcache keeps the views of a mount's checkpoints open within
// budgets: a refcounted LRU of open views (View), and for each checkpoint
// an Entry that lives as long as the mount. vfs asks it for a view
// (Cache.Acquire) and gives the reference back (View.Unref); it holds no
// FUSE, format or plan logic (the Opener does the opening).
//
// A checkpoint's view (its parsed metadata, and the shard files it opens on
// first read) is opened on first use and closed again, least recently used
// first, when the open views may hold more shard descriptors than
// Limits.FDs, more resident metadata than Limits.Meta, or number more than
// Limits.Views; the newest view always stays, so one view over a budget
// still opens. What stays for the life of the mount is the Entry: a line
// per view file (listings and the kernel's nodes need no open view) and
// what a re-open is checked against (reopened).
//
// Whole views are evicted rather than descriptors alone (opening shard
// files per read, or an LRU of descriptors below the view): that would
// bound descriptors but not the metadata, which can be large; evicting
// views bounds both with one mechanism, and reads keep their open files.
// A view in use is never closed under its user: every handle, read and
// prefill holds a reference (View.refs), residence in the LRU one more,
// and the view closes when the last one goes.
//
// Lock order: Entry.build, then Cache.mu.
package viewcache

import (
	"errors"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/view"
)

// ErrClosed is a view used after the cache was closed, or read after its
// files were closed.
var ErrClosed = errors.New("viewcache: view closed")

// DefaultMaxViews is how many views stay open at most.
const DefaultMaxViews = 64

// DefaultMetadataBudget is Limits.Meta's default. The open views' indexes
// (chunk offsets, sizes and sources; generated headers) are a mount's
// memory besides the block cache: a checkpoint of hundreds of ranks holds
// tens of MB of them (a 405B model from 512 ranks, 74 MiB, 27 MiB of it
// where each chunk's bytes lie once read, counted from the open), so the
// budget keeps three such views open; with the default block cache a
// mount's Go memory limit (cache + metadata budget + headroom, less a .metadata
// mapped while it is decoded: cmd/ckptfs, internal/memlimit) is then
// 816 MiB, and its peak RSS within 1 GiB.
const DefaultMetadataBudget = 256 << 20

// FDBudget is Limits.FDs's default: the share of RLIMIT_NOFILE that open
// views may hold in shard files, half, less a reserve. The rest is for
// /dev/fuse, the files shown as they are (each open holds one), write
// targets and the cache's disk tier. Go raises the soft limit to the hard
// one at start, so under systemd's LimitNOFILE=256 this is 96.
func FDBudget() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	n := int64(min(rl.Cur, 1<<20))
	return int(max(16, (n-64)/2))
}

// Limits bound the open views; a field of 0 (or less) is its default.
type Limits struct {
	// FDs bounds the shard descriptors they may hold: FDBudget().
	FDs int
	// Views bounds how many stay open: DefaultMaxViews.
	Views int
	// Meta bounds their resident metadata (view.View.ResidentBytes,
	// counted when each opens): DefaultMetadataBudget.
	Meta int64
}

func (l Limits) withDefaults() Limits {
	if l.FDs <= 0 {
		l.FDs = FDBudget()
	}
	if l.Views <= 0 {
		l.Views = DefaultMaxViews
	}
	if l.Meta <= 0 {
		l.Meta = DefaultMetadataBudget
	}
	return l
}

// Opener opens and plans the view of the checkpoint in the source
// directory dir, as format (which its lookup detected; nil detects it).
// For the first open of an entry (first), it also returns the listing the
// entry keeps for the life of the mount: a line per file of v, in the
// order of v.Files. Its errors are the view's: a panic is the Opener's to
// recover.
type Opener func(dir string, format ckpt.Reader, first bool) (v *view.View, files []FileInfo, err error)

// Options configure a Cache.
type Options struct {
	// Open opens a checkpoint's view; required.
	Open Opener
	// Limits bound the open views.
	Limits Limits
	// Transient reports an error of a first open that says nothing of the
	// checkpoint (the source failing, an outage): the view is opened again
	// at its next use instead of failing for good. nil: none is.
	Transient func(error) bool
	// Logger gets the line of a checkpoint that changed since it was shown;
	// nil: slog.Default().
	Logger *slog.Logger
	// Path names a checkpoint directory in errors and log lines; nil: its
	// name in the source.
	Path func(dir string) string
}

// Cache is the open views of one mount.
type Cache struct {
	opts   Options
	limits Limits
	seed   maphash.Seed // of the views' digests

	mu      sync.Mutex
	entries map[string]*Entry // GUARDED_BY(mu); by Show's key
	// lru holds the resident views, each with a reference; it never evicts
	// by itself (evictLocked does).
	lru    *simplelru.LRU[*View, struct{}] // GUARDED_BY(mu)
	fds    int                             // GUARDED_BY(mu); descriptors the views not yet closed may hold
	meta   int64                           // GUARDED_BY(mu); metadata bytes the views not yet closed hold
	closed bool                            // GUARDED_BY(mu)
}

// New returns an empty cache.
func New(o Options) *Cache {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Path == nil {
		o.Path = func(dir string) string { return dir }
	}
	if o.Transient == nil {
		o.Transient = func(error) bool { return false }
	}
	lru, err := simplelru.NewLRU[*View, struct{}](math.MaxInt, nil)
	if err != nil {
		panic(err) // only for a size below 1
	}
	return &Cache{opts: o, limits: o.Limits.withDefaults(), seed: maphash.MakeSeed(),
		entries: map[string]*Entry{}, lru: lru}
}

// Show returns the entry of the checkpoint in the source directory dir,
// after opening its view once. key names the checkpoint: paths to one
// directory (a `latest` symlink and the step it names) given one key share
// one entry, and so one set of cached blocks. The entry's Err says whether
// it can be shown.
func (c *Cache) Show(key, dir string, format ckpt.Reader) *Entry {
	c.mu.Lock()
	e, ok := c.entries[key]
	if !ok {
		e = &Entry{dir: dir, reader: format}
		c.entries[key] = e
	}
	c.mu.Unlock()
	e.build.Lock()
	defer e.build.Unlock()
	if !e.shown && c.Err(e) == nil {
		if v, err := c.open(e); err == nil {
			v.Unref() // it stays in the LRU: its files are about to be read
		}
	}
	return e
}

// Err is why e's view cannot be shown, or nil.
func (c *Cache) Err(e *Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.err
}

// Acquire returns e's open view with a reference for the caller, opening
// it again if it was evicted. e was shown (Show, Err nil).
func (c *Cache) Acquire(e *Entry) (*View, error) {
	if v, err := c.resident(e); v != nil || err != nil {
		return v, err
	}
	e.build.Lock()
	defer e.build.Unlock()
	if v, err := c.resident(e); v != nil || err != nil {
		return v, err
	}
	return c.open(e)
}

// resident returns e's open view with a reference, or e's error, or
// neither when there is no open view.
func (c *Cache) resident(e *Entry) (*View, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if e.err != nil {
		c.mu.Unlock()
		return nil, e.err
	}
	v := e.inst
	if v == nil || !v.Ref() {
		c.mu.Unlock()
		return nil, nil
	}
	var evicted []*View
	if _, ok := c.lru.Get(v); !ok { // Get makes it the most recently used
		// Evicted while in use, and used again: back into the LRU.
		v.refs.Add(1)
		c.lru.Add(v, struct{}{})
		evicted = c.evictLocked()
	}
	c.mu.Unlock()
	unrefAll(evicted)
	return v, nil
}

// open opens e's view, with a reference for the caller, and puts it in the
// LRU. The first open that succeeds fills e's listing; a later one must
// give the same view (reopened). Called with e.build held.
func (c *Cache) open(e *Entry) (*View, error) {
	first := !e.shown
	pv, files, err := c.opts.Open(e.dir, e.reader, first)
	if err != nil {
		if first && !c.opts.Transient(err) {
			// As before eviction existed: a view that failed stays failed,
			// unless the source failed (an outage), which says nothing of
			// the checkpoint.
			c.mu.Lock()
			e.err = err
			c.mu.Unlock()
		}
		return nil, err
	}
	d := digest(c.seed, pv)
	if !first {
		if err := c.reopened(e, d); err != nil {
			pv.Close()
			if errors.Is(err, ckpt.ErrSourceChanged) {
				c.opts.Logger.Error("checkpoint changed since it was shown", "dir", c.opts.Path(e.dir), "err", err)
				c.mu.Lock()
				e.err = err
				c.mu.Unlock()
			}
			return nil, err
		}
	}
	v := &View{c: c, e: e, view: pv, files: map[string]*view.File{}}
	sources := map[*ckpt.File]bool{}
	pv.FindSources() // on several cores; found already where the opener asked
	for _, vf := range pv.Files {
		v.files[vf.Name] = vf
		for _, s := range vf.Sources() {
			sources[s] = true
		}
	}
	v.fds = len(sources)
	v.meta = pv.ResidentBytes()
	v.refs.Store(2) // the LRU's and the caller's
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		pv.Close()
		return nil, ErrClosed
	}
	if first {
		e.shown, e.digest, e.note, e.files = true, d, pv.Note, files
		e.format, e.tensors, e.bytes = string(pv.Checkpoint.Format), len(pv.Tensors), pv.TotalSize()
		for s := range sources {
			e.sources = append(e.sources, s)
		}
	}
	e.inst = v
	c.fds += v.fds
	c.meta += v.meta
	c.lru.Add(v, struct{}{})
	evicted := c.evictLocked()
	c.mu.Unlock()
	unrefAll(evicted)
	return v, nil
}

// evictLocked takes the least recently used views out of the LRU, all but
// the newest, while the open views may hold more descriptors or metadata
// than the limits allow, or are more than Limits.Views, and returns them
// for unrefAll, which closes those not in use. A view in use closes when
// its last user is done; until then its descriptors still count, and so
// make room elsewhere.
func (c *Cache) evictLocked() []*View {
	var out []*View
	fds, meta := c.fds, c.meta
	for c.lru.Len() > 1 && (fds > c.limits.FDs || c.lru.Len() > c.limits.Views || meta > c.limits.Meta) {
		v, _, _ := c.lru.RemoveOldest()
		out = append(out, v)
		fds, meta = fds-v.fds, meta-v.meta
	}
	return out
}

func unrefAll(vs []*View) {
	for _, v := range vs {
		v.Unref()
	}
}

// Close closes the files of every open view, in use or not; the views
// asked for later are ErrClosed.
func (c *Cache) Close() {
	c.mu.Lock()
	c.closed = true
	var open []*View
	for _, e := range c.entries {
		if e.inst != nil {
			open = append(open, e.inst)
		}
	}
	c.mu.Unlock()
	for _, v := range open {
		v.close()
	}
}
