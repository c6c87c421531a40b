package vfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/vfs/readpath"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

const (
	// statsName is the read-only stats file at the mount root.
	statsName = ".ckptfs"
	// errorName appears in a checkpoint directory that could not be opened.
	errorName = "CKPTFS_ERROR.txt"
	// infoName appears in a checkpoint directory that has no model to show
	// (optimizer state only), saying so; its files are shown as they are.
	infoName = "CKPTFS_INFO.txt"
)

// ViewFile is a file of an HF view, served through the read path. A
// checkpoint's view file (e set) names its file in the entry: the view may
// be evicted while the kernel holds the node, so each open takes the view
// from the entry, opening it again if need be. A write target's view file
// (e nil, writenode.go) holds its file, which the target keeps open.
type ViewFile struct {
	fs.Inode
	fsys *FS
	file *view.File // a write target's
	id   uint64     // cache id

	e    *viewcache.Entry
	info viewcache.FileInfo // e's file
}

var (
	_ = (fs.NodeGetattrer)((*ViewFile)(nil))
	_ = (fs.NodeOpener)((*ViewFile)(nil))
	_ = (fs.NodeLseeker)((*ViewFile)(nil))
)

// size and modTime are the file's, as listed.
func (f *ViewFile) size() int64 {
	if f.e != nil {
		return f.info.Size
	}
	return f.file.Size
}

func (f *ViewFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	mtime := f.info.ModTime
	if f.e == nil {
		mtime = f.file.ModTime
	}
	setAttr(&out.Attr, mtime, f.size(), syscall.S_IFREG|0o444)
	if f.e != nil {
		showAccess(&out.Attr, f.info.Access)
	}
	out.SetTimeout(f.fsys.opts.ViewTimeout)
	return 0
}

// logKey is the checkpoint's path, under which the errors of its files
// are logged (errorLog).
func (f *ViewFile) logKey() string {
	if f.e != nil {
		return f.fsys.tree.Path(f.e.Dir())
	}
	return f.file.Name // a write target's file
}

// Open checks that the files the view's bytes come from are still those
// the view was built from (a stat each): after a source changed, opens fail
// with EIO instead of serving blocks cached from the old content. An open
// of a checkpoint's view file holds a reference to its view until Release.
func (f *ViewFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	// Opening the view again and the stats ask the source, which over an
	// object store may not answer: a signal ends the open at once.
	o, errno := interruptiblyDropping(ctx, f.fsys, f.openView, func(o openedView) {
		if o.inst != nil {
			o.inst.Unref()
		}
	})
	if errno != 0 {
		return nil, 0, errno
	}
	file, id, inst := o.file, o.id, o.inst
	src := &viewReader{fsys: f.fsys, file: file, inst: inst}
	r := f.fsys.reads.Open(readpath.File{Name: file.Name, ID: id, Src: src, Size: file.Size,
		DataOffset: file.DataOffset(), Page: f.EmbeddedInode(), Hold: src.hold})
	h := &viewHandle{fsys: f.fsys, file: file, r: r, inst: inst, logKey: f.logKey()}
	// The bytes never change for the life of the mount: let the kernel keep
	// its page cache across opens.
	return h, fuse.FOPEN_KEEP_CACHE, 0
}

// openedView is what an open of a view file holds: the file, its cache
// id, and a reference to its checkpoint's view (nil for a write target's).
type openedView struct {
	file *view.File
	id   uint64
	inst *viewcache.View
}

func (f *ViewFile) openView() (openedView, syscall.Errno) {
	o := openedView{file: f.file, id: f.id}
	if f.e != nil {
		inst, err := f.fsys.views.Acquire(f.e)
		if err != nil {
			f.fsys.readErrors.Add(1)
			return o, f.fsys.limitedErrno(f.logKey(), "open "+f.info.Name, err)
		}
		o.file, o.id, o.inst = inst.File(f.info.Name), f.info.ID, inst
		if o.file == nil || o.file.Size != f.info.Size { // the reopen check rules this out
			inst.Unref()
			f.fsys.readErrors.Add(1)
			return o, f.fsys.limitedErrno(f.logKey(), "open "+f.info.Name, fmt.Errorf("%w: %s is not in the view opened again", ckpt.ErrSourceChanged, f.info.Name))
		}
	}
	if err := o.file.CheckFresh(); err != nil {
		if o.inst != nil {
			o.inst.Unref()
		}
		f.fsys.readErrors.Add(1)
		return o, f.fsys.limitedErrno(f.logKey(), "open "+o.file.Name, err)
	}
	return o, 0
}

// viewReader reads a view file for the read path: direct reads, the block
// cache (whose read-ahead may still fill a block after the handle that
// asked for it is released) and prefill. Each read holds a reference to
// the view, so its files are not closed under it, and fails once the view
// is closed rather than opening them again. A panic in a read is that
// read's error.
type viewReader struct {
	fsys *FS
	file *view.File
	inst *viewcache.View // nil for a write target's view
}

func (r *viewReader) ReadAt(p []byte, off int64) (n int, err error) {
	if i := r.inst; i != nil {
		if !i.Ref() {
			return 0, viewcache.ErrClosed
		}
		defer i.Unref()
		if i.Closed() {
			return 0, viewcache.ErrClosed
		}
	}
	defer func() {
		if v := recover(); v != nil {
			n, err = 0, r.fsys.internalError("read "+r.file.Name, v)
		}
	}()
	return r.file.ReadAt(p, off)
}

// hold keeps the view open for a prefill that outlives the handle
// (readpath.File.Hold).
func (r *viewReader) hold() (release func(), ok bool) {
	i := r.inst
	if i == nil {
		return func() {}, true
	}
	if !i.Ref() {
		return nil, false
	}
	return i.Unref, true
}

// Lseek: view files have no holes.
func (f *ViewFile) Lseek(ctx context.Context, fh fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	return seekNoHoles(off, whence, f.size())
}

func seekNoHoles(off uint64, whence uint32, size int64) (uint64, syscall.Errno) {
	if off >= uint64(size) {
		return 0, syscall.ENXIO
	}
	switch whence {
	case unix.SEEK_DATA:
		return off, 0
	case unix.SEEK_HOLE:
		return uint64(size), 0
	}
	return 0, syscall.EINVAL
}

// viewHandle is one open of a view file.
type viewHandle struct {
	fsys *FS
	file *view.File
	r    *readpath.Reader
	inst *viewcache.View // the view it holds a reference to; nil for a write target's
	// logKey groups its error lines with the other files of its checkpoint's.
	logKey string
}

var (
	_ = (fs.FileReader)((*viewHandle)(nil))
	_ = (fs.FileReleaser)((*viewHandle)(nil))
)

func (h *viewHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	res, err := h.r.Read(ctx, dest, off)
	if err != nil {
		h.fsys.readErrors.Add(1)
		return nil, h.fsys.limitedErrno(h.logKey, "read "+h.file.Name, err)
	}
	h.fsys.bytesServed.Add(int64(res.Size()))
	return res, 0
}

func (h *viewHandle) Release(ctx context.Context) syscall.Errno {
	h.r.Close()
	if h.inst != nil {
		h.inst.Unref()
	}
	return 0
}

// PassFile is a source file shown through read-only.
type PassFile struct {
	fs.Inode
	fsys *FS
	rel  string // name in the source tree
	id   string // the file the name reached at lookup (source.Info.ID)
}

var (
	_ = (fs.NodeGetattrer)((*PassFile)(nil))
	_ = (fs.NodeOpener)((*PassFile)(nil))
)

func (f *PassFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	info, errno := interruptibly(ctx, f.fsys, func() (source.Info, syscall.Errno) {
		info, err := f.fsys.tree.Stat(f.rel)
		return info, f.fsys.sourceErrno("stat", f.rel, err)
	})
	if errno != 0 {
		return errno
	}
	setAttr(&out.Attr, info.ModTime, info.Size, syscall.S_IFREG)
	showAccess(&out.Attr, f.fsys.access(info).ReadOnly())
	out.SetTimeout(time.Second)
	return 0
}

// Open hands a local file's descriptor to the kernel, which then reads and
// maps it itself (FUSE passthrough): no request, no copy through ckptfs.
// Files on filesystems the kernel does not stack on are not offered
// (backingFS); where it refuses anyway (not root), go-fuse stops asking and
// reads come here.
func (f *PassFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	type opened struct {
		h     fs.FileHandle
		flags uint32
	}
	o, errno := interruptiblyDropping(ctx, f.fsys, func() (opened, syscall.Errno) {
		h, flags, errno := f.open(flags, true)
		return opened{h, flags}, errno
	}, func(o opened) { o.h.(*passHandle).fd.Close() })
	return o.h, o.flags, errno
}

func (f *PassFile) open(flags uint32, passthrough bool) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	fd, err := f.fsys.tree.Open(f.rel)
	if err != nil {
		return nil, 0, f.fsys.limitedErrno(f.fsys.tree.Path(path.Dir(f.rel)), "open "+f.fsys.tree.Path(f.rel), err)
	}
	if f.id != "" && fd.Info().ID != f.id {
		// The name reaches another file now. The kernel takes ESTALE from
		// an open as a cue to look the name up again, which finds the new
		// file's inode; the kernel's passthrough backing of this one (the
		// file an earlier open registered) must not serve it.
		fd.Close()
		return nil, 0, syscall.ESTALE
	}
	return &passHandle{fsys: f.fsys, fd: fd, name: f.fsys.tree.Path(f.rel), dir: f.fsys.tree.Path(path.Dir(f.rel)), passthrough: passthrough}, 0, 0
}

type passHandle struct {
	fsys        *FS
	fd          source.File
	name        string
	dir         string // its directory's path, the key of its error lines
	passthrough bool   // the kernel may read fd itself
}

var (
	_ = (fs.FileReader)((*passHandle)(nil))
	_ = (fs.FileReleaser)((*passHandle)(nil))
	_ = (fs.FilePassthroughFder)((*passHandle)(nil))
)

// PassthroughFd is asked once per inode while no open of it is passthrough.
func (h *passHandle) PassthroughFd() (int, bool) {
	d, ok := h.fd.(source.Descriptor)
	if !h.passthrough || !ok || !takesBacking(int(d.Fd())) {
		return 0, false
	}
	return int(d.Fd()), true
}

// backingFS lists the filesystems whose files the kernel takes as
// passthrough backing files: not stacked (FUSE with passthrough, overlayfs
// are refused as too deep) and with both read_iter and write_iter (a
// read-only squashfs has no write_iter). One refusal makes go-fuse stop
// passthrough for the whole mount, and the kernel then fails (EIO) a plain
// open of a file that other opens hold in passthrough; so a file elsewhere
// is served by ckptfs instead of being offered.
var backingFS = map[int64]bool{
	unix.EXT4_SUPER_MAGIC:  true, // ext2, ext3 too
	unix.XFS_SUPER_MAGIC:   true,
	unix.BTRFS_SUPER_MAGIC: true,
	unix.TMPFS_MAGIC:       true,
	unix.NFS_SUPER_MAGIC:   true,
	0x2fc12fc1:             true, // ZFS
	0x0bd00bd0:             true, // Lustre
}

func takesBacking(fd int) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && backingFS[st.Type]
}

func (h *passHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.fd.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, h.fsys.limitedErrno(h.dir, "read "+h.name, err)
	}
	h.fsys.passServed.Add(int64(n))
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *passHandle) Release(ctx context.Context) syscall.Errno {
	h.fd.Close()
	return 0
}

// memFile is a small read-only file held in memory.
type memFile struct {
	fs.Inode
	data   []byte
	access source.Access // its checkpoint directory's (attr.go)
}

var (
	_ = (fs.NodeGetattrer)((*memFile)(nil))
	_ = (fs.NodeOpener)((*memFile)(nil))
	_ = (fs.NodeReader)((*memFile)(nil))
)

func (f *memFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	setAttr(&out.Attr, time.Now(), int64(len(f.data)), syscall.S_IFREG)
	showAccess(&out.Attr, f.access)
	return 0
}

func (f *memFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *memFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return fuse.ReadResultData(sliceAt(f.data, dest, off)), 0
}

func sliceAt(data, dest []byte, off int64) []byte {
	if off >= int64(len(data)) {
		return nil
	}
	return dest[:copy(dest, data[off:])]
}
