package torchdcp

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/klauspost/compress/zstd"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Limits of the record locator.
const (
	// maxDataPkl bounds a record's data.pkl; a tensor's is ~200 bytes.
	maxDataPkl = 1 << 20
	// recordOverhead is how much larger than its chunk bytes a decompressed
	// torch.save record may be (zip headers, data.pkl, small records).
	recordOverhead = 16 << 20
	// maxZstdWindow bounds the zstd decoder's window (and so its memory).
	maxZstdWindow = 128 << 20
)

// memRecordLimit: decompressed records up to this size stay in memory,
// larger ones go to an unlinked temporary file. A variable for tests.
var memRecordLimit int64 = 1 << 20

// recordWant is what the metadata says a chunk's record must hold.
type recordWant struct {
	DType    string // torch dtype name
	ElemSize int64
	Sizes    []int64
}

// storageRef is what the persistent-load hook returns for
// ('storage', storage_type, key, location, numel).
type storageRef struct {
	Type  pickle.Global
	Key   string
	Numel int64
}

func persistentStorage(pid any) (any, error) {
	t, ok := pid.(pickle.Tuple)
	if !ok || len(t) != 5 {
		return nil, fmt.Errorf("persistent id %s is not a 5-tuple", pickle.Repr(pid))
	}
	if s, _ := t[0].(string); s != "storage" {
		return nil, fmt.Errorf("persistent id of kind %s, want 'storage'", pickle.Repr(t[0]))
	}
	typ, ok := t[1].(pickle.Global)
	if !ok {
		return nil, fmt.Errorf("storage type %s is not a class", pickle.Repr(t[1]))
	}
	key, ok := t[2].(string)
	if !ok {
		return nil, fmt.Errorf("storage key %s is not a str", pickle.Repr(t[2]))
	}
	numel, ok := pickle.Int(t[4])
	if !ok || numel < 0 {
		return nil, fmt.Errorf("storage size %s is not a non-negative int", pickle.Repr(t[4]))
	}
	return &storageRef{Type: typ, Key: key, Numel: numel}, nil
}

// rebuildCall is a tensor rebuild: _rebuild_tensor_v2/v3 and its arguments.
type rebuildCall struct {
	storage       *storageRef
	storageOffset int64
	size, stride  []int64
	dtype         string // v3 only
}

// parseDataPkl interprets a tensor record's data.pkl.
func parseDataPkl(data []byte) (*rebuildCall, error) {
	v, err := pickle.DecodeBytes(data, pickle.Options{
		MaxInputBytes: maxDataPkl, MaxStringLen: 1 << 16, MaxItems: 1 << 16,
		MaxDepth: 32, MaxStack: 1 << 12, MaxMemo: 1 << 12,
		PersistentLoad: persistentStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("data.pkl: %w", err)
	}
	obj, ok := v.(*pickle.Object)
	// Unwrap nn.Parameter and tensor subclasses down to the tensor rebuild.
	for i := 0; ok && i < 4; i++ {
		switch {
		case obj.Is("torch._utils", "_rebuild_parameter"), obj.Is("torch._utils", "_rebuild_parameter_with_state"):
			if len(obj.Args) == 0 {
				return nil, fmt.Errorf("data.pkl: %s without arguments", obj.Class)
			}
			obj, ok = obj.Args[0].(*pickle.Object)
			continue
		case obj.Is("torch._tensor", "_rebuild_from_type_v2"):
			if len(obj.Args) < 3 {
				return nil, fmt.Errorf("data.pkl: %s with %d arguments", obj.Class, len(obj.Args))
			}
			fn, ok1 := obj.Args[0].(pickle.Global)
			args, ok2 := obj.Args[2].(pickle.Tuple)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("data.pkl: unexpected %s arguments", obj.Class)
			}
			obj = &pickle.Object{Class: fn, Args: args}
			continue
		}
		break
	}
	if !ok {
		return nil, fmt.Errorf("data.pkl holds %s, not a tensor", pickle.TypeName(v))
	}
	v3 := obj.Is("torch._utils", "_rebuild_tensor_v3")
	if !v3 && !obj.Is("torch._utils", "_rebuild_tensor_v2") {
		return nil, fmt.Errorf("data.pkl rebuilds with %s, not _rebuild_tensor_v2/v3", obj.Class)
	}
	want := 6
	if v3 {
		want = 7
	}
	if len(obj.Args) < want {
		return nil, fmt.Errorf("data.pkl: %s with %d arguments, want at least %d", obj.Class.Name, len(obj.Args), want)
	}
	c := &rebuildCall{}
	if c.storage, ok = obj.Args[0].(*storageRef); !ok {
		return nil, fmt.Errorf("data.pkl: storage argument is %s, not a persistent storage", pickle.TypeName(obj.Args[0]))
	}
	if c.storageOffset, ok = pickle.Int(obj.Args[1]); !ok || c.storageOffset < 0 {
		return nil, fmt.Errorf("data.pkl: storage offset %s is not a non-negative int", pickle.Repr(obj.Args[1]))
	}
	var err2 error
	if c.size, err2 = decodeSize("size", obj.Args[2]); err2 != nil {
		return nil, fmt.Errorf("data.pkl: %w", err2)
	}
	if c.stride, err2 = decodeSize("stride", obj.Args[3]); err2 != nil {
		return nil, fmt.Errorf("data.pkl: %w", err2)
	}
	if v3 {
		g, ok := obj.Args[6].(pickle.Global)
		if !ok || g.Module != "torch" {
			return nil, fmt.Errorf("data.pkl: dtype argument is %s, not a torch dtype", pickle.TypeName(obj.Args[6]))
		}
		c.dtype = g.Name
	}
	return c, nil
}

// recordLoc is where a chunk's raw bytes sit in a torch.save zip archive:
// inside the data entry of its storage, which the archive's central
// directory gives a CRC32 for.
type recordLoc struct {
	off       int64  // the chunk's first byte, relative to the archive
	entry     string // the data entry's name ("archive/data/0")
	entryOff  int64  // the entry's first byte, relative to the archive
	entrySize int64
	crc       uint32 // CRC32 (IEEE) of the entry's bytes
}

// locateRecord finds a chunk's raw bytes inside the torch.save zip archive
// read through r (size bytes) and checks them against want. The chunk is
// numel(want.Sizes)*want.ElemSize bytes long from the offset returned.
func locateRecord(r io.ReaderAt, size int64, want recordWant) (loc recordLoc, err error) {
	if want.ElemSize <= 0 {
		return loc, fmt.Errorf("bad element size %d", want.ElemSize)
	}
	numel, err := ckpt.NumElements(want.Sizes)
	if err != nil {
		return loc, err
	}
	if numel > (1<<62)/want.ElemSize {
		return loc, fmt.Errorf("chunk of %d elements overflows", numel)
	}
	nbytes := numel * want.ElemSize

	zr, err := zip.NewReader(r, size)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return loc, fmt.Errorf("not a torch.save zip archive: %w", err)
	}
	if len(zr.File) == 0 {
		return loc, errors.New("torch.save archive has no entries")
	}
	prefix, _, ok := strings.Cut(zr.File[0].Name, "/")
	if !ok {
		return loc, fmt.Errorf("torch.save archive entry %q has no top-level folder", zr.File[0].Name)
	}
	entries := make(map[string]*zip.File, len(zr.File))
	for _, f := range zr.File {
		if _, dup := entries[f.Name]; !dup {
			entries[f.Name] = f
		}
	}

	if bo := entries[prefix+"/byteorder"]; bo != nil {
		b, err := readEntry(bo, 16)
		if err != nil {
			return loc, err
		}
		if string(b) != "little" {
			return loc, fmt.Errorf("byteorder %q is not supported", b)
		}
	}
	pkl := entries[prefix+"/data.pkl"]
	if pkl == nil {
		return loc, fmt.Errorf("torch.save archive has no %s/data.pkl", prefix)
	}
	data, err := readEntry(pkl, maxDataPkl)
	if err != nil {
		return loc, err
	}
	call, err := parseDataPkl(data)
	if err != nil {
		return loc, err
	}

	// The dtype, from the typed storage class or the v3 argument.
	st := call.storage
	dtype, typed := "", false
	switch {
	case st.Type.Module == "torch" && typedStorages[st.Type.Name] != "":
		dtype, typed = typedStorages[st.Type.Name], true
		if call.dtype != "" && call.dtype != dtype {
			return loc, fmt.Errorf("data.pkl: %s holds %s but the tensor is %s", st.Type, dtype, call.dtype)
		}
	case st.Type.Name == "UntypedStorage" && (st.Type.Module == "torch.storage" || st.Type.Module == "torch"):
		if call.dtype == "" {
			return loc, errors.New("data.pkl: UntypedStorage without a dtype (needs _rebuild_tensor_v3)")
		}
		dtype = call.dtype
	default:
		return loc, fmt.Errorf("data.pkl: unsupported storage type %s", st.Type)
	}
	if dtype != want.DType {
		return loc, fmt.Errorf("record holds dtype %s, metadata says %s", dtype, want.DType)
	}
	if !slices.Equal(call.size, want.Sizes) {
		return loc, fmt.Errorf("record holds shape %v, chunk sizes are %v", call.size, want.Sizes)
	}
	if !contiguous(call.size, call.stride) {
		return loc, fmt.Errorf("record tensor has strides %v for shape %v: not C-contiguous", call.stride, call.size)
	}
	storageBytes := st.Numel
	if typed {
		if st.Numel > (1<<62)/want.ElemSize {
			return loc, fmt.Errorf("storage of %d elements overflows", st.Numel)
		}
		storageBytes = st.Numel * want.ElemSize
	}
	if call.storageOffset > (1<<62)/want.ElemSize {
		return loc, fmt.Errorf("storage offset %d overflows", call.storageOffset)
	}
	start := call.storageOffset * want.ElemSize
	if start > storageBytes || nbytes > storageBytes-start {
		return loc, fmt.Errorf("tensor bytes [%d, %d) outside its storage of %d bytes", start, start+nbytes, storageBytes)
	}

	df := entries[prefix+"/data/"+st.Key]
	if df == nil {
		return loc, fmt.Errorf("torch.save archive has no %s/data/%s", prefix, st.Key)
	}
	if df.Method != zip.Store {
		return loc, fmt.Errorf("%s is compressed (method %d); only stored entries can be read in place", df.Name, df.Method)
	}
	if df.CompressedSize64 != df.UncompressedSize64 || df.UncompressedSize64 > uint64(size) {
		return loc, fmt.Errorf("%s: inconsistent sizes %d/%d", df.Name, df.CompressedSize64, df.UncompressedSize64)
	}
	entrySize := int64(df.UncompressedSize64)
	if start+nbytes > entrySize {
		return loc, fmt.Errorf("%s holds %d bytes, the tensor needs [%d, %d)", df.Name, entrySize, start, start+nbytes)
	}
	off, err := df.DataOffset()
	if err != nil {
		return loc, fmt.Errorf("%s: %w", df.Name, err)
	}
	if off < 0 || off > size || entrySize > size-off {
		return loc, fmt.Errorf("%s: data [%d, %d) past the end of the %d-byte archive", df.Name, off, off+entrySize, size)
	}
	return recordLoc{off: off + start, entry: df.Name, entryOff: off, entrySize: entrySize, crc: df.CRC32}, nil
}

func readEntry(f *zip.File, limit int64) ([]byte, error) {
	if f.UncompressedSize64 > uint64(limit) {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", f.Name, f.UncompressedSize64, limit)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is more than the %d bytes allowed", f.Name, limit)
	}
	return b, nil
}

// contiguous reports whether stride is C-contiguous for size, with torch's
// rules: dimensions of size 1 may have any stride, and a tensor with no
// elements is always contiguous.
func contiguous(size, stride []int64) bool {
	if len(size) != len(stride) {
		return false
	}
	for _, s := range size {
		if s == 0 {
			return true
		}
	}
	expected := int64(1)
	for d := len(size) - 1; d >= 0; d-- {
		if size[d] == 1 {
			continue
		}
		if stride[d] != expected {
			return false
		}
		expected *= size[d]
	}
	return true
}

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
	file   *ckpt.File
	off    int64 // record offset in file
	length int64 // record length in file
	zstd   bool
	want   recordWant
	nbytes int64 // chunk bytes
	tensor string
	chunk  string // formatted chunk offsets, for messages
	tmpDir string
	files  *ckpt.FileSet // owns the scratch file of a large zstd record

	mu  sync.Mutex
	loc *chunkBytes // GUARDED_BY(mu); set once located
	err error       // GUARDED_BY(mu); a lasting failure (bad record, changed source)
}

// chunkBytes is a located chunk: readers of its bytes and of the whole data
// entry holding them, and the entry's CRC32.
type chunkBytes struct {
	chunk io.ReaderAt       // the chunk's nbytes bytes
	entry *io.SectionReader // the data entry
	name  string            // the entry's name in the record
	crc   uint32
	whole bool // the chunk is the whole entry
}

var (
	_ ckpt.Source   = (*recordSource)(nil)
	_ ckpt.Verifier = (*recordSource)(nil)
)

// Backing is the shard file holding the record.
func (s *recordSource) Backing() *ckpt.File { return s.file }

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
	loc, err := s.located()
	if err != nil {
		return 0, err
	}
	if off < 0 || off > s.nbytes {
		return 0, fmt.Errorf("torchdcp: %s: offset %d outside chunk of %d bytes", s, off, s.nbytes)
	}
	want := p
	if int64(len(want)) > s.nbytes-off {
		want = want[:s.nbytes-off]
	}
	n, err := loc.chunk.ReadAt(want, off)
	if err == io.EOF && n == len(want) {
		err = nil
	}
	if err == nil && loc.whole && off == 0 && int64(n) == s.nbytes {
		err = s.checkCRC(loc, crc32.ChecksumIEEE(want[:n]))
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
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
	sum, err := crcOf(loc.entry)
	if err != nil {
		return fmt.Errorf("torchdcp: %s: tensor %q chunk %s: verifying %s: %w", s, s.tensor, s.chunk, loc.name, err)
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
	return fmt.Errorf("torchdcp: %s: tensor %q chunk %s: %w", s, s.tensor, s.chunk, crcMismatch(loc.name, loc.crc, got, "in the bytes read"))
}

// located finds the chunk's bytes on first use and remembers where they
// are. A bad record or a changed source is remembered too; a plain I/O error
// is not, so the next read tries again.
func (s *recordSource) located() (*chunkBytes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loc != nil || s.err != nil {
		return s.loc, s.err
	}
	var loc *chunkBytes
	var err error
	if s.zstd {
		loc, err = s.resolveZstd()
	} else {
		loc, err = s.resolve(io.NewSectionReader(s.file, s.off, s.length), s.length)
	}
	if err == nil {
		s.loc = loc
		return loc, nil
	}
	wrapped := fmt.Errorf("torchdcp: %s: tensor %q chunk %s: %w", s, s.tensor, s.chunk, err)
	var pathErr *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.Is(err, ckpt.ErrSourceChanged):
		s.err = wrapped
	case errors.As(err, &pathErr), errors.As(err, &errno):
		return nil, wrapped // transient: not remembered
	default:
		s.err = &invalidError{err: wrapped}
	}
	return nil, s.err
}

// resolve locates the chunk in the record read through r.
func (s *recordSource) resolve(r io.ReaderAt, size int64) (*chunkBytes, error) {
	at, err := locateRecord(r, size, s.want)
	if err != nil {
		return nil, err
	}
	return &chunkBytes{
		chunk: io.NewSectionReader(r, at.off, s.nbytes),
		entry: io.NewSectionReader(r, at.entryOff, at.entrySize),
		name:  at.entry,
		crc:   at.crc,
		whole: at.off == at.entryOff && s.nbytes == at.entrySize,
	}, nil
}

// resolveZstd decompresses the whole record, bounded by what the chunk can
// need, into memory (small records) or an unlinked temporary file, locates
// the chunk inside it and checks its data entry against its CRC32, since the
// whole record was just read.
func (s *recordSource) resolveZstd() (*chunkBytes, error) {
	limit := s.nbytes + recordOverhead
	dec, err := zstd.NewReader(io.NewSectionReader(s.file, s.off, s.length),
		zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow),
		zstd.WithDecoderMaxMemory(uint64(limit)))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	defer dec.Close()

	var buf bytes.Buffer
	n, err := io.CopyN(&buf, dec, memRecordLimit+1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	var r io.ReaderAt
	size := n
	if n <= memRecordLimit {
		r = bytes.NewReader(buf.Bytes())
	} else {
		tmp, err := os.CreateTemp(s.tmpDir, "ckptfs-zstd-*")
		if err != nil {
			return nil, err
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
			return nil, fmt.Errorf("spooling decompressed record: %w", err)
		}
		m, err := io.Copy(tmp, io.LimitReader(dec, limit+1-n))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		size += m
		if size > limit {
			return nil, fmt.Errorf("zstd: record decompresses to more than %d bytes", limit)
		}
		ok = true
		if s.files != nil {
			s.files.Adopt(tmp)
		}
		r = tmp
	}
	loc, err := s.resolve(r, size)
	if err != nil {
		return nil, err
	}
	sum, err := crcOf(loc.entry)
	if err != nil {
		return nil, fmt.Errorf("reading back the decompressed record: %w", err)
	}
	if sum != loc.crc {
		return nil, crcMismatch(loc.name, loc.crc, sum, "after decompression")
	}
	return loc, nil
}

// dtypeOf maps a torch dtype name to safetensors and its element size.
func dtypeOf(torch string) (safetensors.DType, int64, bool) {
	d, ok := safetensors.FromTorch(torch)
	if !ok || d.Size() <= 0 {
		return "", 0, false
	}
	return d, int64(d.Size()), true
}
