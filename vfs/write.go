package vfs

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
)

// The write path. In a writable mount, mkdir creates a write target: a new
// source directory that hfwrite turns into a DCP checkpoint, one closed file
// at a time. A directory stays a write target for the life of the mount; it
// lists the files being written, the HF view of what is committed so far,
// and its stored sidecars. Every entry in it is volatile (the kernel caches
// it for a jiffy) because any commit may change it, and each rebuilt view
// gets fresh inode numbers, so nothing stale is served from the kernel's
// caches. After a remount the directory is an ordinary, read-only checkpoint.
//
// A file is committed at the first flush (close) of a handle that wrote data
// to it, and close(2) gets the result: EIO when nothing was committed. The
// kernel flushes at every close of a descriptor, dups included, so a flush
// before any write (a shell's `>` redirection opens, dups and closes) does
// not commit. A file that was only created or truncated, never written,
// commits when its last handle is released, as does one whose writer never
// flushed (rare); those errors can only be logged.
//
// Lock order: upload.mu, then target.mu, then FS.mu. hfwrite's locks are
// taken inside its calls; upload.mu is held across a commit.

const (
	// volatileTimeout is the entry and attr timeout of everything in a write
	// target. go-fuse replaces a zero timeout by the mount default, so the
	// smallest non-zero one is used: the kernel rounds it up to one jiffy.
	volatileTimeout = time.Nanosecond
	// dcpMetadataTmp is the temporary file dcpwrite renames over .metadata.
	dcpMetadataTmp = ".metadata.tmp"
)

// target is a directory created by mkdir in a writable mount.
type target struct {
	w   *hfwrite.Writer
	dir string // path in the source tree
	rel string // path inside the mount

	mu      sync.Mutex
	uploads map[string]*upload // GUARDED_BY(mu): files being written, by name
	view    *viewEntry         // GUARDED_BY(mu): view of what is committed; nil until built
	viewGen uint64             // GUARDED_BY(mu): writer generation view was built at
	serial  uint64             // GUARDED_BY(mu): number of views built; part of their inode numbers
	stale   bool               // GUARDED_BY(mu): view must be rebuilt (a sidecar was removed or renamed)
	seq     uint64             // GUARDED_BY(mu): uploads started; part of their inode numbers
}

// sourceKey is the key of a source directory in FS.targets: its
// symlink-resolved path, so every path to it finds the target.
func sourceKey(dir string) string {
	if resolved, err := filepath.EvalSymlinks(dir); err == nil {
		return resolved
	}
	return filepath.Clean(dir)
}

// targetOf returns the write target of the source directory dir, or nil.
func (f *FS) targetOf(dir string) *target {
	if !f.opts.Writable {
		return nil
	}
	f.mu.Lock()
	n := len(f.targets)
	f.mu.Unlock()
	if n == 0 {
		return nil
	}
	key := sourceKey(dir)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.targets[key]
}

// cleanStale removes the spool a killed ckptfs left in dir, once per
// directory and mount, in writable mounts only.
func (f *FS) cleanStale(dir string) {
	if !f.opts.Writable {
		return
	}
	key := sourceKey(dir)
	f.mu.Lock()
	done := f.cleaned[key] || f.targets[key] != nil
	f.cleaned[key] = true
	f.mu.Unlock()
	if done {
		return
	}
	removed, err := hfwrite.CleanStale(dir)
	switch {
	case err != nil:
		f.log.Error("stale spool not removed", "dir", dir, "err", err)
	case removed:
		f.log.Warn("removed the spool of an interrupted write", "dir", dir)
	}
}

// writable reports whether mkdir is allowed in d: a writable mount, and d
// is not an existing (read-only) checkpoint.
func (d *Dir) writable() bool {
	if !d.fsys.opts.Writable {
		return false
	}
	if d.fsys.targetOf(d.real) != nil {
		return true
	}
	_, isCkpt := d.detect()
	return !isCkpt
}

// currentView returns the view of what is committed in t, rebuilt after
// each commit, and the serial number of that build; nil before the first
// tensor is committed.
func (t *target) currentView(f *FS) (*viewEntry, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w.Tensors() == 0 {
		return nil, 0
	}
	gen := t.w.Generation()
	if t.view != nil && t.viewGen == gen && !t.stale {
		return t.view, t.serial
	}
	// The outdated view is dropped: nodes and handles that still use it keep
	// it alive, and its shard files are closed when it is collected.
	e := &viewEntry{}
	f.build(e, t.rel)
	t.view, t.viewGen, t.stale = e, gen, false
	t.serial++
	return e, t.serial
}

// invalidate makes the next listing rebuild the view.
func (t *target) invalidate() {
	t.mu.Lock()
	t.stale = true
	t.mu.Unlock()
}

// takeView detaches the current view (at unmount).
func (t *target) takeView() *viewEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.view
	t.view = nil
	return e
}

// targetChildren adds the entries of a write target that do not come from
// its source listing: files being written (they shadow any other entry of
// the same name), then the view of what is committed.
func (d *Dir) targetChildren(t *target, add func(entry)) {
	t.mu.Lock()
	for name, up := range t.uploads {
		if up.node == nil {
			continue // an existing file being rewritten: its entry shows
		}
		node := up.node
		add(entry{name: name, mode: syscall.S_IFREG, volatile: true, ino: up.ino, make: func() fs.InodeEmbedder { return node }})
	}
	t.mu.Unlock()
	e, serial := t.currentView(d.fsys)
	if e == nil {
		return
	}
	viewIno := func(name string) uint64 {
		return inode(filepath.Join(d.rel, name) + "\x00view" + strconv.FormatUint(serial, 10))
	}
	if e.err != nil {
		msg := []byte("ckptfs could not show this checkpoint:\n" + e.err.Error() + "\n")
		add(entry{name: errorName, mode: syscall.S_IFREG, volatile: true, ino: viewIno(errorName),
			make: func() fs.InodeEmbedder { return &memFile{data: msg} }})
		return
	}
	for _, vf := range e.view.Files {
		vf, id := vf, e.ids[vf.Name]
		ino := viewIno(vf.Name)
		add(entry{name: vf.Name, mode: syscall.S_IFREG, volatile: true, ino: ino, make: func() fs.InodeEmbedder {
			return &targetViewFile{ViewFile: ViewFile{fsys: d.fsys, file: vf, id: id}, t: t}
		}})
	}
}

var (
	_ = (fs.NodeMkdirer)((*Dir)(nil))
	_ = (fs.NodeCreater)((*Dir)(nil))
	_ = (fs.NodeUnlinker)((*Dir)(nil))
	_ = (fs.NodeRenamer)((*Dir)(nil))
	_ = (fs.NodeSetattrer)((*Dir)(nil))
)

// Mkdir creates a write target.
func (d *Dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !d.writable() {
		return nil, syscall.EROFS
	}
	if d.rel == "" && name == statsName {
		return nil, syscall.EEXIST
	}
	if name == hfwrite.SpoolDir {
		return nil, syscall.EPERM
	}
	real := filepath.Join(d.real, name)
	if err := os.Mkdir(real, 0o755); err != nil {
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	w, err := hfwrite.Create(real, d.fsys.opts.Target)
	if err != nil {
		os.Remove(real)
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	rel := filepath.Join(d.rel, name)
	t := &target{w: w, dir: real, rel: rel, uploads: map[string]*upload{}}
	key := sourceKey(real)
	d.fsys.mu.Lock()
	closed := d.fsys.closed
	if !closed {
		d.fsys.targets[key] = t
		d.fsys.cleaned[key] = true
	}
	d.fsys.mu.Unlock()
	if closed {
		w.Close()
		return nil, syscall.EROFS
	}
	node := &Dir{fsys: d.fsys, real: real, rel: rel}
	child := d.NewInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: inode(rel)})
	var attr fuse.AttrOut
	if errno := node.Getattr(ctx, nil, &attr); errno != 0 {
		return nil, errno
	}
	out.Attr = attr.Attr
	out.SetEntryTimeout(time.Second)
	out.SetAttrTimeout(time.Second)
	return child, 0
}

// Create starts writing a new file in a write target.
func (d *Dir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	t := d.fsys.targetOf(d.real)
	if t == nil {
		return nil, nil, 0, syscall.EROFS
	}
	up, errno := t.start(d.fsys, name, true)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	child := d.NewInode(ctx, up.node, fs.StableAttr{Mode: syscall.S_IFREG, Ino: up.ino})
	h := up.open(true)
	up.attr(&out.Attr)
	out.SetEntryTimeout(volatileTimeout)
	out.SetAttrTimeout(volatileTimeout)
	return child, h, fuse.FOPEN_DIRECT_IO, 0
}

// Unlink removes a stored sidecar of a write target, or drops a file being
// written (its writer's close then fails). Committed tensors stay.
func (d *Dir) Unlink(ctx context.Context, name string) syscall.Errno {
	t := d.fsys.targetOf(d.real)
	if t == nil {
		return syscall.EROFS
	}
	t.mu.Lock()
	up := t.uploads[name]
	if up != nil {
		delete(t.uploads, name)
		t.mu.Unlock()
		up.file.Abort()
		return 0
	}
	t.mu.Unlock()
	if kind, err := hfwrite.KindOf(name); err != nil || kind != hfwrite.KindSidecar {
		if d.shows(name) {
			return syscall.EPERM
		}
		return syscall.ENOENT
	}
	if err := os.Remove(filepath.Join(t.dir, name)); err != nil {
		return toErrno(d.fsys.log, "unlink "+filepath.Join(t.dir, name), err)
	}
	t.invalidate()
	return 0
}

// Rename within a write target supports the write-to-temp-then-rename
// pattern (safetensors' save_file renames its open temp file; others close
// it first): a file being written takes the new name, and so is committed
// as that kind of file when closed; a stored file renamed to a safetensors
// or index name is committed then (EIO when it cannot be). Committed tensors
// cannot be renamed (EPERM); renames across directories are EXDEV, so that
// mv falls back to copying.
func (d *Dir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	const renameNoReplace = 1
	t := d.fsys.targetOf(d.real)
	if t == nil {
		return syscall.EROFS
	}
	np, ok := newParent.(*Dir)
	if !ok || d.fsys.targetOf(np.real) != t {
		return syscall.EXDEV
	}
	if flags&^renameNoReplace != 0 {
		return syscall.EINVAL
	}
	if flags&renameNoReplace != 0 && d.shows(newName) {
		return syscall.EEXIST
	}
	if name == newName {
		return 0
	}
	t.mu.Lock()
	up := t.uploads[name]
	if up != nil {
		if t.uploads[newName] != nil {
			t.mu.Unlock()
			return syscall.EBUSY
		}
		if err := up.file.Rename(newName); err != nil {
			t.mu.Unlock()
			return toErrno(d.fsys.log, "rename "+filepath.Join(t.dir, name), err)
		}
		delete(t.uploads, name)
		t.uploads[newName] = up
		t.mu.Unlock()
		// A complete safetensors file renamed into place is committed now,
		// so that rename(2) reports a failure: safetensors' save_file never
		// checks close. A file still incomplete commits at close.
		if up.file.Complete() {
			if err := up.commit(); err != nil {
				return toErrnoLogged(err)
			}
		}
		return 0
	}
	busy := t.uploads[newName] != nil
	t.mu.Unlock()
	if busy {
		return syscall.EBUSY
	}
	if k, err := hfwrite.KindOf(name); err != nil || k != hfwrite.KindSidecar {
		if d.shows(name) {
			return syscall.EPERM
		}
		return syscall.ENOENT
	}
	if fi, err := os.Lstat(filepath.Join(t.dir, name)); err != nil || !fi.Mode().IsRegular() {
		return syscall.ENOENT
	}
	err := t.w.RenameStored(name, newName)
	t.invalidate()
	if err != nil {
		return toErrno(d.fsys.log, "rename "+filepath.Join(t.dir, name), err)
	}
	return 0
}

// shows reports whether d lists name.
func (d *Dir) shows(name string) bool {
	kids, errno := d.children(name)
	if errno != 0 {
		return false
	}
	for _, e := range kids {
		if e.name == name {
			return true
		}
	}
	return false
}

// Setattr on a directory: time and mode changes are accepted and ignored in
// a writable directory (cp -p, shutil.copytree), refused elsewhere.
func (d *Dir) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !d.writable() {
		return syscall.EROFS
	}
	return d.Getattr(ctx, fh, out)
}

// start registers a new upload of name in t. With node, the upload gets
// its own inode (a file created by Create).
func (t *target) start(f *FS, name string, node bool) (*upload, syscall.Errno) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.uploads[name]; busy {
		return nil, syscall.EBUSY
	}
	file, err := t.w.NewFile(name)
	if err != nil {
		return nil, toErrno(f.log, "create "+filepath.Join(t.dir, name), err)
	}
	t.seq++
	up := &upload{fsys: f, t: t, file: file, mtime: time.Now()}
	if node {
		up.node = &writeNode{up: up}
		up.ino = inode(filepath.Join(t.rel, name) + "\x00upload" + strconv.FormatUint(t.seq, 10))
	}
	t.uploads[name] = up
	return up, 0
}

// openForWrite starts rewriting the existing file name of t through a node
// that is not a writeNode (a view file or a stored sidecar). A sidecar's
// spool starts as a copy of it unless opened with O_TRUNC (the mount
// negotiates atomic O_TRUNC); a tensor file starts empty.
func (t *target) openForWrite(f *FS, name string, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	up, errno := t.start(f, name, false)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		up.markDirty()
	} else if up.file.Kind() == hfwrite.KindSidecar {
		if err := copyInto(up.file, filepath.Join(t.dir, name)); err != nil {
			t.forget(up)
			up.file.Abort()
			return nil, 0, toErrno(f.log, "open "+filepath.Join(t.dir, name), err)
		}
	}
	return up.open(false), fuse.FOPEN_DIRECT_IO, 0
}

// forget removes up from the files being written, if it is still there.
func (t *target) forget(up *upload) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.uploads[up.file.Name()] == up {
		delete(t.uploads, up.file.Name())
	}
}

func copyInto(dst *hfwrite.File, src string) error {
	in, err := os.Open(src)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer in.Close()
	_, err = io.Copy(io.NewOffsetWriter(dst, 0), in)
	return err
}

// upload is one file being written into a target.
type upload struct {
	fsys  *FS
	t     *target
	file  *hfwrite.File
	node  *writeNode // nil when an existing node was opened for writing
	ino   uint64
	mtime time.Time

	mu       sync.Mutex
	handles  int  // GUARDED_BY(mu): open handles
	dirty    bool // GUARDED_BY(mu): written, truncated or created
	finished bool // GUARDED_BY(mu): committed or dropped
}

func (u *upload) open(created bool) *writeHandle {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handles++
	if created {
		u.dirty = true
	}
	return &writeHandle{up: u}
}

func (u *upload) markDirty() {
	u.mu.Lock()
	u.dirty = true
	u.mu.Unlock()
}

func (u *upload) path() string { return filepath.Join(u.t.dir, u.file.Name()) }

// commit commits the file once, logging a failure; every call returns the
// result (map it with toErrnoLogged).
func (u *upload) commit() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.finished {
		u.finished = true
		start := time.Now()
		err := u.file.Commit()
		if observe := u.fsys.opts.CommitObserver; observe != nil {
			observe(time.Since(start), err)
		}
		u.t.forget(u)
		if err != nil {
			u.fsys.commitErrors.Add(1)
			toErrno(u.fsys.log, "commit "+u.path(), err)
		} else {
			u.fsys.commits.Add(1)
			size, _ := u.file.Size()
			u.fsys.log.Debug("committed", "file", u.path(), "bytes", size, "took", time.Since(start).Round(time.Millisecond),
				"written_in", start.Sub(u.mtime).Round(time.Millisecond), "eager", u.file.Eager())
		}
	}
	_, err := u.file.Done()
	return err
}

// release drops a handle; the last one commits a file that was changed but
// never flushed, and drops one that was not changed.
func (u *upload) release() {
	u.mu.Lock()
	u.handles--
	last := u.handles == 0 && !u.finished
	dirty := u.dirty
	u.mu.Unlock()
	if !last {
		return
	}
	if !dirty {
		u.mu.Lock()
		u.finished = true
		u.mu.Unlock()
		u.t.forget(u)
		u.file.Abort()
		return
	}
	u.commit() // logs a failure; nobody else can be told
}

func (u *upload) attr(a *fuse.Attr) syscall.Errno {
	size, err := u.file.Size()
	if err != nil {
		return toErrno(u.fsys.log, "stat "+u.path(), err)
	}
	setAttr(a, u.mtime, size, syscall.S_IFREG|0o644)
	return 0
}

// truncate changes the size of the file being written.
func (u *upload) truncate(size uint64) syscall.Errno {
	if err := u.file.Truncate(int64(size)); err != nil {
		return toErrno(u.fsys.log, "truncate "+u.path(), err)
	}
	u.markDirty()
	return 0
}

// writeNode is a file created in a write target, until it is committed.
type writeNode struct {
	fs.Inode
	up *upload
}

var (
	_ = (fs.NodeGetattrer)((*writeNode)(nil))
	_ = (fs.NodeSetattrer)((*writeNode)(nil))
	_ = (fs.NodeOpener)((*writeNode)(nil))
)

func (n *writeNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(volatileTimeout)
	return n.up.attr(&out.Attr)
}

func (n *writeNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		if errno := n.up.truncate(size); errno != 0 {
			return errno
		}
	}
	return n.Getattr(ctx, fh, out)
}

func (n *writeNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.up.mu.Lock()
	finished := n.up.finished
	n.up.mu.Unlock()
	if finished {
		return nil, 0, syscall.ESTALE // committed: the name now shows what was committed
	}
	if flags&syscall.O_TRUNC != 0 && flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		if errno := n.up.truncate(0); errno != 0 {
			return nil, 0, errno
		}
	}
	return n.up.open(false), fuse.FOPEN_DIRECT_IO, 0
}

// writeHandle is one open of a file being written.
type writeHandle struct {
	up *upload

	mu    sync.Mutex
	wrote bool // GUARDED_BY(mu): data was written through this handle
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

func (h *writeHandle) setWrote() {
	h.mu.Lock()
	h.wrote = true
	h.mu.Unlock()
	h.up.markDirty()
}

func (h *writeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := h.up.file.WriteAt(data, off)
	if n > 0 || err == nil {
		h.setWrote()
	}
	if err != nil {
		return uint32(n), toErrno(h.up.fsys.log, "write "+h.up.path(), err)
	}
	return uint32(n), 0
}

func (h *writeHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.up.file.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, toErrno(h.up.fsys.log, "read "+h.up.path(), err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Flush is close(2): a handle that wrote commits the file and returns the
// result.
func (h *writeHandle) Flush(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	wrote := h.wrote
	h.mu.Unlock()
	if !wrote {
		return 0
	}
	return toErrnoLogged(h.up.commit())
}

func (h *writeHandle) Release(ctx context.Context) syscall.Errno {
	h.up.release()
	return 0
}

// Fsync does nothing: nothing is durable, or visible, before the file is
// closed, and close makes it durable.
func (h *writeHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

func (h *writeHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	out.SetTimeout(volatileTimeout)
	return h.up.attr(&out.Attr)
}

func (h *writeHandle) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		if errno := h.up.truncate(size); errno != 0 {
			return errno
		}
	}
	return h.Getattr(ctx, out)
}

// targetViewFile is a file of a write target's view: read like any view
// file; opening it for writing starts writing a new file of that name.
type targetViewFile struct {
	ViewFile
	t *target
}

var (
	_ = (fs.NodeOpener)((*targetViewFile)(nil))
	_ = (fs.NodeGetattrer)((*targetViewFile)(nil))
	_ = (fs.NodeSetattrer)((*targetViewFile)(nil))
)

func (f *targetViewFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return f.t.openForWrite(f.fsys, f.file.Name, flags)
	}
	return f.ViewFile.Open(ctx, flags)
}

func (f *targetViewFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Getattr(ctx, out)
	}
	errno := f.ViewFile.Getattr(ctx, fh, out)
	if f.file.Kind == layout.KindPassthrough {
		out.Mode = syscall.S_IFREG | 0o644 // a stored file: it may be rewritten
	}
	out.SetTimeout(volatileTimeout)
	return errno
}

func (f *targetViewFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.t.setattr(ctx, f.file.Name, fh, in, out, f.Getattr)
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
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return f.t.openForWrite(f.fsys, f.name, flags)
	}
	return f.PassFile.Open(ctx, flags)
}

func (f *sidecarNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Getattr(ctx, out)
	}
	errno := f.PassFile.Getattr(ctx, fh, out)
	out.Mode = syscall.S_IFREG | 0o644
	out.SetTimeout(volatileTimeout)
	return errno
}

func (f *sidecarNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.t.setattr(ctx, f.name, fh, in, out, f.Getattr)
}

// setattr on an existing file of t: a size change goes to the file being
// written under that name (through fh, or by path); time and mode changes
// are accepted and ignored (cp -p); truncating a committed file is refused.
func (t *target) setattr(ctx context.Context, name string, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut,
	getattr func(context.Context, fs.FileHandle, *fuse.AttrOut) syscall.Errno) syscall.Errno {
	if h, ok := fh.(*writeHandle); ok {
		return h.Setattr(ctx, in, out)
	}
	if size, ok := in.GetSize(); ok {
		t.mu.Lock()
		up := t.uploads[name]
		t.mu.Unlock()
		if up == nil {
			return syscall.EROFS
		}
		if errno := up.truncate(size); errno != 0 {
			return errno
		}
		out.SetTimeout(volatileTimeout)
		return up.attr(&out.Attr)
	}
	return getattr(ctx, fh, out)
}
