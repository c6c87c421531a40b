package torchdcp

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
)

// Limits of the record locator.
const (
	// recordOverhead is how much larger than its chunk bytes a decompressed
	// torch.save record may be (zip headers, data.pkl, small records).
	recordOverhead = 16 << 20
	// maxZstdWindow bounds the zstd decoder's window (and so its memory).
	maxZstdWindow = 128 << 20
)

// memRecordLimit: decompressed records up to this size stay in memory
// (within the checkpoint's recordCache), larger ones go to an unlinked
// temporary file. A variable for tests.
var memRecordLimit int64 = 1 << 20

// recordWant is what the metadata says a chunk's record must hold.
type recordWant struct {
	DType    string // torch dtype name
	ElemSize int64
	Sizes    []int64
}

// parseDataPkl interprets a tensor record's data.pkl, decoded within the
// limits of a record.
func parseDataPkl(data []byte) (*torchzip.Rebuild, error) {
	v, err := torchzip.DecodePickle(data, torchzip.Record)
	if err != nil {
		return nil, err
	}
	return torchzip.ParseRebuild(v, "data.pkl")
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

// pklMemo is a record's data.pkl and what it decoded to, kept by a tensor
// for its next chunk: the chunks of one tensor from many ranks mostly have
// byte-identical data.pkl (the same dtype, shape and storage key), and the
// same bytes decode to the same call, so only bytes that differ are decoded
// (decoding was most of locating a small record: BENCHMARKS.md, run
// Z-records). The call is only read.
type pklMemo struct {
	data []byte
	call *torchzip.Rebuild
}

// maxMemoPkl bounds the data.pkl a tensor keeps (torch writes about 200
// bytes for a chunk's tensor; a record may hold up to torchzip.Record's MiB),
// so that what a view keeps per tensor stays small whatever the records.
var maxMemoPkl = 512 // a variable for tests

// memoBound is the most a tensor's memo holds, counted for the view's budget
// before it is kept: the data.pkl, and the call decoded from it, whose
// strings are at most the data.pkl's bytes and whose size and stride have at
// most torchzip's 64 dimensions each.
var memoBound = int64(unsafe.Sizeof(pklMemo{})+unsafe.Sizeof(torchzip.Rebuild{})+unsafe.Sizeof(torchzip.Storage{})) +
	2*int64(maxMemoPkl) + 2*64*8

// locateRecord finds a chunk's raw bytes inside the torch.save zip archive
// read through r (size bytes) and checks them against want. The chunk is
// numel(want.Sizes)*want.ElemSize bytes long from the offset returned.
func locateRecord(r io.ReaderAt, size int64, want recordWant) (loc recordLoc, err error) {
	return locateRecordMemo(r, size, want, nil, nil)
}

// chunkFill asks a locating for the chunk's bytes [off, off+n) (n the
// parts' total length), which it copies into parts (filled) when the
// record's windows hold them: a small record's data is read with its
// headers, and a reader need not read it again.
type chunkFill struct {
	off    int64
	parts  [][]byte
	filled bool
}

// from fills f from w, the chunk starting at chunkOff in the archive, if
// w holds the bytes asked for.
func (f *chunkFill) from(w *torchzip.Windows, chunkOff, nbytes int64) {
	if f == nil {
		return
	}
	n := int64(0)
	for _, p := range f.parts {
		n += int64(len(p))
	}
	if f.off < 0 || f.off > nbytes || n > nbytes-f.off {
		return
	}
	b := w.Held(chunkOff+f.off, n)
	if b == nil {
		return
	}
	for _, p := range f.parts {
		b = b[copy(p, b):]
	}
	f.filled = true
}

// locateRecordMemo is locateRecord reusing memo's decoded data.pkl where the
// record's is the same bytes, and keeping the record's there (memo may be
// nil); it fills fill (may be nil) where the windows hold what it asks.
func locateRecordMemo(r io.ReaderAt, size int64, want recordWant, memo *atomic.Pointer[pklMemo], fill *chunkFill) (loc recordLoc, err error) {
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

	// Its zip structures in one or two reads, not a dozen (torchzip.Windowed).
	// Nothing read through the windows is kept: data.pkl is decoded into
	// values of its own, the result is offsets.
	w := torchzip.Windowed(r, size)
	defer w.Release()
	a, err := torchzip.OpenRecord(w, size)
	if err != nil {
		return loc, err
	}
	pkl, err := a.Entry("data.pkl")
	if err != nil {
		return loc, err
	}
	data, err := a.ReadEntry(pkl, torchzip.Record.DataPkl)
	if err != nil {
		return loc, err
	}
	var call *torchzip.Rebuild
	if m := memoOf(memo); m != nil && bytes.Equal(m.data, data) {
		call = m.call
	} else {
		if call, err = parseDataPkl(data); err != nil {
			return loc, err
		}
		if memo != nil && len(data) <= maxMemoPkl {
			memo.Store(&pklMemo{data: bytes.Clone(data), call: call}) // data is the window's
		}
	}

	// The dtype, from the typed storage class or the v3 argument.
	st := call.Storage
	dtype, typed, err := call.StorageDType()
	if err != nil {
		return loc, fmt.Errorf("data.pkl: %w", err)
	}
	if dtype != want.DType {
		return loc, fmt.Errorf("record holds dtype %s, metadata says %s", dtype, want.DType)
	}
	if !slices.Equal(call.Size, want.Sizes) {
		return loc, fmt.Errorf("record holds shape %v, chunk sizes are %v", call.Size, want.Sizes)
	}
	if !contiguous(call.Size, call.Stride) {
		return loc, fmt.Errorf("record tensor has strides %v for shape %v: not C-contiguous", call.Stride, call.Size)
	}
	storageBytes := st.Numel
	if typed {
		if st.Numel > (1<<62)/want.ElemSize {
			return loc, fmt.Errorf("storage of %d elements overflows", st.Numel)
		}
		storageBytes = st.Numel * want.ElemSize
	}
	if call.StorageOffset > (1<<62)/want.ElemSize {
		return loc, fmt.Errorf("storage offset %d overflows", call.StorageOffset)
	}
	start := call.StorageOffset * want.ElemSize
	if start > storageBytes || nbytes > storageBytes-start {
		return loc, fmt.Errorf("tensor bytes [%d, %d) outside its storage of %d bytes", start, start+nbytes, storageBytes)
	}

	df, err := a.Entry("data/" + st.Key)
	if err != nil {
		return loc, err
	}
	entrySize := int64(df.Uncompressed)
	if start+nbytes > entrySize {
		return loc, fmt.Errorf("%s holds %d bytes, the tensor needs [%d, %d)", df.Name(), entrySize, start, start+nbytes)
	}
	off, err := a.DataOffset(df)
	if err != nil {
		return loc, fmt.Errorf("%s: %w", df.Name(), err)
	}
	if off < 0 || off > size || entrySize > size-off {
		return loc, fmt.Errorf("%s: data [%d, %d) past the end of the %d-byte archive", df.Name(), off, off+entrySize, size)
	}
	fill.from(w, off+start, nbytes)
	return recordLoc{off: off + start, entry: df.Name(), entryOff: off, entrySize: entrySize, crc: df.CRC32}, nil
}

func memoOf(memo *atomic.Pointer[pklMemo]) *pklMemo {
	if memo == nil {
		return nil
	}
	return memo.Load()
}

// contiguous is torchzip.Contiguous.
func contiguous(size, stride []int64) bool { return torchzip.Contiguous(size, stride) }
