package vfs

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
)

// Dir is a directory of the source tree. Whether it is a checkpoint (and so
// shows its HF view instead of its files) is decided on each lookup until the
// view is built, so a checkpoint whose .metadata lands after the directory was
// first listed is recognised.
type Dir struct {
	fs.Inode
	fsys *FS
	real string // path in the source tree
	rel  string // path inside the mount

	mu      sync.Mutex
	format  layout.Format // GUARDED_BY(mu); set once the directory is seen to be a checkpoint
	checked time.Time     // GUARDED_BY(mu); when it was last seen not to be one
}

// detect reports whether d is a checkpoint. Once it is, it stays one; a
// negative answer is trusted for a second (the entry timeout), so the
// lookups of one `ls -l` do not each re-examine the directory.
func (d *Dir) detect() (layout.Format, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.format != "" {
		return d.format, true
	}
	if time.Since(d.checked) < time.Second {
		return "", false
	}
	f, ok := layout.Detect(d.real)
	if ok {
		d.format = f
	} else {
		d.checked = time.Now()
	}
	return f, ok
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
// entries. A write target shows the files being written, the view of what
// is committed so far, and its stored sidecars. The mount root also holds
// .ckptfs. With only != "", source entries other than only are not looked
// at: a lookup costs one stat, not a listing of the directory.
func (d *Dir) children(only string) ([]entry, syscall.Errno) {
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
	var format layout.Format
	t := d.fsys.targetOf(d.real)
	if t != nil {
		format = ckpt.FormatTorchDCP // its internals stay hidden, even before the first .metadata
		d.targetChildren(t, add)
	} else if f, ok := d.detect(); ok {
		format = f
		e := d.fsys.view(d.real)
		if e.err != nil {
			msg := []byte("ckptfs could not show this checkpoint:\n" + e.err.Error() + "\n")
			add(entry{name: errorName, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder { return &memFile{data: msg} }})
		} else {
			for _, vf := range e.view.Files {
				vf, id := vf, e.ids[vf.Name]
				add(entry{name: vf.Name, mode: syscall.S_IFREG, view: true, make: func() fs.InodeEmbedder {
					return &ViewFile{fsys: d.fsys, file: vf, id: id}
				}})
			}
		}
	}
	names := []string{only} // a missing name fails the Stat below
	if only == "" {
		ents, err := os.ReadDir(d.real)
		if err != nil {
			return nil, toErrno(d.fsys.log, "readdir "+d.real, err)
		}
		names = names[:0]
		for _, de := range ents {
			names = append(names, de.Name())
		}
	}
	for _, name := range names {
		if name == hfwrite.SpoolDir {
			if t == nil {
				d.fsys.cleanStale(d.real)
			}
			continue
		}
		if format != "" && hiddenInView(format, name) || t != nil && name == dcpMetadataTmp {
			continue
		}
		real := filepath.Join(d.real, name)
		if real == d.fsys.mountpoint {
			continue
		}
		fi, err := os.Stat(real) // follow symlinks: `latest` shows as the step it names
		if err != nil {
			continue // dangling symlink
		}
		rel := filepath.Join(d.rel, name)
		switch {
		case fi.IsDir():
			add(entry{name: name, mode: syscall.S_IFDIR, make: func() fs.InodeEmbedder {
				return &Dir{fsys: d.fsys, real: real, rel: rel}
			}})
		case fi.Mode().IsRegular():
			add(entry{name: name, mode: syscall.S_IFREG, volatile: t != nil, make: func() fs.InodeEmbedder {
				if t != nil {
					return &sidecarNode{PassFile: PassFile{fsys: d.fsys, real: real}, t: t, name: name}
				}
				return &PassFile{fsys: d.fsys, real: real}
			}})
		}
	}
	return out, 0
}

func (d *Dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	kids, errno := d.children(name)
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
	kids, errno := d.children("")
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

func (d *Dir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fi, err := os.Stat(d.real)
	if err != nil {
		return toErrno(d.fsys.log, "stat "+d.real, err)
	}
	perm := uint32(0o555)
	if d.writable() {
		perm = 0o755
	}
	setAttr(&out.Attr, fi.ModTime(), 0, syscall.S_IFDIR|perm)
	out.Nlink = 2
	out.SetTimeout(time.Second)
	return 0
}

func (d *Dir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
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
