package torchdcp

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
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

// typedStorages maps legacy typed storage classes (torch.<X>Storage) to the
// torch dtype they hold (torch/storage.py _dtype_to_storage_type_map).
var typedStorages = map[string]string{
	"DoubleStorage":        "float64",
	"FloatStorage":         "float32",
	"HalfStorage":          "float16",
	"BFloat16Storage":      "bfloat16",
	"LongStorage":          "int64",
	"IntStorage":           "int32",
	"ShortStorage":         "int16",
	"CharStorage":          "int8",
	"ByteStorage":          "uint8",
	"BoolStorage":          "bool",
	"ComplexFloatStorage":  "complex64",
	"ComplexDoubleStorage": "complex128",
}

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

// locateRecord finds a chunk's raw bytes inside the torch.save zip archive
// read through r (size bytes) and checks them against want. It returns the
// offset, relative to r, of the chunk's first byte; the chunk is
// numel(want.Sizes)*want.ElemSize bytes long.
func locateRecord(r io.ReaderAt, size int64, want recordWant) (int64, error) {
	if want.ElemSize <= 0 {
		return 0, fmt.Errorf("bad element size %d", want.ElemSize)
	}
	numel, err := ckpt.NumElements(want.Sizes)
	if err != nil {
		return 0, err
	}
	if numel > (1<<62)/want.ElemSize {
		return 0, fmt.Errorf("chunk of %d elements overflows", numel)
	}
	nbytes := numel * want.ElemSize

	zr, err := zip.NewReader(r, size)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return 0, fmt.Errorf("not a torch.save zip archive: %w", err)
	}
	if len(zr.File) == 0 {
		return 0, errors.New("torch.save archive has no entries")
	}
	prefix, _, ok := strings.Cut(zr.File[0].Name, "/")
	if !ok {
		return 0, fmt.Errorf("torch.save archive entry %q has no top-level folder", zr.File[0].Name)
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
			return 0, err
		}
		if string(b) != "little" {
			return 0, fmt.Errorf("byteorder %q is not supported", b)
		}
	}
	pkl := entries[prefix+"/data.pkl"]
	if pkl == nil {
		return 0, fmt.Errorf("torch.save archive has no %s/data.pkl", prefix)
	}
	data, err := readEntry(pkl, maxDataPkl)
	if err != nil {
		return 0, err
	}
	call, err := parseDataPkl(data)
	if err != nil {
		return 0, err
	}

	// The dtype, from the typed storage class or the v3 argument.
	st := call.storage
	dtype, typed := "", false
	switch {
	case st.Type.Module == "torch" && typedStorages[st.Type.Name] != "":
		dtype, typed = typedStorages[st.Type.Name], true
		if call.dtype != "" && call.dtype != dtype {
			return 0, fmt.Errorf("data.pkl: %s holds %s but the tensor is %s", st.Type, dtype, call.dtype)
		}
	case st.Type.Name == "UntypedStorage" && (st.Type.Module == "torch.storage" || st.Type.Module == "torch"):
		if call.dtype == "" {
			return 0, errors.New("data.pkl: UntypedStorage without a dtype (needs _rebuild_tensor_v3)")
		}
		dtype = call.dtype
	default:
		return 0, fmt.Errorf("data.pkl: unsupported storage type %s", st.Type)
	}
	if dtype != want.DType {
		return 0, fmt.Errorf("record holds dtype %s, metadata says %s", dtype, want.DType)
	}
	if !slices.Equal(call.size, want.Sizes) {
		return 0, fmt.Errorf("record holds shape %v, chunk sizes are %v", call.size, want.Sizes)
	}
	if !contiguous(call.size, call.stride) {
		return 0, fmt.Errorf("record tensor has strides %v for shape %v: not C-contiguous", call.stride, call.size)
	}
	storageBytes := st.Numel
	if typed {
		if st.Numel > (1<<62)/want.ElemSize {
			return 0, fmt.Errorf("storage of %d elements overflows", st.Numel)
		}
		storageBytes = st.Numel * want.ElemSize
	}
	if call.storageOffset > (1<<62)/want.ElemSize {
		return 0, fmt.Errorf("storage offset %d overflows", call.storageOffset)
	}
	start := call.storageOffset * want.ElemSize
	if start > storageBytes || nbytes > storageBytes-start {
		return 0, fmt.Errorf("tensor bytes [%d, %d) outside its storage of %d bytes", start, start+nbytes, storageBytes)
	}

	df := entries[prefix+"/data/"+st.Key]
	if df == nil {
		return 0, fmt.Errorf("torch.save archive has no %s/data/%s", prefix, st.Key)
	}
	if df.Method != zip.Store {
		return 0, fmt.Errorf("%s is compressed (method %d); only stored entries can be read in place", df.Name, df.Method)
	}
	if df.CompressedSize64 != df.UncompressedSize64 || df.UncompressedSize64 > uint64(size) {
		return 0, fmt.Errorf("%s: inconsistent sizes %d/%d", df.Name, df.CompressedSize64, df.UncompressedSize64)
	}
	entrySize := int64(df.UncompressedSize64)
	if start+nbytes > entrySize {
		return 0, fmt.Errorf("%s holds %d bytes, the tensor needs [%d, %d)", df.Name, entrySize, start, start+nbytes)
	}
	off, err := df.DataOffset()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", df.Name, err)
	}
	if off < 0 || off > size || entrySize > size-off {
		return 0, fmt.Errorf("%s: data [%d, %d) past the end of the %d-byte archive", df.Name, off, off+entrySize, size)
	}
	return off + start, nil
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

// recordSource is a chunk stored as a torch.save record (optionally zstd
// compressed) in a .distcp file. The first ReadAt locates the raw bytes
// inside the record and remembers where they are (or the error); every
// later ReadAt is a plain pread.
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
	r   io.ReaderAt // GUARDED_BY(mu); the chunk's nbytes raw bytes, once located
	err error       // GUARDED_BY(mu); a lasting failure (bad record, changed source)
}

var _ ckpt.Source = (*recordSource)(nil)

// Backing is the shard file holding the record.
func (s *recordSource) Backing() *ckpt.File { return s.file }

func (s *recordSource) String() string {
	z := ""
	if s.zstd {
		z = " (zstd)"
	}
	return fmt.Sprintf("%s@%d+%d%s", s.file.Rel, s.off, s.length, z)
}

// ReadAt reads the chunk's raw bytes at off. A read that ends past the chunk
// returns the bytes up to its end and io.EOF.
func (s *recordSource) ReadAt(p []byte, off int64) (int, error) {
	r, err := s.located()
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
	n, err := r.ReadAt(want, off)
	if err == io.EOF && n == len(want) {
		err = nil
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// located finds the chunk's bytes on first use and remembers where they
// are. A bad record or a changed source is remembered too; a plain I/O error
// is not, so the next read tries again.
func (s *recordSource) located() (io.ReaderAt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.r != nil || s.err != nil {
		return s.r, s.err
	}
	var r io.ReaderAt
	var err error
	if s.zstd {
		r, err = s.resolveZstd()
	} else {
		var off int64
		off, err = locateRecord(io.NewSectionReader(s.file, s.off, s.length), s.length, s.want)
		if err == nil {
			r = &ckpt.Section{File: s.file, Offset: s.off + off, Length: s.nbytes}
		}
	}
	if err == nil {
		s.r = r
		return r, nil
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

// resolveZstd decompresses the whole record, bounded by what the chunk can
// need, into memory (small records) or an unlinked temporary file, and
// locates the chunk inside it.
func (s *recordSource) resolveZstd() (io.ReaderAt, error) {
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
	off, err := locateRecord(r, size, s.want)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(r, off, s.nbytes), nil
}

// dtypeOf maps a torch dtype name to safetensors and its element size.
func dtypeOf(torch string) (safetensors.DType, int64, bool) {
	d, ok := safetensors.FromTorch(torch)
	if !ok || d.Size() <= 0 {
		return "", 0, false
	}
	return d, int64(d.Size()), true
}
