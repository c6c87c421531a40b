package torchsave

// Reading a tensor's bytes in place: a storage's data entry is located (its
// local zip header read) on the first read of any tensor in it and
// remembered; the entry's CRC32 is checked whenever a read covers it whole,
// and by Verify.

import (
	"archive/zip"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"sync"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
)

// storage is one data entry of an archive.
type storage struct {
	file  *ckpt.File
	entry *zip.File
	size  int64 // bytes, as data.pkl and the zip directory agree
	ref   torchzip.Storage

	mu  sync.Mutex
	off int64 // GUARDED_BY(mu); the entry's first byte in the file, once located
	ok  bool  // GUARDED_BY(mu)
	err error // GUARDED_BY(mu); a lasting failure
}

// located returns where the entry's bytes start, reading its local header
// on first use. A bad header or a changed file is remembered; a plain I/O
// error is not, so the next read tries again.
func (s *storage) located() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok || s.err != nil {
		return s.off, s.err
	}
	off, err := s.entry.DataOffset()
	if err == nil && (off < 0 || off > s.file.Size() || s.size > s.file.Size()-off) {
		err = fmt.Errorf("%w: %s: data [%d, %d) past end of file (%d bytes)", ckpt.ErrInvalid, s.entry.Name, off, off+s.size, s.file.Size())
	}
	if err == nil {
		s.off, s.ok = off, true
		return off, nil
	}
	wrapped := fmt.Errorf("torchsave: %s: locating %s: %w", s.file.Path, s.entry.Name, err)
	var pathErr *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.Is(err, ckpt.ErrSourceChanged), errors.Is(err, ckpt.ErrInvalid):
		s.err = wrapped
	case errors.As(err, &pathErr), errors.As(err, &errno):
		return 0, wrapped
	default: // a malformed local header
		s.err = fmt.Errorf("%w: %w", ckpt.ErrInvalid, wrapped)
	}
	return 0, s.err
}

// tensorSource is a tensor's bytes: [start, start+n) of a storage.
type tensorSource struct {
	st       *storage
	start, n int64
	tensor   string
}

var (
	_ ckpt.Source   = (*tensorSource)(nil)
	_ ckpt.Verifier = (*tensorSource)(nil)
	_ ckpt.Backed   = (*tensorSource)(nil)
	_ ckpt.Locator  = (*tensorSource)(nil)
)

// Locate says where the tensor's bytes lie in the weights file; the
// entry's CRC32 applies where the tensor is the whole entry.
func (s *tensorSource) Locate() (ckpt.Location, bool, error) {
	base, err := s.st.located()
	if err != nil {
		return ckpt.Location{}, false, err
	}
	l := ckpt.Location{File: s.st.file, Offset: base + s.start}
	if s.start == 0 && s.n == s.st.size {
		l.Whole = s
	}
	return l, true, nil
}

// CheckWhole checks the CRC32 of the tensor's bytes read whole, where the
// tensor is its storage's whole entry.
func (s *tensorSource) CheckWhole(got uint32) error { return s.check(got, "in the bytes read") }

// Backing is the weights file holding the tensor.
func (s *tensorSource) Backing() *ckpt.File { return s.st.file }

func (s *tensorSource) String() string {
	return fmt.Sprintf("%s:%s+%d+%d", s.st.file.Rel, s.st.entry.Name, s.start, s.n)
}

// ReadAt reads the tensor's bytes at off. A read that ends past the tensor
// returns the bytes up to its end and io.EOF. A read of the whole tensor is
// checked against the entry's CRC32 when the tensor is the whole entry.
func (s *tensorSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > s.n {
		return 0, fmt.Errorf("torchsave: %s: offset %d outside tensor %q of %d bytes", s, off, s.tensor, s.n)
	}
	base, err := s.st.located()
	if err != nil {
		return 0, err
	}
	want := p
	if int64(len(want)) > s.n-off {
		want = want[:s.n-off]
	}
	n, err := s.st.file.ReadAt(want, base+s.start+off)
	if err == io.EOF && n == len(want) {
		err = nil
	}
	if err == nil && off == 0 && int64(n) == s.n && s.start == 0 && s.n == s.st.size {
		err = s.check(crc32.ChecksumIEEE(want[:n]), "in the bytes read")
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// Verify reads the whole data entry holding the tensor, in bounded memory,
// and checks it against the CRC32 of the zip directory.
func (s *tensorSource) Verify() error {
	base, err := s.st.located()
	if err != nil {
		return err
	}
	h := crc32.NewIEEE()
	if _, err := io.CopyBuffer(h, io.NewSectionReader(s.st.file, base, s.st.size), make([]byte, 1<<20)); err != nil {
		return fmt.Errorf("torchsave: %s: tensor %q: verifying %s: %w", s.st.file.Path, s.tensor, s.st.entry.Name, err)
	}
	return s.check(h.Sum32(), "in the bytes read")
}

func (s *tensorSource) check(got uint32, how string) error {
	if want := s.st.entry.CRC32; got != want {
		return fmt.Errorf("%w: torchsave: %s: tensor %q: %s: CRC32 mismatch: %08x in the zip directory, %08x %s (a corrupt or rewritten file)",
			ckpt.ErrInvalid, s.st.file.Path, s.tensor, s.st.entry.Name, want, got, how)
	}
	return nil
}
