package ckpt

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrSourceChanged is returned when a shard file no longer matches what was
// seen when the checkpoint was opened: serving it could give wrong bytes.
var ErrSourceChanged = errors.New("ckpt: source file changed since the checkpoint was opened")

// FileSet hands out shared, lazily opened handles to the shard files of one
// checkpoint directory. Every path is confined to the directory.
type FileSet struct {
	dir string

	mu      sync.Mutex
	files   map[string]*File // GUARDED_BY(mu)
	adopted []io.Closer      // GUARDED_BY(mu); closed with the set
}

// NewFileSet returns a FileSet rooted at dir.
func NewFileSet(dir string) *FileSet {
	return &FileSet{dir: dir, files: map[string]*File{}}
}

// Dir is the checkpoint directory.
func (s *FileSet) Dir() string { return s.dir }

// Get returns the file at rel (relative to the directory), stat'ing it on
// first use. The size and mtime seen then are what every later read checks
// against. rel must not escape the directory.
func (s *FileSet) Get(rel string) (*File, error) {
	clean, err := confine(rel)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.files[clean]; ok {
		return f, nil
	}
	path := filepath.Join(s.dir, clean)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalid, path)
	}
	f := &File{Path: path, Rel: clean, size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi)}
	s.files[clean] = f
	return f, nil
}

// Adopt hands c (a scratch file a reader made, say) to the set, to be
// closed with it.
func (s *FileSet) Adopt(c io.Closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.adopted = append(s.adopted, c)
}

// Close closes every opened handle and everything adopted.
func (s *FileSet) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for _, f := range s.files {
		if err := f.close(); err != nil && first == nil {
			first = err
		}
	}
	for _, c := range s.adopted {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	s.adopted = nil
	return first
}

// confine cleans a relative path and rejects anything that is absolute or
// climbs out of the checkpoint directory.
func confine(rel string) (string, error) {
	if rel == "" || filepath.IsAbs(rel) || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("%w: file path %q is not relative to the checkpoint directory", ErrInvalid, rel)
	}
	clean := filepath.Clean(rel)
	if clean == ".." || strings.HasPrefix(clean, "../") || clean == "." {
		return "", fmt.Errorf("%w: file path %q escapes the checkpoint directory", ErrInvalid, rel)
	}
	return clean, nil
}

// File is one shard file. ReadAt checks, before reading, that the file on disk
// is still the one seen at open time (same inode, size and mtime); a changed,
// replaced or vanished file gives ErrSourceChanged, never stale bytes.
type File struct {
	Path string
	Rel  string

	size  int64
	mtime time.Time
	ino   uint64

	mu sync.Mutex
	fd *os.File // GUARDED_BY(mu); opened on first read
}

// Size is the file size seen at open time.
func (f *File) Size() int64 { return f.size }

// ModTime is the modification time seen at open time.
func (f *File) ModTime() time.Time { return f.mtime }

func (f *File) handle() (*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd != nil {
		return f.fd, nil
	}
	fd, err := os.Open(f.Path)
	if err != nil {
		return nil, err
	}
	f.fd = fd
	return fd, nil
}

func (f *File) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd == nil {
		return nil
	}
	err := f.fd.Close()
	f.fd = nil
	return err
}

// CheckFresh stats the path and compares it with what was seen at open time.
func (f *File) CheckFresh() error {
	fi, err := os.Stat(f.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %s vanished", ErrSourceChanged, f.Path)
		}
		return err
	}
	if fi.Size() != f.size || !fi.ModTime().Equal(f.mtime) || inode(fi) != f.ino {
		return fmt.Errorf("%w: %s (size %d→%d)", ErrSourceChanged, f.Path, f.size, fi.Size())
	}
	return nil
}

// ReadAt reads len(p) bytes at off. A read past the size seen at open time is
// an error naming the file, because a shard shorter than its index says is a
// truncated checkpoint.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > f.size || int64(len(p)) > f.size-off {
		return 0, fmt.Errorf("%w: %s: read [%d, %d) past end of file (size %d)",
			ErrInvalid, f.Path, off, off+int64(len(p)), f.size)
	}
	if err := f.CheckFresh(); err != nil {
		return 0, err
	}
	fd, err := f.handle()
	if err != nil {
		return 0, err
	}
	n, err := fd.ReadAt(p, off)
	if err == io.EOF && n < len(p) {
		return n, fmt.Errorf("%w: %s truncated at %d", ErrSourceChanged, f.Path, off+int64(n))
	}
	return n, err
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// Section is a Source over a plain byte range of a file (raw safetensors data,
// or a torch.save record whose data offset is known).
type Section struct {
	File   *File
	Offset int64
	Length int64
}

// ReadAt implements io.ReaderAt over the section.
func (s *Section) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > s.Length {
		return 0, fmt.Errorf("%s: offset %d outside section of %d bytes", s, off, s.Length)
	}
	want := p
	if int64(len(want)) > s.Length-off {
		want = want[:s.Length-off]
	}
	n, err := s.File.ReadAt(want, s.Offset+off)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (s *Section) String() string {
	return fmt.Sprintf("%s@%d+%d", s.File.Rel, s.Offset, s.Length)
}

// SyncDir fsyncs a directory, making the entries created or renamed in it
// durable.
func SyncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
