package vfs

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/source"
)

// The write path: go-fuse nodes over hfwrite sessions. In a writable mount,
// mkdir creates a write target: a new source directory that an
// hfwrite.Session turns into a DCP checkpoint, one closed file at a time.
// What the directory shows, and what each operation on it may do, is the
// session's (its package doc lists the rules); this file maps them onto
// nodes, handles, inode numbers and timeouts. A directory stays a write
// target for the life of the mount; after a remount it is an ordinary,
// read-only checkpoint.
//
// Every entry in a write target is volatile (the kernel caches it for a
// jiffy) because any commit may change it, and each view the session
// builds gets fresh inode numbers, so nothing stale is served from the
// kernel's caches.
//
// Lock order: target.mu, then FS.mu; the session's locks are taken inside
// its calls.

// volatileTimeout is the entry and attr timeout of everything in a write
// target. go-fuse replaces a zero timeout by the mount default, so the
// smallest non-zero one is used: the kernel rounds it up to one jiffy.
const volatileTimeout = time.Nanosecond

// target is a directory created by mkdir in a writable mount.
type target struct {
	s   *hfwrite.Session
	rel string // path inside the mount
	// uid and gid own the target and all it holds: whoever created it.
	uid, gid uint32

	mu   sync.Mutex
	view *hfwrite.View     // GUARDED_BY(mu): the last view listed (for stats; not a reference)
	ids  map[string]uint64 // GUARDED_BY(mu): cache ids of its files
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

// reportCommit counts and logs the outcome of a commit (hfwrite's
// Options.OnCommit).
func (f *FS) reportCommit(r hfwrite.Report) {
	if errors.Is(r.Err, hfwrite.ErrEmpty) {
		f.log.Warn("empty file not committed (a tensor file or index needs content)", "file", r.Path)
		return
	}
	if observe := f.opts.CommitObserver; observe != nil {
		observe(r.Took, r.Err)
	}
	if r.Err != nil {
		f.commitErrors.Add(1)
		toErrno(f.log, "commit "+r.Path, r.Err)
		return
	}
	f.commits.Add(1)
	f.log.Debug("committed", "file", r.Path, "bytes", r.Size, "took", r.Took.Round(time.Millisecond),
		"written_in", time.Since(r.Started).Round(time.Millisecond), "eager", r.Eager)
}

// hidden returns what children leaves out of the source entries ents of a
// directory that is not a write target (with only != "", ents is at most
// that name): its format's internals, any write session's spool, and,
// beside a spool (a killed session's, or another mount's), the DCP files
// the session was writing: in every mode. It removes nothing (see
// sweepStale).
func (d *Dir) hidden(format ckpt.Reader, ents []source.Info, only string) func(name string) bool {
	spool := false
	switch {
	case only == "":
		for _, e := range ents {
			spool = spool || e.Name == hfwrite.SpoolDir
		}
	case hfwrite.Hidden(only):
		_, err := d.fsys.tree.Stat(path.Join(d.name(), hfwrite.SpoolDir))
		spool = err == nil
	}
	return func(name string) bool {
		return name == hfwrite.SpoolDir || (format != nil && format.Internal(name)) || (spool && hfwrite.Hidden(name))
	}
}

// sweepStale removes what killed write sessions left in dir and in its
// subdirectories. Removing is a write: lookups and listings only hide that
// debris, and a mount removes it where it writes, after each mkdir, in the
// directory written into (not the whole source, which may be large), once
// per directory and mount, on a goroutine of its own so that no FUSE
// request waits on it. A mount that only reads leaves the disk as it found
// it.
//
// rel is the directory's name in the source; the caller has added the run
// to f.sweeps.
func (f *FS) sweepStale(rel string) {
	defer f.sweeps.Done()
	dir := path.Join(".", rel)
	ents, err := f.wroot.ReadDir(dir)
	if err != nil {
		f.log.Error("stale spools not looked for", "err", err)
		return
	}
	dirs := []string{dir}
	for _, e := range ents {
		// Links are not followed; the mountpoint would be a request to
		// this mount.
		if sub := path.Join(dir, e.Name()); e.IsDir() && e.Name() != hfwrite.SpoolDir && f.wroot.Path(sub) != f.mountpoint {
			dirs = append(dirs, sub)
		}
	}
	for _, sub := range dirs {
		if _, err := f.wroot.Lstat(path.Join(sub, hfwrite.SpoolDir)); err == nil {
			f.cleanStale(sub)
		}
	}
}

// cleanStale removes what a killed session left in the source directory
// rel (hfwrite.CleanStale), once per directory and mount, unless it is one
// of the mount's write targets or the mount was closed.
func (f *FS) cleanStale(rel string) {
	dir := f.wroot.Path(rel)
	key := sourceKey(dir)
	f.mu.Lock()
	done := f.closed || f.cleaned[key] || f.targets[key] != nil
	f.cleaned[key] = true
	f.mu.Unlock()
	if done {
		return
	}
	sub, err := f.wroot.Sub(rel)
	removed := false
	if err == nil {
		removed, err = hfwrite.CleanStale(sub)
		sub.Close()
	}
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
	_, isCkpt, err := d.detect()
	return err == nil && !isCkpt
}

// targetChildren lists a write target (see Dir.children): the files being
// written, the view of what is committed (or the error that keeps it from
// showing), the stored files and the subdirectories.
func (d *Dir) targetChildren(t *target, only string) ([]entry, syscall.Errno) {
	l, err := t.s.Entries(only)
	if err != nil {
		return nil, toErrno(d.fsys.log, "readdir "+d.real, err)
	}
	defer l.View.Release()
	var out []entry
	shown := map[string]bool{}
	add := func(e entry) {
		if !shown[e.name] && (only == "" || e.name == only) {
			shown[e.name] = true
			e.volatile = true
			out = append(out, e)
		}
	}
	for _, f := range l.Writing {
		add(entry{name: f.Name(), mode: syscall.S_IFREG, ino: inode(path.Join(t.rel, f.Name()) + "\x00upload" + strconv.FormatUint(f.Seq(), 10)),
			make: func() fs.InodeEmbedder { return &writeNode{fsys: d.fsys, f: f, t: t} }})
	}
	if v := l.View; v != nil {
		ids := t.idsOf(d.fsys, v)
		ino := func(name string) uint64 {
			return inode(path.Join(t.rel, name) + "\x00view" + strconv.FormatUint(v.Serial, 10))
		}
		if v.Err != nil {
			msg := []byte("ckptfs could not show this checkpoint:\n" + v.Err.Error() + "\n")
			add(entry{name: errorName, mode: syscall.S_IFREG, ino: ino(errorName), make: func() fs.InodeEmbedder {
				return &memFile{data: msg, access: t.access(0o444)}
			}})
		} else {
			for _, vf := range v.Files {
				id := ids[vf.Name]
				add(entry{name: vf.Name, mode: syscall.S_IFREG, ino: ino(vf.Name), make: func() fs.InodeEmbedder {
					return &targetViewFile{ViewFile: ViewFile{fsys: d.fsys, file: vf, id: id}, t: t, v: v}
				}})
			}
		}
	}
	for _, name := range l.Stored {
		rel := path.Join(d.rel, name)
		add(entry{name: name, mode: syscall.S_IFREG, make: func() fs.InodeEmbedder {
			return &sidecarNode{PassFile: PassFile{fsys: d.fsys, rel: rel}, t: t, name: name}
		}})
	}
	for _, name := range l.Dirs {
		real, rel := filepath.Join(d.real, name), path.Join(d.rel, name)
		add(entry{name: name, mode: syscall.S_IFDIR, make: func() fs.InodeEmbedder { return &Dir{fsys: d.fsys, real: real, rel: rel} }})
	}
	return out, 0
}

// idsOf returns the cache ids of the files of v, giving them fresh ones
// the first time v is listed.
func (t *target) idsOf(f *FS, v *hfwrite.View) map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.view != v {
		t.view, t.ids = v, map[string]uint64{}
		if v.View != nil {
			for _, vf := range v.Files {
				t.ids[vf.Name] = f.nextID.Add(1)
			}
		}
	}
	return t.ids
}

// stats describes the target's last listed view.
func (t *target) stats() ViewStats {
	vs := ViewStats{Dir: t.s.Path(), Writing: true}
	t.mu.Lock()
	defer t.mu.Unlock()
	if v := t.view; v != nil && v.View != nil {
		vs.Format = string(v.Checkpoint.Format)
		vs.Files, vs.Tensors, vs.Bytes = len(v.Files), len(v.Tensors), v.TotalSize()
	}
	return vs
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
	if err := hfwrite.CheckName(name); err != nil {
		return nil, toErrno(d.fsys.log, "mkdir "+filepath.Join(d.real, name), err)
	}
	real, rel := filepath.Join(d.real, name), path.Join(d.rel, name)
	tree, err := source.Sub(d.fsys.tree, rel) // the target as its view reads it
	if err != nil {
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	w, errno := d.mayCreate(ctx, "mkdir", name)
	if errno != 0 {
		return nil, errno
	}
	// Created through its parent, handed to the writer (as.go); the
	// session's files, through root, too. The mounter keeps rwx: the
	// session writes there.
	parent, mk := d.fsys.wroot, rel
	if w.handOver {
		mk = name
		if parent, err = d.fsys.wroot.Sub(path.Join(".", d.rel)); err != nil {
			return nil, toErrno(d.fsys.log, "mkdir "+real, err)
		}
		defer parent.Close()
		parent.Own(w.uid, w.gid)
	}
	if err := parent.Mkdir(mk, os.FileMode(mode&0o777|0o700)); err != nil {
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	root, err := parent.Sub(mk)
	if err != nil {
		d.fsys.wroot.Remove(rel)
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	s, err := hfwrite.CreateIn(root, hfwrite.Options{
		Target:   d.fsys.opts.Target,
		Tree:     tree,
		Plan:     d.fsys.opts.Plan,
		OnCommit: d.fsys.reportCommit,
		Limits:   d.fsys.limits,
	})
	if err != nil {
		d.fsys.wroot.Remove(rel)
		return nil, toErrno(d.fsys.log, "mkdir "+real, err)
	}
	key := sourceKey(real)
	d.fsys.mu.Lock()
	closed := d.fsys.closed
	sweep := !closed && !d.fsys.swept[d.rel]
	if !closed {
		uid, gid := w.owner()
		d.fsys.targets[key] = &target{s: s, rel: rel, uid: uid, gid: gid}
		d.fsys.cleaned[key] = true
	}
	if sweep {
		d.fsys.swept[d.rel] = true
		d.fsys.sweeps.Add(1)
	}
	d.fsys.mu.Unlock()
	if closed {
		s.Close()
		return nil, syscall.EROFS
	}
	if sweep {
		go d.fsys.sweepStale(d.rel)
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
	if _, errno := d.mayCreate(ctx, "create", name); errno != 0 {
		return nil, nil, 0, errno
	}
	h, err := t.s.Create(name)
	if err != nil {
		return nil, nil, 0, toErrno(d.fsys.log, "create "+filepath.Join(d.real, name), err)
	}
	f := h.File()
	node := &writeNode{fsys: d.fsys, f: f, t: t}
	child := d.NewInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFREG,
		Ino: inode(path.Join(t.rel, name) + "\x00upload" + strconv.FormatUint(f.Seq(), 10))})
	node.attr(&out.Attr)
	out.SetEntryTimeout(volatileTimeout)
	out.SetAttrTimeout(volatileTimeout)
	return child, &writeHandle{fsys: d.fsys, h: h, t: t}, fuse.FOPEN_DIRECT_IO, 0
}

// Unlink removes a name of a write target (hfwrite.Session.Remove).
func (d *Dir) Unlink(ctx context.Context, name string) syscall.Errno {
	t := d.fsys.targetOf(d.real)
	if t == nil {
		return syscall.EROFS
	}
	return toErrno(d.fsys.log, "unlink "+filepath.Join(d.real, name), t.s.Remove(name))
}

// Rename within a write target (hfwrite.Session.Rename). Renames across
// directories are EXDEV, so that mv falls back to copying.
func (d *Dir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	t := d.fsys.targetOf(d.real)
	if t == nil {
		return syscall.EROFS
	}
	np, ok := newParent.(*Dir)
	if !ok || d.fsys.targetOf(np.real) != t {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	err := t.s.Rename(name, newName, flags&unix.RENAME_NOREPLACE != 0)
	if errors.Is(err, hfwrite.ErrCommit) {
		return toErrnoLogged(err) // reported by the session
	}
	return toErrno(d.fsys.log, "rename "+filepath.Join(d.real, name), err)
}

// Setattr on a directory: time and mode changes are accepted and ignored in
// a writable directory (cp -p, shutil.copytree), refused elsewhere.
func (d *Dir) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !d.writable() {
		return syscall.EROFS
	}
	return d.Getattr(ctx, fh, out)
}
