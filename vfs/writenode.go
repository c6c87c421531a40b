package vfs

// The nodes and handles of a write target's files: files being written,
// the files of the view of what is committed, and stored files.

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/view"
)

// writeNode is a file created in a write target, until it is committed.
type writeNode struct {
	fs.Inode
	fsys *FS
	f    *hfwrite.File
	t    *target
}

var (
	_ = (fs.NodeGetattrer)((*writeNode)(nil))
	_ = (fs.NodeSetattrer)((*writeNode)(nil))
	_ = (fs.NodeOpener)((*writeNode)(nil))
)

func (n *writeNode) attr(a *fuse.Attr) syscall.Errno {
	size, err := n.f.Size()
	if err != nil {
		return toErrno(n.fsys.log, "stat "+n.f.Name(), err)
	}
	setAttr(a, n.f.Started(), size, syscall.S_IFREG)
	showAccess(a, n.t.access(0o644))
	return 0
}

func (n *writeNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(volatileTimeout)
	return n.attr(&out.Attr)
}

func (n *writeNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Setattr(ctx, in, out)
	}
	if size, ok := in.GetSize(); ok {
		if err := n.f.Truncate(int64(size)); err != nil {
			return toErrno(n.fsys.log, "truncate "+n.f.Name(), err)
		}
	}
	return n.Getattr(ctx, fh, out)
}

// Open is another open of the file being written: EBUSY for a second
// writer (hfwrite.File.Open); once it was committed, ESTALE makes the
// kernel look the name up again.
func (n *writeNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h, err := n.f.Open(isWrite(flags), isTrunc(flags))
	if err != nil {
		return nil, 0, toErrno(n.fsys.log, "open "+n.f.Name(), err)
	}
	return &writeHandle{fsys: n.fsys, h: h, t: n.t}, fuse.FOPEN_DIRECT_IO, 0
}

func isWrite(flags uint32) bool { return flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 }

// isTrunc reports an open for writing with O_TRUNC (the mount negotiates
// atomic O_TRUNC, so it arrives with the open).
func isTrunc(flags uint32) bool { return isWrite(flags) && flags&syscall.O_TRUNC != 0 }

// writeHandle is one open of a file being written.
type writeHandle struct {
	fsys *FS
	h    *hfwrite.Handle
	t    *target
}

var (
	_ = (fs.FileWriter)((*writeHandle)(nil))
	_ = (fs.FileReader)((*writeHandle)(nil))
	_ = (fs.FileFlusher)((*writeHandle)(nil))
	_ = (fs.FileReleaser)((*writeHandle)(nil))
	_ = (fs.FileFsyncer)((*writeHandle)(nil))
	_ = (fs.FileGetattrer)((*writeHandle)(nil))
	_ = (fs.FileSetattrer)((*writeHandle)(nil))
)

func (h *writeHandle) name() string { return h.h.File().Name() }

func (h *writeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := h.h.WriteAt(data, off)
	return uint32(n), toErrno(h.fsys.log, "write "+h.name(), err)
}

func (h *writeHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.h.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, toErrno(h.fsys.log, "read "+h.name(), err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Flush is close(2): it returns the commit's result (hfwrite.Handle.Flush);
// the session reported it.
func (h *writeHandle) Flush(ctx context.Context) syscall.Errno { return toErrnoLogged(h.h.Flush()) }

func (h *writeHandle) Release(ctx context.Context) syscall.Errno {
	h.h.Release()
	return 0
}

// Fsync reports a write that failed after it returned; it makes nothing
// durable: nothing is durable, or visible, before the file is closed, and
// close makes it durable.
func (h *writeHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return toErrno(h.fsys.log, "fsync "+h.name(), h.h.Written())
}

func (h *writeHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(volatileTimeout)
	return (&writeNode{fsys: h.fsys, f: h.h.File(), t: h.t}).attr(&out.Attr)
}

func (h *writeHandle) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		if err := h.h.Truncate(int64(size)); err != nil {
			return toErrno(h.fsys.log, "truncate "+h.name(), err)
		}
	}
	return h.Getattr(ctx, out)
}

// targetViewFile is a file of a write target's view: read like any view
// file while its view is open; opening it for writing starts rewriting
// that name.
type targetViewFile struct {
	ViewFile
	t *target
	v *hfwrite.View
}

var (
	_ = (fs.NodeOpener)((*targetViewFile)(nil))
	_ = (fs.NodeGetattrer)((*targetViewFile)(nil))
	_ = (fs.NodeSetattrer)((*targetViewFile)(nil))
)

func (f *targetViewFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if isWrite(flags) {
		return f.t.open(f.fsys, f.file.Name, flags)
	}
	if err := f.v.Acquire(); err != nil {
		return nil, 0, toErrno(f.fsys.log, "open "+f.file.Name, err) // replaced: ESTALE
	}
	fh, flags, errno := f.ViewFile.Open(ctx, flags)
	if errno != 0 {
		f.v.Release()
		return nil, 0, errno
	}
	return &pinnedHandle{viewHandle: fh.(*viewHandle), v: f.v}, flags, 0
}

func (f *targetViewFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Getattr(ctx, out)
	}
	errno := f.ViewFile.Getattr(ctx, fh, out)
	perm := os.FileMode(0o444)
	if f.file.Kind == view.KindPassthrough {
		perm = 0o644 // a stored file: it may be rewritten
	}
	showAccess(&out.Attr, f.t.access(perm))
	out.SetTimeout(volatileTimeout)
	return errno
}

func (f *targetViewFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.t.setattr(ctx, f.fsys, f.file.Name, fh, in, out, f.Getattr)
}

// pinnedHandle reads a file of a write target's view, holding the view
// open until it is released.
type pinnedHandle struct {
	*viewHandle
	v *hfwrite.View
}

var (
	_ = (fs.FileReader)((*pinnedHandle)(nil))
	_ = (fs.FileReleaser)((*pinnedHandle)(nil))
)

func (h *pinnedHandle) Release(ctx context.Context) syscall.Errno {
	errno := h.viewHandle.Release(ctx)
	h.v.Release()
	return errno
}

// sidecarNode is a stored file of a write target (config.json, ...).
type sidecarNode struct {
	PassFile
	t    *target
	name string
}

var (
	_ = (fs.NodeOpener)((*sidecarNode)(nil))
	_ = (fs.NodeGetattrer)((*sidecarNode)(nil))
	_ = (fs.NodeSetattrer)((*sidecarNode)(nil))
)

func (f *sidecarNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if isWrite(flags) {
		return f.t.open(f.fsys, f.name, flags)
	}
	// Not passthrough: the kernel fails an open of an inode whose other
	// opens use the other mode, and this file's writes come through ckptfs.
	return f.PassFile.open(flags, false)
}

func (f *sidecarNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Getattr(ctx, out)
	}
	errno := f.PassFile.Getattr(ctx, fh, out)
	showAccess(&out.Attr, f.t.access(0o644))
	out.SetTimeout(volatileTimeout)
	return errno
}

func (f *sidecarNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.t.setattr(ctx, f.fsys, f.name, fh, in, out, f.Getattr)
}

// open starts rewriting the existing file name of t (hfwrite.Session.Open).
func (t *target) open(f *FS, name string, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h, err := t.s.Open(name, isTrunc(flags))
	if err != nil {
		return nil, 0, toErrno(f.log, "open "+filepath.Join(t.s.Path(), name), err)
	}
	return &writeHandle{fsys: f, h: h, t: t}, fuse.FOPEN_DIRECT_IO, 0
}

// setattr on an existing file of t: a size change goes to the file being
// written under that name, through fh or by name (hfwrite.Session.Truncate);
// time and mode changes are accepted and ignored (cp -p).
func (t *target) setattr(ctx context.Context, f *FS, name string, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut,
	getattr func(context.Context, fs.FileHandle, *fuse.AttrOut) syscall.Errno) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Setattr(ctx, in, out)
	}
	if size, ok := in.GetSize(); ok {
		w, err := t.s.Truncate(name, int64(size))
		if err != nil {
			return toErrno(f.log, "truncate "+filepath.Join(t.s.Path(), name), err)
		}
		out.SetTimeout(volatileTimeout)
		return (&writeNode{fsys: f, f: w, t: t}).attr(&out.Attr)
	}
	return getattr(ctx, fh, out)
}
