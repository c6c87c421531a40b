package torchdcp

// Reading a chunk's bytes in place: recordSource, the ckpt.Source of a DCP
// chunk, locates them on first use (locateRecord) and checks the record's
// CRC32 whenever a read covers a whole data entry.

import (
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/klauspost/compress/zstd"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/safetensors"
)

// ErrChecksum matches errors for bytes that do not match the CRC32 of the
// torch.save record holding them (errors.Is).
var ErrChecksum = errors.New("torchdcp: CRC32 mismatch")

// checksumError is a CRC32 mismatch. It reads as its message (which says
// "CRC32") so that it can follow the file and tensor it is about.
type checksumError struct{ msg string }

func (e *checksumError) Error() string { return e.msg }

func (e *checksumError) Is(target error) bool {
	return target == ErrChecksum || target == ckpt.ErrInvalid
}

func crcMismatch(entry string, want, got uint32, how string) error {
	return &checksumError{msg: fmt.Sprintf("%s: CRC32 mismatch: %08x in the record, %08x %s (a corrupt or rewritten shard)", entry, want, got, how)}
}

// recordSource is a chunk stored as a torch.save record (optionally zstd
// compressed) in a .distcp file. The first ReadAt locates the raw bytes
// inside the record and remembers where they are (or the error); every
// later ReadAt is a plain pread.
//
// The record's zip directory gives the CRC32 of the data entry holding the
// chunk. It is checked whenever that entry is read whole anyway: by a read
// of the whole chunk when the chunk is the entry (as DCP writes it), and
// when a zstd record is decompressed. Verify checks it on demand.
type recordSource struct {
	t      *recordTensor
	file   *ckpt.File
	off    int64 // record offset in file
	length int64 // record length in file

	// loc is set once located, or on a lasting failure (loc.err), under
	// the source's lock (locking).
	loc  atomic.Pointer[chunkBytes]
	i    int32 // the chunk's index in t.chunks
	zstd bool
}

// locks serialise the first location of a source, a lock for many sources:
// one each would cost 8 bytes a chunk. A source holds one only while it
// locates, and sources next to each other take different ones.
var locks [64]sync.Mutex

func (s *recordSource) locking() *sync.Mutex {
	return &locks[uintptr(unsafe.Pointer(s))/unsafe.Sizeof(*s)%uintptr(len(locks))]
}

// recordTensor is what the sources of one tensor's chunks share (a
// checkpoint of many ranks has hundreds of thousands of sources): a
// source's geometry is its tensor's, not repeated.
type recordTensor struct {
	name     string
	dtype    string // torch dtype name
	elemSize int64
	tmpDir   string
	files    *ckpt.FileSet // owns the scratch file of a large zstd record
	chunks   *ckpt.Chunks  // the tensor's
	srcs     []recordSource
	pkl      atomic.Pointer[pklMemo] // the data.pkl last decoded for a chunk
	// entry is the name of the data entry the chunks' records hold their
	// bytes in, one string for all (torch names it archive/data/0 in every
	// record DCP writes): a located chunk keeps no name of its own.
	entry atomic.Pointer[string]
	// records keeps the checkpoint's small decompressed zstd records (nil
	// when the tensor has none); one tensor counts it (countsRecords).
	records       *recordCache
	countsRecords bool
}

// maxEntryName bounds the entry name a tensor keeps for its chunks (torch
// writes 14 bytes), counted for the view's budget before it is kept.
const maxEntryName = 64

// sharesEntry says whether name is the entry name the tensor keeps for its
// chunks (the first chunk located keeps its own, if short), so that a
// located chunk holds no name and a fixed number of bytes, counted before
// any is located (ResidentBytes). A chunk whose record names its entry
// otherwise is named by the entry's place in messages.
func (t *recordTensor) sharesEntry(name string) bool {
	if e := t.entry.Load(); e != nil {
		return *e == name
	}
	if len(name) > maxEntryName {
		return false
	}
	t.entry.CompareAndSwap(nil, &name)
	return *t.entry.Load() == name
}

// Source implements ckpt.SourceTable: the chunks' sources, in one array.
func (t *recordTensor) Source(i int) ckpt.Source { return &t.srcs[i] }

// sizes is the chunk's sizes.
func (s *recordSource) sizes() []int64 { return s.t.chunks.At(int(s.i)).Sizes }

// offsets is the chunk's offsets, for messages.
func (s *recordSource) offsets() []int64 { return s.t.chunks.At(int(s.i)).Offsets }

// nbytes is the chunk's bytes (Validate bounded its product).
func (s *recordSource) nbytes() int64 {
	n, _ := ckpt.NumElements(s.sizes())
	return n * s.t.elemSize
}

// want is what the metadata says the source's record must hold.
func (s *recordSource) want() recordWant {
	return recordWant{DType: s.t.dtype, ElemSize: s.t.elemSize, Sizes: s.sizes()}
}

// chunkBytes is a located chunk: where its bytes and the whole data entry
// holding them lie in the record (read from the shard file, or from a
// decompressed copy), and the entry's CRC32. One is kept per chunk read, so
// it holds offsets only, in a fixed size that the view's budget counts for
// every chunk when the view opens (ResidentBytes); what few chunks hold
// besides is in rest.
type chunkBytes struct {
	off                 int64 // where the chunk starts in the record's reader (reader)
	entryOff, entrySize int64 // the data entry, there
	crc                 uint32
	whole               bool // the chunk is the whole entry
	named               bool // the entry's name is its tensor's (recordTensor.entry)
	// mem: the offsets are in the record decompressed in memory, which
	// the tensor's records keeps while it is among those read last
	// (elem, under records.mu), and decompresses again when not.
	mem  bool
	elem *list.Element
	rest *chunkRest
}

// chunkRest is what a located chunk holds besides offsets: the spooled
// file of its decompressed record, or a lasting failure to locate it.
type chunkRest struct {
	r io.ReaderAt // nil: the shard file (or the record in memory: mem)
	// err, when set, is a lasting failure to locate the chunk (a bad
	// record, a changed source), and nothing else is.
	err error
}

// locatedBytes is what locating a chunk keeps: its chunkBytes, as the
// allocator rounds it (to 16 bytes at least, for sizes this small).
const locatedBytes = (int64(unsafe.Sizeof(chunkBytes{})) + 15) &^ 15

func failed(err error) *chunkBytes { return &chunkBytes{rest: &chunkRest{err: err}} }

func (c *chunkBytes) result() (*chunkBytes, error) {
	if c.rest != nil && c.rest.err != nil {
		return nil, c.rest.err
	}
	return c, nil
}

// reader is what the located chunk's offsets are in: the shard file, or
// its decompressed record (in memory, decompressed again if dropped).
func (s *recordSource) reader(c *chunkBytes) (io.ReaderAt, error) {
	switch {
	case c.mem:
		data, err := s.record(c)
		return bytes.NewReader(data), err
	case c.rest != nil && c.rest.r != nil:
		return c.rest.r, nil
	}
	return s.file, nil
}

// record is the decompressed record of the chunk located at c (mem): kept,
// or decompressed again, its data entry checked against its CRC32 again,
// and kept.
func (s *recordSource) record(c *chunkBytes) ([]byte, error) {
	if data := s.t.records.get(c); data != nil {
		return data, nil
	}
	_, _, data, err := s.decompress()
	if err == nil && (data == nil || c.entryOff+c.entrySize > int64(len(data))) {
		err = fmt.Errorf("zstd: the record decompresses to %d bytes now, not as located (a rewritten shard)", len(data))
	}
	if err == nil {
		if sum := crc32.ChecksumIEEE(data[c.entryOff : c.entryOff+c.entrySize]); sum != c.crc {
			err = crcMismatch(s.entryName(c), c.crc, sum, "after decompression")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("torchdcp: %s: tensor %q chunk %s: %w", s, s.t.name, formatOffsets(s.offsets()), err)
	}
	s.t.records.put(c, data)
	return data, nil
}

// entry reads the data entry.
func (s *recordSource) entry(c *chunkBytes) (*io.SectionReader, error) {
	r, err := s.reader(c)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(r, c.entryOff, c.entrySize), nil
}

// entryName names the data entry in messages.
func (s *recordSource) entryName(c *chunkBytes) string {
	if e := s.t.entry.Load(); c.named && e != nil {
		return *e
	}
	return fmt.Sprintf("the data entry at [%d, %d)", c.entryOff, c.entryOff+c.entrySize)
}

var (
	_ ckpt.Source   = (*recordSource)(nil)
	_ ckpt.Verifier = (*recordSource)(nil)
	_ ckpt.Locator  = (*recordSource)(nil)
	_ ckpt.Filler   = (*recordSource)(nil)
	_ ckpt.Placed   = (*recordSource)(nil)
)

// Backing is the shard file holding the record.
func (s *recordSource) Backing() *ckpt.File { return s.file }

// Place implements ckpt.Placed: the record, compressed (1) or not.
func (s *recordSource) Place() (*ckpt.File, int64, int64, int) {
	how := 0
	if s.zstd {
		how = 1
	}
	return s.file, s.off, s.length, how
}

func (s *recordSource) String() string {
	z := ""
	if s.zstd {
		z = " (zstd)"
	}
	return fmt.Sprintf("%s@%d+%d%s", s.file.Path, s.off, s.length, z)
}

// ReadAt reads the chunk's raw bytes at off. A read that ends past the chunk
// returns the bytes up to its end and io.EOF. A read of the whole chunk is
// checked against the record's CRC32 when the chunk is its whole entry.
func (s *recordSource) ReadAt(p []byte, off int64) (int, error) {
	nbytes := s.nbytes()
	want := p
	if off >= 0 && off <= nbytes && int64(len(want)) > nbytes-off {
		want = want[:nbytes-off]
	}
	var fill *chunkFill
	if s.loc.Load() == nil && off >= 0 && off <= nbytes {
		fill = &chunkFill{off: off, parts: [][]byte{want}}
	}
	loc, _, err := s.locate(fill, false)
	if err != nil {
		return 0, err
	}
	if off < 0 || off > nbytes {
		return 0, fmt.Errorf("torchdcp: %s: offset %d outside chunk of %d bytes", s, off, nbytes)
	}
	n := len(want)
	if fill == nil || !fill.filled {
		var r io.ReaderAt
		if r, err = s.reader(loc); err != nil {
			return 0, err
		}
		n, err = r.ReadAt(want, loc.off+off)
		if err == io.EOF && n == len(want) {
			err = nil
		}
	}
	if err == nil && loc.whole && off == 0 && int64(n) == nbytes {
		err = s.checkCRC(loc, crc32.ChecksumIEEE(want[:n]))
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// Locate says where a stored (not compressed) chunk's bytes lie in the
// shard, once located; a CRC32 applies where the chunk is its whole entry.
func (s *recordSource) Locate() (ckpt.Location, bool, error) {
	l, ok, _, err := s.LocateFill(0, nil)
	return l, ok, err
}

// LocateFill implements ckpt.Filler: a chunk's first locating reads a small
// record whole, its data with its headers (torchzip's windows), and hands
// the bytes asked for on. It leaves the freshness check to the caller
// (Location.Unchecked): a read plan checks each shard once, not once per
// record it locates there.
func (s *recordSource) LocateFill(off int64, parts [][]byte) (ckpt.Location, bool, bool, error) {
	var fill *chunkFill
	if len(parts) > 0 && !s.zstd && s.loc.Load() == nil {
		fill = &chunkFill{off: off, parts: parts}
	}
	loc, unchecked, err := s.locate(fill, true)
	if err != nil || s.zstd {
		return ckpt.Location{}, false, false, err
	}
	l := ckpt.Location{File: s.file, Offset: loc.off, Unchecked: unchecked}
	if loc.whole {
		l.Whole = s
	}
	return l, true, fill != nil && fill.filled, nil
}

// CheckWhole checks the CRC32 of the chunk's bytes read whole, where the
// chunk is its record's whole data entry.
func (s *recordSource) CheckWhole(got uint32) error {
	loc, err := s.located()
	if err != nil {
		return err
	}
	return s.checkCRC(loc, got)
}

// Verify reads the whole data entry holding the chunk, in bounded memory,
// and checks it against the CRC32 in the record's zip directory: every byte
// a read of the chunk can return is then known to be what torch wrote. It is
// what a --verify mode calls for each chunk (see ckpt.Verifier).
func (s *recordSource) Verify() error {
	loc, err := s.located()
	if err != nil {
		return err
	}
	e, err := s.entry(loc)
	if err != nil {
		return err
	}
	sum, err := crcOf(e)
	if err != nil {
		return fmt.Errorf("torchdcp: %s: tensor %q chunk %s: verifying %s: %w", s, s.t.name, formatOffsets(s.offsets()), s.entryName(loc), err)
	}
	return s.checkCRC(loc, sum)
}

// crcOf is the CRC32 (IEEE) of everything r holds.
func crcOf(r *io.SectionReader) (uint32, error) {
	h := crc32.NewIEEE()
	if _, err := io.CopyBuffer(h, io.NewSectionReader(r, 0, r.Size()), make([]byte, 1<<20)); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

func (s *recordSource) checkCRC(loc *chunkBytes, got uint32) error {
	if got == loc.crc {
		return nil
	}
	return fmt.Errorf("torchdcp: %s: tensor %q chunk %s: %w", s, s.t.name, formatOffsets(s.offsets()), crcMismatch(s.entryName(loc), loc.crc, got, "in the bytes read"))
}

// located finds the chunk's bytes on first use and remembers where they
// are. A bad record or a changed source is remembered too; a plain I/O error
// is not, so the next read tries again.
func (s *recordSource) located() (*chunkBytes, error) {
	loc, _, err := s.locate(nil, false)
	return loc, err
}

// locate is located filling fill (may be nil) when this call locates a
// stored record whose windows hold the bytes fill asks for. With
// leaveCheck, a stored record's reads are not checked for freshness
// (unchecked: the caller checks the file after them, ckpt.Filler).
//
// A location found unchecked is kept at once. That keeps the guarantee: a
// read at it is checked after the read, and a change of the file before
// that check fails it and every check after (source.File.Check), so bytes
// are never served through a location read across a change; and the bytes
// filled are the caller's, used after its check.
func (s *recordSource) locate(fill *chunkFill, leaveCheck bool) (_ *chunkBytes, unchecked bool, _ error) {
	if loc := s.loc.Load(); loc != nil {
		loc, err := loc.result()
		return loc, false, err
	}
	mu := s.locking()
	mu.Lock()
	defer mu.Unlock()
	if loc := s.loc.Load(); loc != nil {
		loc, err := loc.result()
		return loc, false, err
	}
	var loc *chunkBytes
	var err error
	if s.zstd {
		loc, err = s.resolveZstd()
	} else {
		// The record's headers are a few small reads: one freshness check
		// for them all, or none here with leaveCheck. The chunk is then
		// read through the checked file.
		read := s.file.Batch
		if leaveCheck {
			read, unchecked = s.file.ReadUnchecked, true
		}
		var at recordLoc
		err = read(func(r io.ReaderAt) error {
			var err error
			at, err = locateRecordMemo(io.NewSectionReader(r, s.off, s.length), s.length, s.want(), &s.t.pkl, fill)
			return err
		})
		if err == nil {
			loc = s.chunkAt(s.off, at)
		}
	}
	if err == nil {
		s.loc.Store(loc)
		return loc, unchecked, nil
	}
	wrapped := fmt.Errorf("torchdcp: %s: tensor %q chunk %s: %w", s, s.t.name, formatOffsets(s.offsets()), err)
	var pathErr *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.Is(err, ckpt.ErrSourceChanged):
		loc = failed(wrapped)
	case errors.As(err, &pathErr), errors.As(err, &errno):
		return nil, false, wrapped // transient: not remembered
	default:
		loc = failed(&invalidError{err: wrapped})
	}
	s.loc.Store(loc)
	return nil, false, loc.rest.err
}

// chunkAt is the chunk located at in the record at base in its reader.
func (s *recordSource) chunkAt(base int64, at recordLoc) *chunkBytes {
	nbytes := s.nbytes()
	return &chunkBytes{
		off:       base + at.off,
		entryOff:  base + at.entryOff,
		entrySize: at.entrySize,
		named:     s.t.sharesEntry(at.entry),
		crc:       at.crc,
		whole:     at.off == at.entryOff && nbytes == at.entrySize,
	}
}

// resolveZstd decompresses the whole record, bounded by what the chunk can
// need, into memory (small records, kept in the checkpoint's records) or
// an unlinked temporary file, locates the chunk inside it and checks its
// data entry against its CRC32, since the whole record was just read.
func (s *recordSource) resolveZstd() (*chunkBytes, error) {
	r, size, data, err := s.decompress()
	if err != nil {
		return nil, err
	}
	at, err := locateRecordMemo(r, size, s.want(), &s.t.pkl, nil)
	if err != nil {
		return nil, err
	}
	loc := s.chunkAt(0, at)
	if data != nil {
		loc.mem = true
	} else {
		loc.rest = &chunkRest{r: r}
	}
	sum, err := crcOf(io.NewSectionReader(r, loc.entryOff, loc.entrySize))
	if err != nil {
		return nil, fmt.Errorf("reading back the decompressed record: %w", err)
	}
	if sum != loc.crc {
		return nil, crcMismatch(s.entryName(loc), loc.crc, sum, "after decompression")
	}
	if data != nil {
		s.t.records.put(loc, data)
	}
	return loc, nil
}

// decompress decompresses the whole record, bounded by what the chunk can
// need: into memory (data, when at most memRecordLimit bytes) or an
// unlinked temporary file that the tensor's file set then owns.
func (s *recordSource) decompress() (_ io.ReaderAt, size int64, data []byte, _ error) {
	limit := s.nbytes() + recordOverhead
	dec, err := zstd.NewReader(io.NewSectionReader(s.file, s.off, s.length),
		zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow),
		zstd.WithDecoderMaxMemory(uint64(limit)))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("zstd: %w", err)
	}
	defer dec.Close()

	var buf bytes.Buffer
	n, err := io.CopyN(&buf, dec, memRecordLimit+1)
	if err != nil && err != io.EOF {
		return nil, 0, nil, fmt.Errorf("zstd: %w", err)
	}
	if n <= memRecordLimit {
		return bytes.NewReader(buf.Bytes()), n, buf.Bytes(), nil
	}
	tmp, err := os.CreateTemp(s.t.tmpDir, "ckptfs-zstd-*")
	if err != nil {
		return nil, 0, nil, err
	}
	// Unlinked at once: the data lives as long as the open handle.
	_ = os.Remove(tmp.Name())
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
		}
	}()
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		return nil, 0, nil, fmt.Errorf("spooling decompressed record: %w", err)
	}
	m, err := io.Copy(tmp, io.LimitReader(dec, limit+1-n))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("zstd: %w", err)
	}
	if n+m > limit {
		return nil, 0, nil, fmt.Errorf("zstd: record decompresses to more than %d bytes", limit)
	}
	ok = true
	if s.t.files != nil {
		s.t.files.Adopt(tmp)
	}
	return tmp, n + m, nil, nil
}

// torchOnlyDTypes are the dtypes torch has and safetensors does not
// (torchzip.TorchOnlyDTypes): tensors of these are left out of views with a
// reason. Any other name that safetensors does not know is not a torch dtype
// at all, and the checkpoint is rejected rather than shown without those
// tensors.
var torchOnlyDTypes = torchzip.TorchOnlyDTypes

// dtypeOf maps a torch dtype name to safetensors and its element size.
func dtypeOf(torch string) (safetensors.DType, int64, bool) { return torchzip.DType(torch) }

// spooledBytes bounds what a zstd chunk whose record is spooled to a file
// keeps besides its chunkBytes: its chunkRest and the open *os.File
// (TestResidentCountsSpooledRecords measures it).
const spooledBytes = 512

// ResidentBytes implements ckpt.Resident: the source, and what locating it
// keeps (its chunkBytes; a zstd chunk's spooled file); a tensor's first
// source counts what its sources share, its data.pkl memo and entry name at
// their bounds, and one tensor's the checkpoint's decompressed records at
// their bound (recordCache). All of it is counted whether located yet or
// not: a budget reads this when the view opens, before any chunk is read,
// and a view keeps what it locates for as long as it is open.
func (s *recordSource) ResidentBytes() int64 {
	n := int64(unsafe.Sizeof(*s)) + locatedBytes
	if s.zstd {
		n += spooledBytes
	}
	if s.i == 0 {
		n += int64(unsafe.Sizeof(*s.t)) + int64(len(s.t.name)+len(s.t.dtype)) + memoBound + maxEntryName
		if s.t.countsRecords {
			n += s.t.records.resident()
		}
	}
	return n
}
