package viewcache

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

// Entry is one checkpoint directory of the source, for the life of the
// cache.
type Entry struct {
	dir    string      // the directory's name in the source, for stats and logs
	reader ckpt.Reader // its format, as the lookup that found it detected it

	// build is held while the view is opened, so that one caller opens it
	// and the others wait for that view. Lock order: build, then Cache.mu.
	build sync.Mutex

	// Set by the first open that succeeds, under build and Cache.mu, and
	// never changed after: read under either, or after Show returned.
	shown   bool
	files   []FileInfo
	note    string // View.Note
	format  string
	tensors int
	bytes   int64
	digest  uint64       // digest of that view
	sources []*ckpt.File // the files its bytes come from, as then

	err  error // GUARDED_BY(Cache.mu); the view cannot be shown, for good
	inst *View // GUARDED_BY(Cache.mu); the open view; nil when there is none
}

// Dir is the checkpoint's directory in the source.
func (e *Entry) Dir() string { return e.dir }

// Note is the first shown view's view.View.Note: set when it has no model
// to show. Read after Show.
func (e *Entry) Note() string { return e.note }

// Files lists the first shown view's files; the caller does not change
// it. Read after Show.
func (e *Entry) Files() []FileInfo { return e.files }

// FileInfo is a file of a view as listed.
type FileInfo struct {
	Name    string
	Size    int64
	ModTime time.Time
	ID      uint64        // cache id, the same in every re-open (see reopened)
	Access  source.Access // what it shows
}

// View is one opening of a checkpoint's view.
type View struct {
	c     *Cache
	e     *Entry
	view  *view.View
	files map[string]*view.File
	fds   int   // shard files it may hold open
	meta  int64 // its resident metadata, as opened (View.ResidentBytes)

	// refs counts the users (handles, reads, prefill jobs) plus one while
	// the view is in Cache.lru. At 0 the view is closed, and a reference is
	// never taken again (Ref).
	refs atomic.Int64
	dead atomic.Bool // its files are closed (by Unref, or Cache.Close while in use)
}

// File is the view's file of that name, or nil.
func (v *View) File(name string) *view.File { return v.files[name] }

// Ref takes another reference unless the view is closed or closing.
func (v *View) Ref() bool {
	for {
		n := v.refs.Load()
		if n <= 0 {
			return false
		}
		if v.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Unref drops a reference, closing the view with the last one.
func (v *View) Unref() {
	if v.refs.Add(-1) != 0 {
		return
	}
	c := v.c
	c.mu.Lock()
	if v.e.inst == v {
		v.e.inst = nil
	}
	c.fds -= v.fds
	c.meta -= v.meta
	c.mu.Unlock()
	v.close()
}

// Closed reports that the view's files are closed: a reader holding a
// reference got there after Cache.Close.
func (v *View) Closed() bool { return v.dead.Load() }

// close closes the view's files, once.
func (v *View) close() {
	if v.dead.CompareAndSwap(false, true) {
		v.view.Close()
	}
}

// Stats is a snapshot of a cache.
type Stats struct {
	Views         int   // resident views (in the LRU)
	FDs           int   // descriptors the views not yet closed may hold
	MetadataBytes int64 // resident metadata of the views not yet closed
	Limits        Limits
	Entries       []EntryStats // those shown or failed, in no order
}

// EntryStats describes an entry.
type EntryStats struct {
	Dir            string
	Format         string
	Files, Tensors int
	Bytes          int64
	Err            error
	// Open says its view is open, holding MetadataBytes; Resident, that it
	// is in the LRU (an open view out of it was evicted while in use).
	Open, Resident bool
	MetadataBytes  int64
}

// Stats returns a snapshot of the cache.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Views: c.lru.Len(), FDs: c.fds, MetadataBytes: c.meta, Limits: c.limits}
	for _, e := range c.entries {
		es := EntryStats{Dir: e.dir}
		switch {
		case e.err != nil:
			es.Err = e.err
		case e.shown:
			es.Format, es.Files, es.Tensors, es.Bytes = e.format, len(e.files), e.tensors, e.bytes
			if e.inst != nil {
				es.Open, es.Resident, es.MetadataBytes = true, c.lru.Contains(e.inst), e.inst.meta
			}
		default:
			continue // being opened
		}
		s.Entries = append(s.Entries, es)
	}
	return s
}
