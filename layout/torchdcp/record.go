package torchdcp

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
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
