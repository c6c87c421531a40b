package ckpt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/source"
)

// ErrSourceChanged is returned when a shard file no longer matches what was
// seen when the checkpoint was opened: serving it could give wrong bytes.
var ErrSourceChanged = source.ErrChanged

// FileSet hands out shared, lazily opened handles to the files of one
// checkpoint. Every name is opened through the checkpoint's source tree, so
// nothing outside the source can be read.
type FileSet struct {
	tree source.Tree
	// random: views read the files out of their order (ReadRandomly).
	random atomic.Bool

	mu      sync.Mutex
	files   map[string]*File // GUARDED_BY(mu)
	adopted []io.Closer      // GUARDED_BY(mu); closed with the set
}

// NewFileSet returns a FileSet over the checkpoint directory tree.
func NewFileSet(tree source.Tree) *FileSet {
	return &FileSet{tree: tree, files: map[string]*File{}}
}

// ReadRandomly says that views read the set's files out of their order
// (fills jump from tensor to tensor): the kernel's read-ahead would read
// bytes the next fills do not want. Files already open (a reader reads
// headers while opening) are told at once, the others when they open.
func (s *FileSet) ReadRandomly() {
	s.random.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.mu.Lock()
		readRandomly(f.fd)
		f.mu.Unlock()
	}
}

// readRandomly tells fd it is read out of order, where it can be told.
func readRandomly(fd source.File) {
	if r, ok := fd.(source.RandomReader); ok {
		r.ReadRandomly()
	}
}

// Tree is the checkpoint directory the set reads from.
func (s *FileSet) Tree() source.Tree { return s.tree }

// Get returns the regular file at rel (relative to the checkpoint), stat'ing
// it on first use. What is seen then (inode, size, mtime, ctime) is what
// every later read checks against.
func (s *FileSet) Get(rel string) (*File, error) {
	rel, err := confine(rel)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.files[rel]; ok {
		return f, nil
	}
	info, err := s.tree.Stat(rel)
	if errors.Is(err, source.ErrEscapes) {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	if !info.IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalid, s.tree.Path(rel))
	}
	f := &File{Path: s.tree.Path(rel), Rel: rel, info: info, tree: s.tree, random: &s.random}
	s.files[rel] = f
	return f, nil
}

// confine cleans a name from a checkpoint's own index, which formats define
// as relative to the checkpoint directory, and rejects anything absolute or
// climbing out of it. (The tree also refuses escapes, symlinks included;
// this names the offending entry.)
func confine(rel string) (string, error) {
	if rel == "" || path.IsAbs(rel) || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("%w: file path %q is not relative to the checkpoint directory", ErrInvalid, rel)
	}
	clean := path.Clean(rel)
	if clean == "." || !fs.ValidPath(clean) {
		return "", fmt.Errorf("%w: file path %q escapes the checkpoint directory", ErrInvalid, rel)
	}
	return clean, nil
}

// Adopt hands c (a scratch file a reader made, a tree the checkpoint owns)
// to the set, to be closed with it.
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
	for i := len(s.adopted) - 1; i >= 0; i-- {
		if err := s.adopted[i].Close(); err != nil && first == nil {
			first = err
		}
	}
	s.adopted = nil
	return first
}

// File is one file of a checkpoint. It is opened on first read; the open
// file must be the one stat'ed when the checkpoint was opened, and every read
// is checked afterwards with fstat (size, mtime, ctime; once per batch of
// reads: Batch, ReadRanges, ReadUnchecked then Check), so a file rewritten
// in place, even with its mtime put back, gives ErrSourceChanged, never
// mixed bytes. Replacing or removing the file changes the open inode's ctime
// too (its link count drops), so that is caught as well.
type File struct {
	Path string // for messages: the full path (or URL)
	Rel  string // name in the checkpoint directory

	info   source.Info
	tree   source.Tree
	random *atomic.Bool // the set's: read out of order, no kernel read-ahead

	mu sync.Mutex
	fd source.File // GUARDED_BY(mu); opened on first read
}

// Size is the file size seen at open time.
func (f *File) Size() int64 { return f.info.Size }

// Access is the file's owner and mode seen at open time.
func (f *File) Access() source.Access { return f.info.Access }

// ModTime is the modification time seen at open time.
func (f *File) ModTime() time.Time { return f.info.ModTime }

func (f *File) handle() (source.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd != nil {
		return f.fd, nil
	}
	fd, err := f.tree.Open(f.Rel)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s vanished", ErrSourceChanged, f.Path)
		}
		return nil, err
	}
	if fd.Info().Version != f.info.Version {
		fd.Close()
		return nil, fmt.Errorf("%w: %s (size %d→%d)", ErrSourceChanged, f.Path, f.info.Size, fd.Info().Size)
	}
	if f.random != nil && f.random.Load() {
		readRandomly(fd)
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

// CheckFresh reports whether the file at the checkpoint's path still is
// the one seen when the checkpoint was opened, unchanged: a file replaced,
// removed or rewritten since gives ErrSourceChanged.
func (f *File) CheckFresh() error {
	info, err := f.tree.Stat(f.Rel)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s vanished", ErrSourceChanged, f.Path)
	}
	if err != nil {
		return err
	}
	if info.Version != f.info.Version {
		return fmt.Errorf("%w: %s was replaced or modified (size %d→%d)", ErrSourceChanged, f.Path, f.info.Size, info.Size)
	}
	f.mu.Lock()
	fd := f.fd
	f.mu.Unlock()
	if fd != nil {
		return fd.Check()
	}
	return nil
}

// Backed is a Source whose bytes come from one file of the checkpoint.
type Backed interface {
	Backing() *File
}

// Placed is a Source that can say where its format's index places it: the
// file, the byte range there (a DCP record, a section) and how it is stored
// there (0: as is; else a format's own code, a compression). A mount's view
// digest sums it for every chunk rather than formatting String.
type Placed interface {
	Place() (f *File, off, length int64, how int)
}

// ReadAt reads len(p) bytes at off. A read past the size seen at open time is
// an error naming the file, because a shard shorter than its index says is a
// truncated checkpoint.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if err := f.inside(off, int64(len(p))); err != nil {
		return 0, err
	}
	fd, err := f.handle()
	if err != nil {
		return 0, err
	}
	n, err := fd.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, err
	}
	// Checked after the read: a change before or during it shows here.
	if cerr := fd.Check(); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// inside checks that n bytes at off lie inside the file as seen at open.
func (f *File) inside(off, n int64) error {
	if off < 0 || off > f.info.Size || n > f.info.Size-off {
		return fmt.Errorf("%w: %s: read [%d, %d) past end of file (size %d)",
			ErrInvalid, f.Path, off, off+n, f.info.Size)
	}
	return nil
}

// Batch runs fn with a reader of the file that does not check freshness
// after each read, then checks once: a run of small reads (a record's
// headers) costs one fstat. What fn reads is valid only if Batch returns
// nil, and the reader must not be kept.
func (f *File) Batch(fn func(io.ReaderAt) error) error { return f.batch(fn, true) }

// ReadUnchecked is Batch without the check when fn succeeds: what fn read
// is valid only once a Check made after it passes. A read plan that locates
// many records in one file checks the file once, after all of its reads.
func (f *File) ReadUnchecked(fn func(io.ReaderAt) error) error { return f.batch(fn, false) }

func (f *File) batch(fn func(io.ReaderAt) error, check bool) error {
	fd, err := f.handle()
	if err != nil {
		return err
	}
	err = fn(batchReader{f, fd})
	if err == nil && !check {
		return nil
	}
	// bytes read across a change decode as garbage: the change is the
	// error to report, not the garbage.
	if cerr := fd.Check(); cerr != nil && (err == nil || errors.Is(cerr, ErrSourceChanged)) {
		return cerr
	}
	return err
}

// Check reports whether the open file is still the one opened, unchanged
// (one fstat for a local file): a change before or during any read made
// before it shows here, and in every Check after it (an inode's ctime does
// not go back), so bytes read unchecked are valid once a later Check passes.
func (f *File) Check() error {
	fd, err := f.handle()
	if err != nil {
		return err
	}
	return fd.Check()
}

// batchReader is Batch's reader: ReadAt without the check.
type batchReader struct {
	f  *File
	fd source.File
}

func (r batchReader) ReadAt(p []byte, off int64) (int, error) {
	if err := r.f.inside(off, int64(len(p))); err != nil {
		return 0, err
	}
	return r.fd.ReadAt(p, off)
}

// Range is bytes of a file read into Parts, one after the other, from Off.
type Range struct {
	Off   int64
	Parts [][]byte
}

// ReadRanges reads each range whole, in order, then checks once that the
// file is still the one opened: a batch of reads costs one fstat, not one
// per read, and a change before or during any of them still fails the
// batch with ErrSourceChanged. On failure, failed is the index of the range
// whose read failed, or len(rs) when the check failed.
func (f *File) ReadRanges(rs []Range) (failed int, err error) {
	fd, err := f.handle()
	if err != nil {
		return 0, err
	}
	for i, r := range rs {
		var n int64
		for _, p := range r.Parts {
			n += int64(len(p))
		}
		if err := f.inside(r.Off, n); err != nil {
			return i, err
		}
		if err := source.ReadParts(fd, r.Parts, r.Off); err != nil {
			return i, err
		}
	}
	return len(rs), fd.Check()
}

// OutOfFileOrder reports whether reading the tensors in order, each
// chunk in turn, goes back in some file: a section that begins before the
// end of the one read before it in the same file.
func OutOfFileOrder(tensors []*Tensor) bool {
	end := map[*File]int64{}
	for _, t := range tensors {
		for _, c := range t.Chunks.All() {
			s, ok := c.Source.(*Section)
			if !ok {
				continue
			}
			if s.Offset < end[s.File] {
				return true
			}
			end[s.File] = s.Offset + s.Length
		}
	}
	return false
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

// Backing is the file the section lies in.
func (s *Section) Backing() *File { return s.File }

// Place implements Placed.
func (s *Section) Place() (*File, int64, int64, int) { return s.File, s.Offset, s.Length, 0 }

// Locate: a section is where it says.
func (s *Section) Locate() (Location, bool, error) {
	return Location{File: s.File, Offset: s.Offset}, true, nil
}

func (s *Section) String() string {
	return fmt.Sprintf("%s@%d+%d", s.File.Rel, s.Offset, s.Length)
}

// ResidentBytes implements Resident.
func (s *Section) ResidentBytes() int64 { return int64(unsafe.Sizeof(*s)) }
