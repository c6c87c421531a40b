package source

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Local is a directory of the local filesystem, confined with os.Root.
type Local struct {
	root *os.Root
	dir  string // absolute, symlink-resolved
	name string // as given, for messages
}

var _ Tree = (*Local)(nil)

// OpenLocal opens the directory dir as a tree.
func OpenLocal(dir string) (*Local, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if resolved, err := filepath.EvalSymlinks(abs); err == nil {
		abs = resolved
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, err
	}
	return &Local{root: root, dir: abs, name: filepath.Clean(dir)}, nil
}

// Dir is the absolute, symlink-resolved path of the tree's top.
func (l *Local) Dir() string { return l.dir }

// Close releases the tree's directory handle.
func (l *Local) Close() error { return l.root.Close() }

// Path is the local path of name, under the directory as it was given.
func (l *Local) Path(name string) string { return filepath.Join(l.name, filepath.FromSlash(name)) }

// Open opens a regular file. It opens non-blocking and checks the type with
// fstat before any read, so a FIFO planted where a shard or a small JSON is
// expected fails at once instead of hanging the caller.
func (l *Local) Open(name string) (File, error) {
	name, err := l.resolve(name)
	if err != nil {
		return nil, err
	}
	f, err := l.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, l.pathError("open", name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, l.pathError("open", name, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotRegular, l.Path(name), typeName(fi.Mode()))
	}
	st, _ := stampOf(fi.Sys())
	info := infoOf(path.Base(name), fi)
	info.Access = withACL(info.Access, fdHasACL(int(f.Fd())))
	return &localFile{f: f, path: l.Path(name), info: info, stamp: st, inMemory: inMemory(f)}, nil
}

func (l *Local) Stat(name string) (Info, error) {
	name, err := l.resolve(name)
	if err != nil {
		return Info{}, err
	}
	fi, err := l.root.Stat(name)
	if err != nil {
		return Info{}, l.pathError("stat", name, err)
	}
	info := infoOf(path.Base(name), fi)
	info.Access = l.throughLinks(name, withACL(info.Access, pathHasACL(l.real(name))))
	return info, nil
}

func (l *Local) ReadDir(name string) ([]Info, error) {
	name, err := l.resolve(name)
	if err != nil {
		return nil, err
	}
	d, err := l.root.Open(name)
	if err != nil {
		return nil, l.pathError("readdir", name, err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, l.pathError("readdir", name, err)
	}
	out := make([]Info, 0, len(ents))
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			info, err := l.Stat(path.Join(name, e.Name()))
			if err != nil {
				// Dangling, or leading outside: listed as a link that
				// cannot be followed, so a reader can say why.
				info = Info{Mode: fs.ModeSymlink}
			}
			info.Name = e.Name()
			out = append(out, info)
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed while listing
		}
		info := infoOf(e.Name(), fi)
		info.Access = withACL(info.Access, pathHasACL(l.real(path.Join(name, e.Name()))))
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// real is the local path of the resolved name, for the one call os.Root
// does not make (getxattr, which only reads). A name replaced between the
// stat and it is a source changing under the mount, as for any two reads.
func (l *Local) real(name string) string { return filepath.Join(l.dir, filepath.FromSlash(name)) }

// pathError names the file by its full path. os.Root reports a name that
// resolves outside the tree with an unexported error, the only one of its
// errors that is not an errno; it becomes ErrEscapes.
func (l *Local) pathError(op, name string, err error) error {
	return rootError(op, l.Path(name), err)
}

// rootError is the error of an os.Root operation on the file at path,
// whatever os.Root named it.
func rootError(op, path string, err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) && !errors.Is(err, ErrEscapes) {
		err = fmt.Errorf("%w (%v)", ErrEscapes, err)
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// maxLinks bounds symlink hops while resolving a name, as the kernel does.
const maxLinks = 40

// resolve cleans name and rewrites absolute symlinks that point inside the
// tree into tree-relative ones, which os.Root refuses to follow otherwise
// (DVC and some mirrors write absolute links). Everything is still opened
// through os.Root, so a link that leaves the tree fails there.
func (l *Local) resolve(name string) (string, error) {
	name, err := Clean(name)
	if err != nil {
		return "", err
	}
	if !l.hasAbsoluteLink(name) {
		return name, nil
	}
	parts := strings.Split(name, "/")
	done := "."
	for hops := 0; len(parts) > 0; {
		next := path.Join(done, parts[0])
		parts = parts[1:]
		fi, err := l.root.Lstat(next)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			done = next
			continue
		}
		if hops++; hops > maxLinks {
			return "", &fs.PathError{Op: "open", Path: l.Path(name), Err: syscall.ELOOP}
		}
		target, err := l.root.Readlink(next)
		if err != nil {
			return "", l.pathError("readlink", next, err)
		}
		if filepath.IsAbs(target) {
			rel, err := filepath.Rel(l.dir, filepath.Clean(target))
			if err != nil || !filepath.IsLocal(rel) && rel != "." {
				return "", &fs.PathError{Op: "open", Path: l.Path(name), Err: ErrEscapes}
			}
			target, done = filepath.ToSlash(rel), "."
		}
		rest, err := Clean(path.Join(done, target))
		if err != nil {
			return "", &fs.PathError{Op: "open", Path: l.Path(name), Err: ErrEscapes}
		}
		parts = append(strings.Split(rest, "/"), parts...)
		done = "."
	}
	return done, nil
}

// hasAbsoluteLink reports whether name fails to resolve because one of its
// components is a symlink with an absolute target. Names that resolve (or
// simply do not exist) cost one Stat.
func (l *Local) hasAbsoluteLink(name string) bool {
	if name == "." {
		return false
	}
	if _, err := l.root.Stat(name); err == nil || errors.Is(err, fs.ErrNotExist) {
		return false
	}
	for p := name; p != "."; p = path.Dir(p) {
		if target, err := l.root.Readlink(p); err == nil && filepath.IsAbs(target) {
			return true
		}
	}
	return false
}

type localFile struct {
	f     *os.File
	path  string
	info  Info
	stamp stamp // info's inode attributes, as Check compares them
	read  readRanges
	// inMemory: the file lives in memory (tmpfs, ramfs), so its pages are
	// the file itself and there is nothing to drop.
	inMemory bool
	drops    pendingDrops
}

func (f *localFile) Info() Info  { return f.info }
func (f *localFile) Fd() uintptr { return f.f.Fd() }

func (f *localFile) Close() error {
	f.drop(f.drops.flush())
	return f.f.Close()
}

// drop drops the pages of the ranges from the page cache.
func (f *localFile) drop(spans []span) {
	for _, s := range spans {
		_ = unix.Fadvise(int(f.f.Fd()), s.start, s.end-s.start, unix.FADV_DONTNEED)
	}
}

// ReadRandomly turns the kernel's read-ahead off for the file
// (FADV_RANDOM).
func (f *localFile) ReadRandomly() { _ = unix.Fadvise(int(f.f.Fd()), 0, 0, unix.FADV_RANDOM) }

// inMemory reports whether f is on a filesystem whose files are their
// pages (tmpfs, ramfs).
func inMemory(f *os.File) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC
}

// maxFolio is the largest page-cache folio on x86-64 (a PMD).
const maxFolio = 2 << 20

// minDrop is the smallest read whose pages are dropped: block fills are
// megabytes, and a syscall for each record header (tens of bytes, one per
// chunk) would cost more than the pages it frees.
const minDrop = 64 << 10

// ReadAt reads at off; a file found shorter than when it was opened is
// ErrChanged (a truncated shard), not a short read.
//
// The pages read are dropped from the page cache afterwards, in batches
// (pendingDrops): ckptfs reads a byte of a checkpoint once and serves it
// from its own cache or the view's pages, so keeping the shard's copy too
// would double the memory a load costs (a model's worth of shard pages
// beside a model's worth of view pages). Files in memory (tmpfs) keep
// theirs: their pages are the file.
func (f *localFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	f.readDone(off, int64(n))
	if err == io.EOF && off+int64(n) < f.info.Size {
		return n, fmt.Errorf("%w: %s truncated at %d (was %d bytes)", ErrChanged, f.path, off+int64(n), f.info.Size)
	}
	return n, err
}

// ReadvAt reads the range at off into parts with preadv, as ReadAt reads
// into one buffer (the same truncation error, the same page-cache drops).
func (f *localFile) ReadvAt(parts [][]byte, off int64) error {
	var want int64
	for _, p := range parts {
		want += int64(len(p))
	}
	start, done := off, int64(0)
	for done < want {
		parts = skipBytes(parts, 0) // empty parts first would read as end of file
		// At most IOV_MAX parts per call; the kernel may return fewer bytes.
		batch := parts[:min(len(parts), maxIovecs)]
		n, err := unix.Preadv(int(f.f.Fd()), batch, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: "read", Path: f.path, Err: err}
		}
		if n == 0 {
			return fmt.Errorf("%w: %s truncated at %d (was %d bytes)", ErrChanged, f.path, off, f.info.Size)
		}
		done, off = done+int64(n), off+int64(n)
		parts = skipBytes(parts, n)
	}
	f.readDone(start, want)
	return nil
}

// maxIovecs is IOV_MAX on Linux.
const maxIovecs = 1024

// skipBytes drops the first n bytes from parts. Parts read whole are
// dropped in place; a part read in part is resliced in a copy, so the
// caller's slice is left as it was.
func skipBytes(parts [][]byte, n int) [][]byte {
	for len(parts) > 0 && n >= len(parts[0]) {
		n -= len(parts[0])
		parts = parts[1:]
	}
	if n > 0 {
		parts = append([][]byte{parts[0][n:]}, parts[1:]...)
	}
	return parts
}

// readDone records n bytes read at off and drops the pages that can go.
// Small reads (record headers) are remembered too: their folios go with the
// fills around them.
func (f *localFile) readDone(off, n int64) {
	if n == 0 {
		return
	}
	lo, hi := f.read.add(off, off+n, f.info.Size, maxFolio)
	if n >= minDrop && !f.inMemory {
		f.drop(f.drops.add(lo, hi))
	}
}

// Check compares the open file's inode attributes with those at open: an
// in-place rewrite changes ctime even when mtime is restored (rsync
// --inplace -t), so it is caught.
// It runs after every batch of reads, so it compares the attributes
// themselves (an fstat into the stack), not Info.Version.
func (f *localFile) Check() error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.f.Fd()), &st); err != nil {
		return fmt.Errorf("source: %s: %w", f.path, err)
	}
	if now, _ := stampOf(&st); now != f.stamp {
		return fmt.Errorf("%w: %s was modified (size %d→%d)", ErrChanged, f.path, f.info.Size, st.Size)
	}
	return nil
}

// stamp is what an in-place rewrite, a replacement or a removal of a file
// changes: its inode, size, mtime or ctime. Info's ID and Version are it,
// formatted (infoOf).
type stamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

// stampOf is the stamp of a FileInfo's Sys(); false when it is not a
// Stat_t.
func stampOf(sys any) (stamp, bool) {
	st, ok := sys.(*syscall.Stat_t)
	if !ok {
		return stamp{}, false
	}
	return stamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, true
}

func infoOf(name string, fi fs.FileInfo) Info {
	info := Info{Name: name, Size: fi.Size(), ModTime: fi.ModTime(), Mode: fi.Mode().Type(), Access: accessOf(fi.Sys())}
	if s, ok := stampOf(fi.Sys()); ok {
		info.ID = fmt.Sprintf("%x:%x", s.dev, s.ino)
		info.Version = fmt.Sprintf("%s:%x:%x:%x", info.ID, s.size,
			time.Unix(s.mtime.Unix()).UnixNano(), time.Unix(s.ctime.Unix()).UnixNano())
	}
	return info
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0, m&fs.ModeCharDevice != 0:
		return "device"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "non-regular file"
}
