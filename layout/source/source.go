// Package source is where checkpoint bytes come from: a read-only tree of
// files that every format reader opens, stats and lists through, and that
// nothing can be read outside of. A local tree is confined with os.Root, so
// symlinks and ".." that resolve outside the tree are refused by the kernel
// walk, not by a textual check; links that stay inside (an HF hub cache's
// snapshots/ → blobs/) work.
//
// Names are slash-separated and relative to the tree ("." is its top), as in
// io/fs. Only regular files can be opened: a FIFO, socket or device where a
// file is expected is an error, never a read that blocks.
package source

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"syscall"
	"time"
)

// ErrNotRegular is returned when a name that must be a regular file is not.
var ErrNotRegular = errors.New("source: not a regular file")

// ErrTooLarge is returned by ReadFile when a file exceeds its size bound.
var ErrTooLarge = errors.New("source: file too large")

// Tree is a confined, read-only tree of files.
type Tree interface {
	// Open opens the regular file name for ranged reads.
	Open(name string) (File, error)
	// Stat describes name, following symlinks that stay inside the tree.
	Stat(name string) (Info, error)
	// ReadDir lists the directory name, sorted by name. Symlinks are
	// resolved: an entry describes what it points to; a link that leaves
	// the tree or dangles is listed with Mode fs.ModeSymlink.
	ReadDir(name string) ([]Info, error)
	// Path names a file for messages and logs (a local path, a URL).
	Path(name string) string
}

// File is an open regular file of a tree.
type File interface {
	io.ReaderAt
	io.Closer
	// Info is the file as it was when opened.
	Info() Info
	// Check reports whether the open file still has the content it had
	// when opened (ErrChanged if not).
	Check() error
}

// Descriptor is a File the kernel can read itself: a local file, whose
// descriptor a FUSE server can hand over (passthrough). Files whose bytes
// ckptfs must check or fetch first (objects, their disk cache) are not.
type Descriptor interface {
	File
	Fd() uintptr
}

// VectoredReader is a File that reads one range into several buffers with
// one call (preadv), so a range whose bytes go to scattered places costs
// one read and no copy.
type VectoredReader interface {
	File
	// ReadvAt fills parts in order from the bytes at off: all of them, or
	// an error (ErrChanged for a file found shorter than when opened).
	ReadvAt(parts [][]byte, off int64) error
}

// ReadParts fills parts in order from r's bytes at off: with one call where
// r can read into several buffers, else with one read, through a scratch
// buffer when there are several parts.
func ReadParts(f io.ReaderAt, parts [][]byte, off int64) error {
	if v, ok := f.(VectoredReader); ok {
		return v.ReadvAt(parts, off)
	}
	if len(parts) == 1 {
		return ReadFullAt(f, parts[0], off)
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	buf := make([]byte, n)
	if err := ReadFullAt(f, buf, off); err != nil {
		return err
	}
	for _, p := range parts {
		buf = buf[copy(p, buf):]
	}
	return nil
}

// ReadFullAt reads len(p) bytes at off, the one way every reader and the
// writer read a range they need whole: a short read is an error wrapping
// io.ErrUnexpectedEOF that says how short.
func ReadFullAt(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = fmt.Errorf("%w: read %d of %d bytes at %d", io.ErrUnexpectedEOF, n, len(p), off)
	}
	return err
}

// RandomReader is a File that can be told it will be read out of its
// order, so that the kernel reads no more than each read asks for.
type RandomReader interface {
	File
	ReadRandomly()
}

// ErrChanged is returned when a file's content may differ from when it was
// first seen: serving it could mix old and new bytes.
var ErrChanged = errors.New("source: file changed")

// Info describes one name of a tree.
type Info struct {
	Name    string // base name
	Size    int64
	ModTime time.Time
	Mode    fs.FileMode // the type bits: ModeDir, 0 (regular) or another type
	// ID identifies the file or directory itself, whatever path reaches it
	// (device and inode; an object's key): two names with one ID are one
	// file.
	ID string
	// Version changes whenever the content may have changed: for a local
	// file the inode, size, mtime and ctime (which a restored mtime does not
	// hide); for an object its ETag.
	Version string
	// Access is who may read it (and, in a writable mount, write it): a
	// local file's owner, group and mode, narrowed where it has an ACL.
	Access Access
}

// IsDir reports whether the name is a directory.
func (i Info) IsDir() bool { return i.Mode.IsDir() }

// IsRegular reports whether the name is a regular file.
func (i Info) IsRegular() bool { return i.Mode.IsRegular() }

// IsBrokenLink reports whether the name is a symlink that cannot be
// followed: it dangles or leads outside the tree.
func (i Info) IsBrokenLink() bool { return i.Mode&fs.ModeSymlink != 0 }

// Exists reports whether Stat found name or found a link at name that
// leads outside the tree: either way a reader that expects a file there
// should try it and report what it finds.
func Exists(t Tree, name string) bool {
	_, err := t.Stat(name)
	return err == nil || errors.Is(err, ErrEscapes)
}

// ModTime is the modification time of name in t; zero when it cannot be
// told.
func ModTime(t Tree, name string) time.Time {
	info, err := t.Stat(name)
	if err != nil {
		return time.Time{}
	}
	return info.ModTime
}

// ReadFile reads the whole regular file name, refusing files larger than
// limit bytes. Small documents (JSON sidecars, .metadata) are read with it.
func ReadFile(t Tree, name string, limit int64) ([]byte, error) {
	f, err := t.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := f.Info().Size
	if size > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes (limit %d)", ErrTooLarge, t.Path(name), size, limit)
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n < len(b) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("source: %s: %w", t.Path(name), err)
	}
	return b, nil
}

// Sub is the subtree of t under dir. Names are joined to dir and must be
// local (no "..", not absolute); confinement stays that of t, so a symlink
// in the subtree may point anywhere inside t.
func Sub(t Tree, dir string) (Tree, error) {
	dir, err := Clean(dir)
	if err != nil {
		return nil, err
	}
	if dir == "." {
		return t, nil
	}
	if s, ok := t.(*sub); ok {
		return &sub{base: s.base, dir: path.Join(s.dir, dir)}, nil
	}
	return &sub{base: t, dir: dir}, nil
}

type sub struct {
	base Tree
	dir  string
}

// OnDisk returns the local directory t reads, when t is a local tree (a
// Local, or a Sub of one).
func OnDisk(t Tree) (string, bool) {
	base := t
	if s, ok := t.(*sub); ok {
		base = s.base
	}
	if _, ok := base.(*Local); !ok {
		return "", false
	}
	return t.Path("."), true
}

func (s *sub) join(name string) (string, error) {
	name, err := Clean(name)
	if err != nil {
		return "", err
	}
	return path.Join(s.dir, name), nil
}

func (s *sub) Open(name string) (File, error) {
	n, err := s.join(name)
	if err != nil {
		return nil, err
	}
	return s.base.Open(n)
}

func (s *sub) Stat(name string) (Info, error) {
	n, err := s.join(name)
	if err != nil {
		return Info{}, err
	}
	return s.base.Stat(n)
}

func (s *sub) ReadDir(name string) ([]Info, error) {
	n, err := s.join(name)
	if err != nil {
		return nil, err
	}
	return s.base.ReadDir(n)
}

func (s *sub) Path(name string) string {
	if n, err := s.join(name); err == nil {
		return s.base.Path(n)
	}
	return s.base.Path(s.dir) + "/" + name
}

// Clean checks that name is a local slash-separated path ("" is ".") and
// cleans it: trees other than Local confine their names with it.
func Clean(name string) (string, error) {
	if name == "" {
		return ".", nil
	}
	if !fs.ValidPath(path.Clean(name)) {
		return "", &fs.PathError{Op: "open", Path: name, Err: ErrEscapes}
	}
	return path.Clean(name), nil
}

// ErrEscapes is returned for a name, or a symlink on its way, that leads
// outside the tree.
var ErrEscapes = errors.New("source: path escapes the source tree")

// IsMissing reports whether err, from Stat, ReadDir or Open, says the name
// is not there to be shown: nothing by that name, a link that cannot be
// followed (dangling, looping or leading outside the tree: ReadDir lists
// those as broken links), or a path through a file. Any other error is the
// tree failing (a store that does not answer, auth, a local EACCES or EIO):
// it says nothing about the name.
func IsMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrEscapes) ||
		errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP)
}

// IsFailure reports whether err says the tree failed to answer (a store
// that does not answer, auth, a local EACCES or EIO), not something about
// the name: neither missing (IsMissing) nor a file that is there but cannot
// be read as one (not regular, too large).
func IsFailure(err error) bool {
	return err != nil && !IsMissing(err) && !errors.Is(err, ErrNotRegular) && !errors.Is(err, ErrTooLarge)
}

// Stats count the traffic of a tree that fetches over a network (an object
// store), and of a disk cache in front of one. A local tree has none.
type Stats struct {
	Requests     int64 `json:"requests"`              // requests sent, retries included
	BytesFetched int64 `json:"bytes_fetched"`         // bytes of content received
	Retries      int64 `json:"retries"`               // requests sent again after a transient failure (throttling, 5xx, a cut connection)
	Errors       int64 `json:"errors"`                // operations that failed after their retries; a name found missing is not one
	DiskHits     int64 `json:"disk_hits,omitempty"`   // blocks read from the disk cache
	DiskMisses   int64 `json:"disk_misses,omitempty"` // blocks fetched because the disk cache lacked them
	DiskBytes    int64 `json:"disk_bytes,omitempty"`  // bytes held by the disk cache now
	DiskErrors   int64 `json:"disk_errors,omitempty"` // disk cache blocks found corrupt or not written (served from the source instead)
}

// Counted is a tree that counts its traffic.
type Counted interface {
	Stats() Stats
}
