package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Tree is the objects under a bucket prefix, read-only.
type Tree struct {
	loc    Location
	limits Limits
	store  Store
	count  *Counters
	opened time.Time // directories have no time of their own: they show this

	// reqs is the context of the requests sent now (requestCtx): canceled
	// by Close for good, and by Drain for the requests then in flight.
	reqs struct {
		sync.Mutex
		ctx      context.Context
		cancel   context.CancelFunc
		closed   bool
		draining bool // no more lookups (lookupCtx)
	}

	windows *windows // small reads
	ahead   *aheads  // reads that follow an object's last one
	lists   singleflight.Group
	// whole: the last listing of the whole prefix fit in one page, and
	// every directory's listing is taken from one like it (listTree).
	whole atomic.Bool
	mu    sync.Mutex
	cache map[string]listing // GUARDED_BY(mu); by directory name, fresh for ListTTL
	// The directories of the last listing of the whole prefix, and when.
	wholeAt   time.Time       // GUARDED_BY(mu)
	wholeDirs map[string]bool // GUARDED_BY(mu)
}

type listing struct {
	at   time.Time
	ents []source.Info
}

var (
	_ source.Tree    = (*Tree)(nil)
	_ source.Counted = (*Tree)(nil)
)

// Open returns the tree of store at loc, counting its traffic in c (which
// store counts its requests in). It lists the prefix once (listTree): a
// prefix with no objects under it is an error, as a missing directory is.
func Open(loc Location, store Store, l Limits, c *Counters) (*Tree, error) {
	t := &Tree{loc: loc, limits: l.WithDefaults(), store: store, count: c, opened: time.Now(),
		cache: map[string]listing{}, windows: newWindows()}
	t.ahead = newAheads(t.limits)
	t.reqs.ctx, t.reqs.cancel = context.WithCancel(context.Background())
	found, err := t.listTree()
	if err != nil {
		err = t.fail("stat", ".", err)
	} else if !found {
		err = t.notExist("stat", ".")
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Location is the bucket and prefix of the tree.
func (t *Tree) Location() Location { return t.loc }

// Close cancels requests in flight and closes the store if it has a Close
// (an SDK client's connections); the tree is not used after.
func (t *Tree) Close() error {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	if t.reqs.closed {
		return nil
	}
	t.reqs.closed = true
	t.reqs.cancel()
	if c, ok := t.store.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Drain ends the requests in flight (they fail with context.Canceled) and
// every Stat, ReadDir and Open from now on, while the files open go on
// being read: a mount being unmounted stops waiting on a stalled store
// (a lookup is several requests) and still serves the files that stay
// open.
func (t *Tree) Drain() {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	if !t.reqs.closed {
		t.reqs.draining = true
		t.reqs.cancel()
		t.reqs.ctx, t.reqs.cancel = context.WithCancel(context.Background())
	}
}

// requestCtx is the context to send a read's attempts with.
func (t *Tree) requestCtx() context.Context {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	return t.reqs.ctx
}

// lookupCtx is the context of a HEAD or LIST: done once draining.
func (t *Tree) lookupCtx() context.Context {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	if t.reqs.draining {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return t.reqs.ctx
}

// Stats are the tree's requests, bytes fetched, retries and errors.
func (t *Tree) Stats() source.Stats { return t.count.Stats() }

// Path is the URL of name.
func (t *Tree) Path(name string) string {
	if n, err := source.Clean(name); err == nil {
		name = n
	}
	return t.loc.URL(name)
}

// Stat describes name: from the listing of its directory, listed when it
// fits in a page (again once older than ListTTL: one request answers for
// every file of a checkpoint, where checking each would be a HEAD per
// shard at every open), else with a HEAD of its key and, when that finds no
// object, a one-key listing of it as a prefix.
func (t *Tree) Stat(name string) (source.Info, error) {
	name, err := source.Clean(name)
	if err != nil {
		return source.Info{}, err
	}
	if name != "." {
		dir := path.Dir(name)
		if isDir, known := t.inWhole(dir); known && !isDir {
			return source.Info{}, t.notExist("stat", name)
		}
		if _, fresh, _ := t.cached(dir); !fresh {
			// One listing page answers for every name of a directory (the
			// files of a checkpoint) where a HEAD answers for one: a
			// directory that fits in a page is listed, and kept (with
			// every other directory when the whole prefix fits). A
			// larger one, or a store that refuses the listing, is asked
			// by HEAD; a store that does not answer fails the Stat.
			known, isDir, err := t.relist(dir)
			if source.IsUnavailable(err) {
				return source.Info{}, t.fail("stat", name, err)
			}
			if known && !isDir {
				return source.Info{}, t.notExist("stat", name)
			}
		}
		if ents, fresh, _ := t.cached(dir); fresh {
			if e, ok := find(ents, path.Base(name)); ok {
				return e, nil
			}
			return source.Info{}, t.notExist("stat", name)
		}
		obj, err := t.store.Head(t.lookupCtx(), t.loc.Key(name))
		if err == nil {
			return t.fileInfo(name, obj), nil
		}
		if !errors.Is(err, ErrNotFound) {
			return source.Info{}, t.fail("stat", name, err)
		}
	}
	if name == "." {
		isDir, known := t.inWhole(".")
		if !known && t.whole.Load() {
			var err error
			if known, isDir, err = t.relist("."); err != nil {
				return source.Info{}, t.fail("stat", name, err)
			}
		}
		if known && isDir {
			return t.dirInfo(name), nil
		}
		if known {
			return source.Info{}, t.notExist("stat", name)
		}
	}
	return t.statDir(name)
}

// statDir describes name as a directory if any key lies under it.
func (t *Tree) statDir(name string) (source.Info, error) {
	page, err := t.store.List(t.lookupCtx(), t.loc.DirPrefix(name), false, 1, "")
	if err != nil {
		return source.Info{}, t.fail("stat", name, err)
	}
	if len(page.Objects) == 0 && len(page.Prefixes) == 0 {
		return source.Info{}, t.notExist("stat", name)
	}
	return t.dirInfo(name), nil
}

func (t *Tree) fileInfo(name string, o Object) source.Info {
	return source.Info{Name: path.Base(name), Size: o.Size, ModTime: o.ModTime, ID: t.loc.URL(name), Version: o.Version}
}

func (t *Tree) dirInfo(name string) source.Info {
	return source.Info{Name: path.Base(name), ModTime: t.opened, Mode: fs.ModeDir, ID: t.loc.URL(name) + "/"}
}

// ReadDir lists the directory name with a delimited listing: objects are
// files, common prefixes directories. Keys that no tree name could reach
// ("..", ".", empty segments, directory marker objects) are left out.
func (t *Tree) ReadDir(name string) ([]source.Info, error) {
	name, err := source.Clean(name)
	if err != nil {
		return nil, err
	}
	if ents, fresh, _ := t.cached(name); fresh {
		return ents, nil
	}
	// The listing of the whole prefix has every directory: a name that
	// is none needs no request (a view looks for optional directories).
	isDir, known := t.inWhole(name)
	if !known && t.whole.Load() {
		var err error
		if known, isDir, err = t.relist(name); err != nil {
			return nil, t.fail("readdir", name, err)
		}
	}
	if known && !isDir {
		return nil, t.notExist("readdir", name)
	}
	if ents, fresh, _ := t.cached(name); known && fresh {
		return ents, nil
	}
	v, err, _ := t.lists.Do(name, func() (any, error) { return t.list(name, false) })
	if err != nil {
		return nil, err
	}
	return v.([]source.Info), nil
}

// maxPages bounds the pages of one listing: a store answering every page
// with a continuation would hold ReadDir forever.
const maxPages = 1 << 20

// list lists the directory name and keeps the listing; onePage keeps only
// a listing of one page with names in it (else nil, and the store's error
// if it failed, uncounted).
func (t *Tree) list(name string, onePage bool) ([]source.Info, error) {
	prefix := t.loc.DirPrefix(name)
	byName := map[string]source.Info{}
	ctx := t.lookupCtx()
	token := ""
	for pages := 0; ; pages++ {
		if pages == maxPages {
			return nil, t.fail("readdir", name, errors.New("the listing never ends"))
		}
		page, err := t.store.List(ctx, prefix, true, 0, token)
		if err != nil && onePage {
			return nil, err // not counted: the caller may ask otherwise
		}
		if err != nil {
			return nil, t.fail("readdir", name, err)
		}
		for _, cp := range page.Prefixes {
			base, ok := strings.CutPrefix(cp, prefix)
			base = strings.TrimSuffix(base, "/")
			if ok && validBase(base) {
				if _, isFile := byName[base]; !isFile {
					byName[base] = t.dirInfo(path.Join(name, base))
				}
			}
		}
		for _, o := range page.Objects {
			base, ok := strings.CutPrefix(o.Key, prefix)
			if ok && validBase(base) {
				byName[base] = t.fileInfo(path.Join(name, base), o)
			}
		}
		if page.Next == "" || page.Next == token {
			break
		}
		if onePage {
			return nil, nil
		}
		token = page.Next
	}
	if len(byName) == 0 && onePage {
		return nil, nil // no directory, or an empty one: not kept, so ReadDir tells which
	}
	if len(byName) == 0 && name != "." {
		// An empty listing is no directory at all (object stores have no
		// empty ones).
		if _, err := t.statDir(name); err != nil {
			return nil, err
		}
	}
	ents := sorted(byName)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keep(name, ents, time.Now())
	return ents, nil
}

// sorted is the entries of a directory by name.
func sorted(byName map[string]source.Info) []source.Info {
	ents := make([]source.Info, 0, len(byName))
	for _, e := range byName {
		ents = append(ents, e)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	return ents
}

// find returns the entry named base of a sorted listing.
func find(ents []source.Info, base string) (source.Info, bool) {
	i := sort.Search(len(ents), func(i int) bool { return ents[i].Name >= base })
	if i < len(ents) && ents[i].Name == base {
		return ents[i], true
	}
	return source.Info{}, false
}

// keep keeps the listing of the directory name, within maxListings. Called
// with mu held.
func (t *Tree) keep(name string, ents []source.Info, at time.Time) {
	if _, ok := t.cache[name]; !ok && len(t.cache) >= maxListings {
		for k := range t.cache { // the map's order: any listing, dropped
			delete(t.cache, k)
			if len(t.cache) < maxListings/2 {
				break
			}
		}
	}
	t.cache[name] = listing{at: at, ents: ents}
}

// relist lists dir again: with every other directory when the whole
// prefix fit in a page last time (then known, and isDir says whether dir is
// a directory), else alone when it fits in a page. The error is the
// store's, uncounted (the caller may ask otherwise).
func (t *Tree) relist(dir string) (known, isDir bool, err error) {
	if t.whole.Load() {
		_, err, _ := t.lists.Do("\x00*", func() (any, error) {
			_, err := t.listTree()
			return nil, err
		})
		if err != nil {
			return false, false, err
		}
		if isDir, known := t.inWhole(dir); known {
			return true, isDir, nil
		}
	}
	_, err, _ = t.lists.Do("\x00"+dir, func() (any, error) { return t.list(dir, true) })
	return false, false, err
}

// inWhole reports whether dir is a directory by the listing of the whole
// prefix; known is false when there is none fresh.
func (t *Tree) inWhole(dir string) (isDir, known bool) {
	if !t.whole.Load() {
		return false, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.wholeDirs == nil || time.Since(t.wholeAt) > t.limits.ListTTL {
		return false, false
	}
	return t.wholeDirs[dir], true
}

// listTree lists the whole prefix, undelimited, in one request: when the
// page holds every key (a checkpoint's files: a few to hundreds), the
// listing of each directory is taken from it and kept, so that opening a
// view costs one LIST however many directories it looks in (a delimited
// listing per directory, and one to tell a directory from none, did
// that). It reports whether any key lies under the prefix; the error is
// the store's, uncounted.
func (t *Tree) listTree() (found bool, err error) {
	page, err := t.store.List(t.lookupCtx(), t.loc.DirPrefix("."), false, 0, "")
	if err != nil {
		t.whole.Store(false)
		return false, err
	}
	found = len(page.Objects) > 0 || len(page.Prefixes) > 0
	if page.Next != "" || len(page.Prefixes) > 0 { // more than a page, or a store that grouped keys anyway
		t.whole.Store(false)
		return found, nil
	}
	dirs := map[string]map[string]source.Info{".": {}}
	for _, o := range page.Objects {
		rel, ok := strings.CutPrefix(o.Key, t.loc.DirPrefix("."))
		if !ok {
			continue
		}
		// Each segment is an entry of the directory before it, as a
		// delimited listing of that directory shows it; one no name can
		// reach hides what lies below it. The object wins over a prefix
		// of the same name.
		dir, segs := ".", strings.Split(rel, "/")
		for i, base := range segs {
			if !validBase(base) {
				break
			}
			name := path.Join(dir, base)
			if i == len(segs)-1 {
				dirs[dir][base] = t.fileInfo(name, o)
				break
			}
			if e, isFile := dirs[dir][base]; !isFile || e.IsDir() {
				dirs[dir][base] = t.dirInfo(name)
			}
			if dirs[name] == nil {
				dirs[name] = map[string]source.Info{}
			}
			dir = name
		}
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wholeAt, t.wholeDirs = now, make(map[string]bool, len(dirs))
	for name, byName := range dirs {
		t.keep(name, sorted(byName), now)
		t.wholeDirs[name] = name != "." || found // no key: no directory
	}
	t.whole.Store(true)
	return found, nil
}

// maxListings bounds the directory listings a tree keeps.
const maxListings = 4096

// validBase reports whether a listed key's last segment is a name the tree
// can be asked for.
func validBase(base string) bool {
	return base != "" && base != "." && base != ".." && !strings.ContainsAny(base, "/\x00")
}

// cached returns the listing of dir, whether it is fresh, and whether dir
// was listed at all.
func (t *Tree) cached(dir string) (ents []source.Info, fresh, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.cache[dir]
	if !ok {
		return nil, false, false
	}
	return l.ents, time.Since(l.at) <= t.limits.ListTTL, true
}

// Open opens the object at name. Its size and version come from Stat;
// nothing is fetched until the first read.
func (t *Tree) Open(name string) (source.File, error) {
	name, err := source.Clean(name)
	if err != nil {
		return nil, err
	}
	info, err := t.Stat(name)
	if err != nil {
		return nil, err
	}
	if !info.IsRegular() {
		return nil, fmt.Errorf("%w: %s is a directory (a prefix of objects)", source.ErrNotRegular, t.loc.URL(name))
	}
	obj := Object{Key: t.loc.Key(name), Size: info.Size, ModTime: info.ModTime, Version: info.Version}
	return &file{t: t, obj: obj, url: t.loc.URL(name), info: info, next: -1}, nil
}

// notExist is the error for a name with no object or prefix.
func (t *Tree) notExist(op, name string) error {
	return &fs.PathError{Op: op, Path: t.loc.URL(name), Err: fs.ErrNotExist}
}

// fail turns a lookup's error into one naming the object, counted.
func (t *Tree) fail(op, name string, err error) error {
	t.count.Errors.Add(1)
	return &fs.PathError{Op: op, Path: t.loc.URL(name), Err: RequestFailed(err)}
}
