package source

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is a local directory opened for writing, confined with os.Root like
// Local: every name is resolved inside it, and no symlink, ".." or absolute
// name leads out. The write side (a write session, the DCP writer, export)
// creates, renames and removes only through a Dir, so a name that comes
// from a mount's user or from a checkpoint cannot reach another file.
// Errors name the file by its full path.
type Dir struct {
	root *os.Root
	path string
	// owner, when set (Own), is handed every file and directory created
	// through the Dir and its Subs.
	owner *owner
}

// owner is a uid and gid to hand what a Dir creates.
type owner struct{ uid, gid int }

// Own makes every file and directory created through d (and the Subs
// opened after) belong to uid:gid: a root mount's write target holds its
// writer's files, not root's.
func (d *Dir) Own(uid, gid int) { d.owner = &owner{uid, gid} }

// OpenDir opens the directory path for writing.
func OpenDir(path string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, err
	}
	return &Dir{root: root, path: abs}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Path is the full path of name, for messages.
func (d *Dir) Path(name string) string { return filepath.Join(d.path, filepath.FromSlash(name)) }

// Sub opens the directory name inside d, confined to it.
func (d *Dir) Sub(name string) (*Dir, error) {
	root, err := d.root.OpenRoot(name)
	if err != nil {
		return nil, d.err("open", name, err)
	}
	return &Dir{root: root, path: d.Path(name), owner: d.owner}, nil
}

// Mkdir creates the directory name.
func (d *Dir) Mkdir(name string, perm fs.FileMode) error {
	if err := d.root.Mkdir(name, perm); err != nil {
		return d.err("mkdir", name, err)
	}
	if err := d.chownDir(name); err != nil {
		d.root.Remove(name)
		return err
	}
	return nil
}

// chownDir hands the directory name, just created, to d's owner. It is
// opened from its parent without following a link (os.Root would follow
// one swapped in since the mkdir), and changed through that descriptor.
func (d *Dir) chownDir(name string) error {
	if d.owner == nil {
		return nil
	}
	parent, err := d.root.Open(path.Dir(name))
	if err != nil {
		return d.err("chown", name, err)
	}
	defer parent.Close()
	fd, err := unix.Openat(int(parent.Fd()), path.Base(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return d.err("chown", name, err)
	}
	defer unix.Close(fd)
	return d.err("chown", name, unix.Fchown(fd, d.owner.uid, d.owner.gid))
}

// MkdirTemp creates a new directory prefix+random and returns its name.
func (d *Dir) MkdirTemp(prefix string, perm fs.FileMode) (string, error) {
	for range 16 {
		var b [6]byte
		_, _ = rand.Read(b[:])
		name := prefix + hex.EncodeToString(b[:])
		err := d.root.Mkdir(name, perm)
		if err == nil {
			err = d.chownDir(name)
		}
		if !errors.Is(err, fs.ErrExist) {
			return name, d.err("mkdir", name, err)
		}
	}
	return "", d.err("mkdir", prefix+"*", syscall.EEXIST)
}

// Create creates the file name, which must not exist, for reading and
// writing.
func (d *Dir) Create(name string, perm fs.FileMode) (*os.File, error) {
	return d.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
}

// OpenFile opens name as os.OpenFile does.
// A file it may create is handed to d's owner (Own).
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := d.root.OpenFile(name, flag, perm)
	if err != nil {
		return nil, d.err("open", name, err)
	}
	if d.owner != nil && flag&os.O_CREATE != 0 {
		if err := f.Chown(d.owner.uid, d.owner.gid); err != nil {
			f.Close()
			return nil, d.err("chown", name, err)
		}
	}
	return f, nil
}

// Open opens name for reading.
func (d *Dir) Open(name string) (*os.File, error) { return d.OpenFile(name, os.O_RDONLY, 0) }

// Rename renames oldName to newName, both inside d.
func (d *Dir) Rename(oldName, newName string) error {
	return d.err("rename", oldName, d.root.Rename(oldName, newName))
}

// Remove removes the file or empty directory name.
func (d *Dir) Remove(name string) error { return d.err("remove", name, d.root.Remove(name)) }

// RemoveAll removes name and what it holds; a missing name is no error.
func (d *Dir) RemoveAll(name string) error { return d.err("remove", name, d.root.RemoveAll(name)) }

// Lstat returns name's FileInfo, not following a final symlink.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	fi, err := d.root.Lstat(name)
	return fi, d.err("lstat", name, err)
}

// ReadDir lists the directory name, sorted by name.
func (d *Dir) ReadDir(name string) ([]fs.DirEntry, error) {
	ents, err := fs.ReadDir(d.root.FS(), name)
	return ents, d.err("readdir", name, err)
}

// Chtimes sets name's access and modification times.
func (d *Dir) Chtimes(name string, atime, mtime time.Time) error {
	return d.err("chtimes", name, d.root.Chtimes(name, atime, mtime))
}

// Chmod sets name's mode.
func (d *Dir) Chmod(name string, mode fs.FileMode) error {
	return d.err("chmod", name, d.root.Chmod(name, mode))
}

// Sync makes the entries of the directory name ("." for d) durable: the
// creates, renames and removes in it survive a crash.
func (d *Dir) Sync(name string) error {
	f, err := d.Open(name)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return d.err("fsync", name, err)
}

// ErrLocked is TryLock's error when a live process holds the lock.
var ErrLocked = errors.New("in use by a live process")

// Lock is an exclusive flock(2) held on a file or directory. The kernel
// drops it when its holder dies, however it dies, so a lock that can be
// taken marks what a process that is gone left behind.
type Lock struct{ f *os.File }

// Release drops the lock.
func (l *Lock) Release() error { return l.f.Close() }

// TryLock takes the lock of the existing file or directory name without
// waiting; ErrLocked when a live process holds it. A symlink is no lock
// (os.Root would follow it, inside d).
func (d *Dir) TryLock(name string) (*Lock, error) {
	fi, err := d.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, d.err("open", name, syscall.ELOOP)
	}
	f, err := d.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	return d.lock(name, f)
}

// CreateLocked creates the file name, which must not exist, and takes its
// lock.
func (d *Dir) CreateLocked(name string, perm fs.FileMode) (*Lock, error) {
	f, err := d.Create(name, perm)
	if err != nil {
		return nil, err
	}
	return d.lock(name, f)
}

func (d *Dir) lock(name string, f *os.File) (*Lock, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", d.Path(name), ErrLocked)
		}
		return nil, d.err("flock", name, err)
	}
	return &Lock{f: f}, nil
}

// SweepStale runs remove, holding name's lock, when no live process holds
// it: name marks what a process left, and the process is gone. It reports
// whether remove ran and succeeded; a missing name or a live holder is no
// error.
func (d *Dir) SweepStale(name string, remove func() error) (bool, error) {
	l, err := d.TryLock(name)
	if errors.Is(err, ErrLocked) || errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer l.Release()
	if err := remove(); err != nil {
		return false, err
	}
	return true, nil
}

// err names the file of an os.Root error by its full path (nil stays nil).
func (d *Dir) err(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return rootError(op, d.Path(name), err)
}
