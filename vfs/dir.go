package vfs

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// Dir is a directory of the source tree. Whether it is a checkpoint (and so
// shows its HF view instead of its files) is decided on each lookup until the
// view is built, so a checkpoint whose .metadata lands after the directory was
// first listed is recognised.
type Dir struct {
	fs.Inode
	fsys *FS
	real string // local path of the source directory (the write path uses it); unused for other trees
	rel  string // path inside the mount: its name in the source tree

	mu      sync.Mutex
	format  ckpt.Reader // GUARDED_BY(mu); set once the directory is seen to be a checkpoint
	broken  error       // GUARDED_BY(mu); set when detecting its format failed (a panic)
	checked time.Time   // GUARDED_BY(mu); when it was last seen not to be one
}

// name is the directory's name in the source tree.
func (d *Dir) name() string {
	if d.rel == "" {
		return "."
	}
	return d.rel
}

// detect reports whether d is a checkpoint, and of which format. Once it
// is, it stays one; a negative answer is trusted for a second (the entry
// timeout), so the lookups of one `ls -l` do not each re-examine the
// directory. A directory whose format could not be told (a Detect that
// panicked) is a checkpoint with no format: see brokenErr. The source is
// asked without d.mu held: a lookup that waits on a store that does not
// answer must not hold up the others in the directory, which an outage
// fails at once (outageTree); two lookups may then both look, and the
// first answer is kept.
func (d *Dir) detect() (ckpt.Reader, bool, error) {
	d.mu.Lock()
	if d.format != nil || d.broken != nil || time.Since(d.checked) < time.Second {
		format, ok := d.format, d.format != nil || d.broken != nil
		d.mu.Unlock()
		return format, ok, nil
	}
	d.mu.Unlock()
	format, ok, err, failed := d.fsys.detect(d.name())
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.format != nil || d.broken != nil {
		return d.format, true, nil
	}
	switch {
	case failed != nil: // nothing learnt: asked again next time
		return nil, false, failed
	case err != nil:
		d.broken = err
	case ok:
		d.format = format
	default:
		d.checked = time.Now()
	}
	return format, ok, nil
}

// brokenErr is why d's format could not be told, or nil.
func (d *Dir) brokenErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broken
}

var (
	_ = (fs.NodeLookuper)((*Dir)(nil))
	_ = (fs.NodeReaddirer)((*Dir)(nil))
	_ = (fs.NodeGetattrer)((*Dir)(nil))
	_ = (fs.NodeStatfser)((*Dir)(nil))
)

// entry is one child of a directory as shown in the mount.
type entry struct {
	name     string
	mode     uint32 // S_IFDIR or S_IFREG
	make     func() fs.InodeEmbedder
	view     bool   // a view file: immutable, cache long
	volatile bool   // in a write target: may change at any commit, cache (almost) not at all
	ino      uint64 // 0: derived from the path
}

// children lists what the directory shows. For a checkpoint: its view files,
// then the source entries that are not format internals; otherwise the source
// entries. A write target shows what its session lists (targetChildren).
// The mount root also holds .ckptfs. With only != "", source entries other
// than only are not looked at: a lookup costs one stat, not a listing of the
// directory.
func (d *Dir) children(only string) ([]entry, syscall.Errno) {
	if t := d.fsys.targetOf(d.real); t != nil {
		return d.targetChildren(t, only)
	}
	var out []entry
	shown := map[string]bool{}
	add := func(e entry) {
		if !shown[e.name] {
			shown[e.name] = true
			out = append(out, e)
		}
	}
	if d.rel == "" {
		add(entry{name: statsName, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder { return &statsFile{fsys: d.fsys} }})
	}
	// A lookup of a name already found asks the source nothing: .ckptfs
	// answers while the source does not, and so do the views built.
	if only != "" && shown[only] {
		return out, 0
	}
	var format ckpt.Reader // hides its internals
	f, ok, err := d.detect()
	if err != nil {
		return nil, d.fsys.sourceErrno("detect", d.name(), err)
	}
	if ok {
		format = f
		var e *viewcache.Entry
		err := d.brokenErr()
		if err == nil {
			e = d.fsys.view(d.name(), f)
			err = d.fsys.views.Err(e)
		}
		switch {
		case err != nil:
			msg := []byte("ckptfs could not show this checkpoint:\n" + err.Error() + "\n")
			add(entry{name: errorName, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder {
				return &memFile{data: msg, access: d.fsys.dirAccess(d.name()).AsFile()}
			}})
		case e.Note() != "":
			// Nothing to show as a model: the files are shown as they are.
			format = nil
			msg := []byte(e.Note() + "\n")
			add(entry{name: infoName, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder {
				return &memFile{data: msg, access: d.fsys.dirAccess(d.name()).AsFile()}
			}})
		default:
			for _, info := range e.Files() {
				add(entry{name: info.Name, mode: syscall.S_IFREG, view: true, make: func() fs.InodeEmbedder {
					return &ViewFile{fsys: d.fsys, e: e, info: info}
				}})
			}
		}
	}
	if only != "" && shown[only] {
		return out, 0
	}
	ents, errno := d.sourceEntries(only)
	if errno != 0 {
		return nil, errno
	}
	hidden := d.hidden(format, ents, only)
	if !ok && (only == "" || only == infoName) {
		if errno := d.noteUnrecognised(ents, only, hidden, add); errno != 0 {
			return nil, errno
		}
	}
	for _, info := range ents {
		name := info.Name
		if hidden(name) {
			continue
		}
		real := filepath.Join(d.real, name)
		if real == d.fsys.mountpoint {
			continue
		}
		rel := path.Join(d.rel, name)
		switch {
		case info.IsDir():
			add(entry{name: name, mode: syscall.S_IFDIR, make: func() fs.InodeEmbedder {
				return &Dir{fsys: d.fsys, real: real, rel: rel}
			}})
		case info.IsRegular():
			// One inode per file, not per name: a file replaced under the
			// name gets a new inode, never the old one's passthrough
			// backing (see PassFile.open).
			add(entry{name: name, mode: syscall.S_IFREG, ino: inode(rel + "\x00" + info.ID), make: func() fs.InodeEmbedder {
				return &PassFile{fsys: d.fsys, rel: rel, id: info.ID}
			}})
		}
	}
	return out, 0
}

// noteUnrecognised adds infoName to a directory that is no checkpoint but
// holds tensor files (layout.Unrecognised), and logs that line once per
// directory: a checkpoint no reader takes is never passed through in
// silence. ents is the listing, or, for a lookup of only, that one entry;
// what hidden hides (a killed write session's debris) is not named.
func (d *Dir) noteUnrecognised(ents []source.Info, only string, hidden func(string) bool, add func(entry)) syscall.Errno {
	if only != "" {
		var errno syscall.Errno
		if ents, errno = d.sourceEntries(""); errno != 0 {
			return errno
		}
		hidden = d.hidden(nil, ents, "")
	}
	ents = slices.DeleteFunc(slices.Clone(ents), func(e source.Info) bool { return hidden(e.Name) })
	sub, err := source.Sub(d.fsys.tree, d.name())
	if err != nil {
		return 0
	}
	msg := layout.Unrecognised(sub, ents)
	if msg == "" {
		return 0
	}
	d.fsys.mu.Lock()
	first := !d.fsys.noted[d.name()]
	d.fsys.noted[d.name()] = true
	d.fsys.mu.Unlock()
	if first {
		d.fsys.log.Warn(msg)
	}
	data := []byte(msg + "\n")
	access := d.fsys.dirAccess(d.name()).AsFile()
	add(entry{name: infoName, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder { return &memFile{data: data, access: access} }})
	return 0
}

// interruptibly runs fn, which asks the source, so that a FUSE INTERRUPT
// (ctx done) ends the caller's wait with EINTR when the source is remote:
// the kernel sends one for a lookup or listing interrupted by a signal
// (timeout(1), Ctrl-C), which would otherwise wait out the store's retry
// budget. fn runs on, bounded by that budget, and its answer is dropped. A
// local source answers inline, and so does every call while maxDetached
// calls run on (interrupted calls repeated against a store that does not
// answer would otherwise add a goroutine each).
func interruptibly[T any](ctx context.Context, f *FS, fn func() (T, syscall.Errno)) (T, syscall.Errno) {
	return interruptiblyDropping(ctx, f, fn, nil)
}

// interruptiblyDropping is interruptibly for an fn whose answer holds
// something (an open's reference to its view): drop releases an answer
// that arrives after the caller was answered EINTR.
func interruptiblyDropping[T any](ctx context.Context, f *FS, fn func() (T, syscall.Errno), drop func(T)) (T, syscall.Errno) {
	if f.local || ctx.Done() == nil {
		return fn()
	}
	select {
	case f.detached <- struct{}{}:
	default:
		return fn()
	}
	type answer struct {
		v     T
		errno syscall.Errno
	}
	ch := make(chan answer, 1)
	go func() {
		var a answer
		defer func() {
			if v := recover(); v != nil {
				a.errno = toErrno(f.log, "lookup", f.internalError("lookup", v))
			}
			<-f.detached
			ch <- a
		}()
		a.v, a.errno = fn()
	}()
	select {
	case a := <-ch:
		return a.v, a.errno
	case <-ctx.Done():
		if drop != nil {
			go func() {
				if a := <-ch; a.errno == 0 {
					drop(a.v)
				}
			}()
		}
		var zero T
		return zero, syscall.EINTR
	}
}

// maxDetached bounds the source calls of interruptibly running on their own
// goroutines, per mount (FS.detached).
const maxDetached = 64

// sourceEntries lists the source directory, or with only != "" just that
// entry (a lookup costs one stat, not a listing). Symlinks show as what
// they point to; links that leave the source, and FIFOs, sockets and
// devices, are not shown. A source that fails is an error (sourceErrno),
// never an empty answer.
func (d *Dir) sourceEntries(only string) ([]source.Info, syscall.Errno) {
	if only != "" {
		name := path.Join(d.name(), only)
		info, err := d.fsys.tree.Stat(name)
		if err != nil {
			if errno := d.fsys.sourceErrno("stat", name, err); errno != syscall.ENOENT {
				return nil, errno
			}
			return nil, 0 // no entry: the caller answers ENOENT
		}
		info.Name = only
		return []source.Info{info}, 0
	}
	ents, err := d.fsys.tree.ReadDir(d.name())
	if err != nil {
		return nil, d.fsys.sourceErrno("readdir", d.name(), err)
	}
	return ents, 0
}

func (d *Dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	// No name of a source or a view is longer; the kernel does not check.
	if len(name) > unix.NAME_MAX {
		return nil, syscall.ENAMETOOLONG
	}
	kids, errno := interruptibly(ctx, d.fsys, func() ([]entry, syscall.Errno) { return d.children(name) })
	if errno != 0 {
		return nil, errno
	}
	for _, e := range kids {
		if e.name != name {
			continue
		}
		node := e.make()
		ino := e.ino
		if ino == 0 {
			ino = inode(filepath.Join(d.rel, name))
		}
		child := d.NewInode(ctx, node, fs.StableAttr{Mode: e.mode, Ino: ino})
		if ga, ok := node.(fs.NodeGetattrer); ok {
			var attr fuse.AttrOut
			if errno := ga.Getattr(ctx, nil, &attr); errno != 0 {
				return nil, errno
			}
			out.Attr = attr.Attr
		}
		timeout := time.Second
		switch {
		case e.volatile:
			timeout = volatileTimeout
		case e.view:
			timeout = d.fsys.opts.ViewTimeout
		}
		out.SetEntryTimeout(timeout)
		out.SetAttrTimeout(timeout)
		return child, 0
	}
	if d.fsys.targetOf(d.real) != nil {
		// A name may appear at any commit: no negative caching.
		out.SetEntryTimeout(volatileTimeout)
	}
	return nil, syscall.ENOENT
}

func (d *Dir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	kids, errno := interruptibly(ctx, d.fsys, func() ([]entry, syscall.Errno) { return d.children("") })
	if errno != 0 {
		return nil, errno
	}
	sort.Slice(kids, func(i, j int) bool { return kids[i].name < kids[j].name })
	list := make([]fuse.DirEntry, len(kids))
	for i, e := range kids {
		ino := e.ino
		if ino == 0 {
			ino = inode(filepath.Join(d.rel, e.name))
		}
		list[i] = fuse.DirEntry{Name: e.name, Mode: e.mode, Ino: ino}
	}
	return fs.NewListDirStream(list), 0
}

// Getattr stats the source directory, except for the mount root: the root
// answers without the source (its mtime is the mount's start), so that the
// mount comes up, and .ckptfs can be read, while the source does not answer.
func (d *Dir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	mtime, acc := d.fsys.started, d.fsys.rootAccess
	if d.rel != "" {
		info, errno := interruptibly(ctx, d.fsys, func() (source.Info, syscall.Errno) {
			info, err := d.fsys.tree.Stat(d.name())
			return info, d.fsys.sourceErrno("stat", d.name(), err)
		})
		if errno != 0 {
			return errno
		}
		mtime, acc = info.ModTime, d.fsys.access(info)
	}
	if !d.writable() {
		acc = acc.ReadOnly()
	}
	setAttr(&out.Attr, mtime, 0, syscall.S_IFDIR)
	showAccess(&out.Attr, acc)
	out.Nlink = 2
	out.SetTimeout(time.Second)
	return 0
}

// Statfs reports the local source's filesystem; an object store has no
// size to report (df shows 0).
func (d *Dir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if !d.fsys.local {
		out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 1024
		return 0
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.fsys.root, &st); err != nil {
		return toErrno(d.fsys.log, "statfs", err)
	}
	out.FromStatfsT(&st)
	return 0
}

// setAttr fills the attributes every ckptfs node shares.
func setAttr(a *fuse.Attr, mtime time.Time, size int64, mode uint32) {
	a.Mode = mode
	a.Size = uint64(size)
	a.Blocks = (uint64(size) + 511) / 512
	a.Blksize = 1 << 20
	a.SetTimes(nil, &mtime, &mtime)
	a.Nlink = 1
	a.Uid = uint32(os.Getuid())
	a.Gid = uint32(os.Getgid())
}
