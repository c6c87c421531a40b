package deepspeed

// A rank's optimizer states file is opened on the first read of bytes that
// lie in it: a checkpoint of 512 ranks opens with two files read, and a
// read of one parameter opens the ranks holding it. The header is checked
// against what the placement assumed of every rank (expect); a file that
// disagrees fails every read of its bytes with an error naming it.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/torchsave"
)

// expect is what the placement assumes of every rank's file: rank 0's.
type expect struct {
	stage int64
	world int
	key   string  // the partitions' key in optimizer_state_dict
	elems []int64 // elements of each group's partition
}

// rank is one rank's flat fp32 partitions, read when first needed.
type rank struct {
	path  string
	file  *ckpt.File
	parts []*torchsave.Tensor // per param group; set with opened
	elems []int64             // rank 0's only: the sizes the placement uses

	// Set for a rank opened on first use.
	want  *expect
	rank0 string // rank 0's file, for messages

	opened atomic.Pointer[opened]
	mu     sync.Mutex
	err    error // GUARDED_BY(mu); a lasting failure

	vmu      sync.Mutex
	verified map[int]error // GUARDED_BY(vmu); per group, once verified
}

// opened is an opened rank's partitions, and each one's bytes as one
// source that every rankSource in it reads through (a source per read
// was an allocation per chunk of each read's plan).
type opened struct {
	parts []*torchsave.Tensor
	whole []ckpt.Source
}

// setOpened makes parts the rank's partitions.
func (r *rank) setOpened(parts []*torchsave.Tensor) *opened {
	o := &opened{parts: parts}
	for g, p := range parts {
		o.whole = append(o.whole, p.Source(fmt.Sprintf("partition %d", g), 0, p.Size))
	}
	r.parts = parts
	r.opened.Store(o)
	return o
}

// partitions returns the rank's partitions, opening its file and checking
// its header on first use. A bad or changed file is remembered; a plain I/O
// error is not, so the next read tries again.
func (r *rank) partitions() (*opened, error) {
	if o := r.opened.Load(); o != nil {
		return o, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.opened.Load(); o != nil {
		return o, nil
	}
	if r.err != nil {
		return nil, r.err
	}
	got, err := r.open()
	if err == nil {
		return r.setOpened(got.parts), nil
	}
	err = fmt.Errorf("deepspeed: %s (placed by %s): %w", r.path, r.rank0, err)
	var pathErr *fs.PathError
	var errno syscall.Errno
	if !errors.Is(err, ckpt.ErrInvalid) && !errors.Is(err, ckpt.ErrSourceChanged) && (errors.As(err, &pathErr) || errors.As(err, &errno)) {
		return nil, err
	}
	r.err = err
	return nil, err
}

func (r *rank) open() (*rank, error) {
	ar, err := torchsave.OpenArchive(r.file)
	if err != nil {
		return nil, err
	}
	v, err := ar.Decode()
	if err != nil {
		return nil, err
	}
	root, err := rootDict(ar, v)
	if err != nil {
		return nil, err
	}
	return readRank(ar, root, *r.want)
}

// verify checks group g's partition against its CRC32, once.
func (r *rank) verify(g int, name string) error {
	o, err := r.partitions()
	if err != nil {
		return err
	}
	parts := o.parts
	r.vmu.Lock()
	defer r.vmu.Unlock()
	if err, ok := r.verified[g]; ok {
		return err
	}
	src, _ := parts[g].Source(name, 0, parts[g].Size).(ckpt.Verifier)
	if src == nil {
		return fmt.Errorf("deepspeed: %s: partition %d cannot be verified", r.path, g)
	}
	err = src.Verify()
	if r.verified == nil {
		r.verified = map[int]error{}
	}
	r.verified[g] = err
	return err
}

// rankSource is bytes [off, off+n) of a rank's partition of group g: a box
// of tensor name.
type rankSource struct {
	r      *rank
	g      int
	off, n int64
	name   string
}

var (
	_ ckpt.Locator  = (*rankSource)(nil)
	_ ckpt.Verifier = (*rankSource)(nil)
	_ ckpt.Backed   = (*rankSource)(nil)
	_ ckpt.Resident = (*rankSource)(nil)
)

// inner is the source the bytes are read through, and where they start
// in it: the partition's, shared; a source of their own where they are the
// whole partition (the storage's CRC32 may then apply, and its messages
// name the tensor).
func (s *rankSource) inner() (src ckpt.Source, at int64, shared bool, err error) {
	o, err := s.r.partitions()
	if err != nil {
		return nil, 0, false, err
	}
	if part := o.parts[s.g]; s.off == 0 && s.n == part.Size {
		return part.Source(s.name, 0, s.n), 0, false, nil
	}
	return o.whole[s.g], s.off, true, nil
}

// ReadAt reads the bytes at off, opening the rank's file on first use.
func (s *rankSource) ReadAt(p []byte, off int64) (int, error) {
	in, at, _, err := s.inner()
	if err != nil {
		return 0, err
	}
	if off < 0 || off > s.n {
		return 0, fmt.Errorf("deepspeed: %s: offset %d outside tensor %q's %d bytes", s, off, s.name, s.n)
	}
	want := p[:min(int64(len(p)), s.n-off)]
	n, err := in.ReadAt(want, at+off)
	if err == io.EOF && n == len(want) {
		err = nil
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// Locate says where the bytes lie in the rank's file, opening it on first
// use, so that the read plan merges them with their neighbours.
func (s *rankSource) Locate() (ckpt.Location, bool, error) {
	in, at, shared, err := s.inner()
	if err != nil {
		return ckpt.Location{}, false, err
	}
	l, ok := in.(ckpt.Locator)
	if !ok {
		return ckpt.Location{}, false, nil
	}
	loc, ok, err := l.Locate()
	if shared {
		// Part of the partition: the storage's CRC32 is not the bytes'.
		loc.Offset, loc.Whole = loc.Offset+at, nil
	}
	return loc, ok, err
}

// Verify checks the CRC32 of the whole partition holding the bytes (once
// per partition, whatever the boxes in it).
func (s *rankSource) Verify() error { return s.r.verify(s.g, s.name) }

// Backing is the rank's file, opened or not.
func (s *rankSource) Backing() *ckpt.File { return s.r.file }

func (s *rankSource) String() string {
	return fmt.Sprintf("%s:partition %d+%d+%d", s.r.path, s.g, s.off, s.n)
}

// ResidentBytes implements ckpt.Resident: the rank is shared.
func (s *rankSource) ResidentBytes() int64 { return int64(unsafe.Sizeof(*s)) }

// emptySource is a tensor of no elements.
type emptySource struct{}

func (emptySource) ReadAt(p []byte, off int64) (int, error) {
	if off != 0 || len(p) != 0 {
		return 0, fmt.Errorf("deepspeed: read [%d, +%d) of an empty tensor", off, len(p))
	}
	return 0, nil
}

func (emptySource) String() string { return "empty" }
