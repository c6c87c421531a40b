package torchdcp

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip/ziptest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

func TestLocateRecordFiles(t *testing.T) {
	recs := loadManifest(t).records(t)
	for _, tc := range []struct {
		name string
		err  string
	}{
		{name: "offset"}, // storage_offset 3 into a storage of 10
		{name: "param"},  // nn.Parameter wraps the rebuild
		{name: "f8"},     // _rebuild_tensor_v3 + UntypedStorage
		{name: "scalar"}, // 0-dim
		{name: "noncontig", err: "record tensor has strides [6 1] for shape [4 2]: not C-contiguous"},
		{name: "expanded", err: "record tensor has strides [0 1] for shape [2 3]: not C-contiguous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := recs[tc.name]
			data, err := os.ReadFile(filepath.Join("testdata", "records", tc.name+".pt"))
			require.NoError(t, err)
			_, es, ok := dtypeOf(rec.DType)
			require.True(t, ok)
			want := recordWant{DType: rec.DType, ElemSize: es, Sizes: rec.Shape}
			loc, err := locateRecord(bytes.NewReader(data), int64(len(data)), want)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			exp := unhex(t, rec.Hex)
			assert.Equal(t, exp, data[loc.off:loc.off+int64(len(exp))])
			assert.Equal(t, crc32.ChecksumIEEE(data[loc.entryOff:loc.entryOff+loc.entrySize]), loc.crc, "CRC32 of %s", loc.entry)

			// Mismatches against the metadata are caught.
			bad := want
			bad.DType = "int8"
			bad.ElemSize = 1
			_, err = locateRecord(bytes.NewReader(data), int64(len(data)), bad)
			assert.ErrorContains(t, err, "record holds dtype "+rec.DType+", metadata says int8")
			bad = want
			bad.Sizes = append(append([]int64{}, want.Sizes...), 1)
			_, err = locateRecord(bytes.NewReader(data), int64(len(data)), bad)
			assert.ErrorContains(t, err, "chunk sizes are")

			// A record is opened as every torch.save archive is
			// (torchzip.Open): any compressed entry is refused, not only
			// the tensor's storage.
			z := ziptest.Deflate(t, data, "/version")
			_, err = locateRecord(bytes.NewReader(z), int64(len(z)), want)
			assert.ErrorContains(t, err, "version is compressed")
		})
	}
}

func TestContiguous(t *testing.T) {
	for _, tc := range []struct {
		size, stride []int64
		ok           bool
	}{
		{nil, nil, true},
		{[]int64{3, 4}, []int64{4, 1}, true},
		{[]int64{3, 4}, []int64{1, 3}, false},
		{[]int64{1, 4}, []int64{99, 1}, true}, // size-1 dims take any stride
		{[]int64{0, 4}, []int64{7, 7}, true},  // empty tensors are contiguous
		{[]int64{2, 3}, []int64{0, 1}, false},
		{[]int64{2}, []int64{1, 1}, false},
	} {
		assert.Equal(t, tc.ok, contiguous(tc.size, tc.stride), "%v %v", tc.size, tc.stride)
	}
}

func TestParseDataPklHostile(t *testing.T) {
	for _, tc := range []struct {
		name, pkl, err string
	}{
		{"os.system", "\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.", "rebuilds with os.system, not _rebuild_tensor_v2/v3"},
		{"not an object", "\x80\x02K\x01.", "data.pkl holds int, not a tensor"},
		{"bad persistent id", "\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x01\x85QK\x00)))\x89NtR.", "persistent id (1,) is not a 5-tuple"},
		{"storage kind", "\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x01\x00\x00\x00xctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQK\x00)))\x89NtR.", "persistent id of kind"},
		{"too few args", "\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x00tR.", "with 1 arguments, want at least 6"},
		{"storage arg not storage", "\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x00K\x00)))\x89NtR.", "storage argument is int"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseDataPkl([]byte(tc.pkl))
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// FuzzLocateRecord locates a chunk in a torch.save record for a wanted dtype
// and shape ("3,4"; "" for 0-dim). It is seeded with every record of every
// checkpoint in testdata, each with the dtype and shape its metadata gives,
// so that mutations start from records that locate all the way through.
func FuzzLocateRecord(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "records", "*.pt"))
	recs := loadManifest(f).records(f)
	for _, p := range files {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		rec := recs[strings.TrimSuffix(filepath.Base(p), ".pt")]
		f.Add(b, rec.DType, formatShape(rec.Shape))
	}
	for _, dir := range fixtureCheckpoints(f) {
		for _, r := range realRecords(f, dir) {
			f.Add(r.data, r.dtype, formatShape(r.shape))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, dtype, shape string) {
		sizes, ok := parseShape(shape)
		if !ok {
			return
		}
		_, es, ok := dtypeOf(dtype)
		if !ok {
			return
		}
		w := recordWant{DType: dtype, ElemSize: es, Sizes: sizes}
		loc, err := locateRecord(bytes.NewReader(data), int64(len(data)), w)
		if err != nil {
			return
		}
		n, _ := ckpt.NumElements(w.Sizes)
		if loc.off < 0 || loc.off+n*w.ElemSize > int64(len(data)) {
			t.Fatalf("located [%d, %d) outside %d bytes", loc.off, loc.off+n*w.ElemSize, len(data))
		}
		if loc.off < loc.entryOff || loc.off+n*w.ElemSize > loc.entryOff+loc.entrySize || loc.entryOff+loc.entrySize > int64(len(data)) {
			t.Fatalf("chunk [%d, +%d) not inside entry %s [%d, +%d) of %d bytes", loc.off, n*w.ElemSize, loc.entry, loc.entryOff, loc.entrySize, len(data))
		}
		// A fill hands on the chunk's bytes as located, or nothing.
		fill := &chunkFill{parts: [][]byte{make([]byte, n*w.ElemSize)}}
		filledAt, err := locateRecordMemo(bytes.NewReader(data), int64(len(data)), w, nil, fill)
		if err != nil || filledAt != loc {
			t.Fatalf("locating with a fill: %v, %+v; without: %+v", err, filledAt, loc)
		}
		if fill.filled && !bytes.Equal(fill.parts[0], data[loc.off:loc.off+n*w.ElemSize]) {
			t.Fatalf("filled bytes are not the chunk's at %d", loc.off)
		}
	})
}

func formatShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, ",")
}

func parseShape(s string) ([]int64, bool) {
	if s == "" {
		return []int64{}, true
	}
	parts := strings.Split(s, ",")
	if len(parts) > 8 {
		return nil, false
	}
	out := make([]int64, len(parts))
	for i, p := range parts {
		d, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, false
		}
		out[i] = d
	}
	return out, true
}

// fixtureCheckpoints lists the DCP checkpoints in testdata: this package's
// and the repository's (written by real torch and megatron-core).
func fixtureCheckpoints(t testing.TB) []string {
	dirs := []string{}
	for _, name := range checkpoints {
		dirs = append(dirs, filepath.Join("testdata", name))
	}
	more, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*", "ckpt", MetadataFile))
	require.NoError(t, err)
	for _, m := range more {
		dirs = append(dirs, filepath.Dir(m))
	}
	return dirs
}

type realRecord struct {
	data  []byte
	dtype string
	shape []int64
}

// realRecords cuts the record of every tensor chunk out of a checkpoint's
// shards, decompressing zstd ones.
func realRecords(t testing.TB, dir string) []realRecord {
	m, err := decodeFile(t, filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	var out []realRecord
	for _, it := range m.Items {
		if it.Tensor == nil {
			continue
		}
		for _, ch := range it.Tensor.Chunks {
			info, ok := m.Lookup(it.FQN, ch.Offsets)
			require.True(t, ok, "%s %v", it.FQN, ch.Offsets)
			shard, err := os.ReadFile(filepath.Join(dir, info.RelativePath))
			require.NoError(t, err)
			rec := shard[info.Offset : info.Offset+info.Length]
			if len(info.TransformDescriptors) > 0 {
				dec, err := zstd.NewReader(bytes.NewReader(rec))
				require.NoError(t, err)
				rec, err = io.ReadAll(dec)
				dec.Close()
				require.NoError(t, err)
			}
			out = append(out, realRecord{data: rec, dtype: it.Tensor.Properties.DType, shape: ch.Sizes})
		}
	}
	return out
}

// TestRealRecordsLocate: every record of every fixture locates, and its data
// entry matches its CRC32 (the seeds of FuzzLocateRecord reach the end).
func TestRealRecordsLocate(t *testing.T) {
	total := 0
	for _, dir := range fixtureCheckpoints(t) {
		for _, r := range realRecords(t, dir) {
			_, es, ok := dtypeOf(r.dtype)
			if !ok {
				continue // a dtype safetensors cannot name (complex128) is skipped by Open too
			}
			loc, err := locateRecord(bytes.NewReader(r.data), int64(len(r.data)), recordWant{DType: r.dtype, ElemSize: es, Sizes: r.shape})
			require.NoError(t, err, "%s: %s%v", dir, r.dtype, r.shape)
			assert.Equal(t, crc32.ChecksumIEEE(r.data[loc.entryOff:loc.entryOff+loc.entrySize]), loc.crc)
			total++
		}
	}
	assert.Greater(t, total, 100)
}

// countingReader counts the reads through it.
type countingReader struct {
	r     io.ReaderAt
	reads int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	return c.r.ReadAt(p, off)
}

// TestLocateRecordReads: locating a chunk reads the record's zip structures
// in one read (a record no larger than torchzip's two windows: the records
// torch wrote in testdata) or two (head and tail of a larger one, ZIP64 too),
// not one read per header (BENCHMARKS.md, run Z-records).
func TestLocateRecordReads(t *testing.T) {
	recs := loadManifest(t).records(t)
	for _, name := range []string{"offset", "param", "f8", "scalar"} {
		rec := recs[name]
		data, err := os.ReadFile(filepath.Join("testdata", "records", name+".pt"))
		require.NoError(t, err)
		_, es, ok := dtypeOf(rec.DType)
		require.True(t, ok)
		r := &countingReader{r: bytes.NewReader(data)}
		_, err = locateRecord(r, int64(len(data)), recordWant{DType: rec.DType, ElemSize: es, Sizes: rec.Shape})
		require.NoError(t, err, name)
		assert.Equal(t, 1, r.reads, "%s: %d bytes", name, len(data))
	}
	for _, z64 := range []bool{false, true} {
		if z64 {
			defer func(n int64) { zip64Limit = n }(zip64Limit)
			zip64Limit = 16
		}
		c := recordCase{"large", "float32", 4, []int64{300, 300}} // 360 KB: past both windows
		rec, data := writeRecord(t, c, 5)
		r := &countingReader{r: bytes.NewReader(rec)}
		loc, err := locateRecord(r, int64(len(rec)), recordWant{DType: c.dtype, ElemSize: c.es, Sizes: c.shape})
		require.NoError(t, err)
		assert.Equal(t, data, rec[loc.off:loc.off+int64(len(data))])
		assert.Equal(t, 2, r.reads, "zip64=%v", z64)
	}
}

// TestLocateRecordFills: locating a small record, read whole in one window,
// hands on the chunk bytes asked for (all of them, or a part, into several
// parts) from that read, with no read more; a fill outside the chunk, or of
// bytes the windows do not hold (the middle of a record larger than both),
// is left to the reader, the locating unchanged.
func TestLocateRecordFills(t *testing.T) {
	small := recordCase{"small", "float32", 4, []int64{3, 4}}
	rec, data := writeRecord(t, small, 3)
	want := recordWant{DType: small.dtype, ElemSize: small.es, Sizes: small.shape}
	nb := int64(len(data))
	for _, tc := range []struct {
		name   string
		off    int64
		parts  []int
		filled bool
	}{
		{"whole", 0, []int{int(nb)}, true},
		{"in parts", 0, []int{5, 0, int(nb) - 5}, true},
		{"a part", 8, []int{16}, true},
		{"the end", nb - 4, []int{4}, true},
		{"nothing at the end", nb, []int{0}, true},
		{"past the end", nb - 4, []int{8}, false},
		{"before the start", -1, []int{4}, false},
		{"past the chunk", nb + 1, []int{0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &countingReader{r: bytes.NewReader(rec)}
			var parts [][]byte
			for _, n := range tc.parts {
				parts = append(parts, bytes.Repeat([]byte{0xee}, n))
			}
			fill := &chunkFill{off: tc.off, parts: parts}
			loc, err := locateRecordMemo(r, int64(len(rec)), want, nil, fill)
			require.NoError(t, err)
			assert.Equal(t, 1, r.reads)
			assert.Equal(t, data, rec[loc.off:loc.off+nb])
			require.Equal(t, tc.filled, fill.filled)
			got := bytes.Join(parts, nil)
			if tc.filled {
				assert.True(t, bytes.Equal(data[tc.off:tc.off+int64(len(got))], got))
			} else {
				assert.True(t, bytes.Equal(bytes.Repeat([]byte{0xee}, len(got)), got), "untouched")
			}
		})
	}

	// 360 KB: its first data bytes are in the head window, the rest in
	// neither.
	large := recordCase{"large", "float32", 4, []int64{300, 300}}
	rec, data = writeRecord(t, large, 5)
	for _, off := range []int64{0, int64(len(data)) / 2} {
		r := &countingReader{r: bytes.NewReader(rec)}
		fill := &chunkFill{off: off, parts: [][]byte{make([]byte, 16)}}
		_, err := locateRecordMemo(r, int64(len(rec)), recordWant{DType: large.dtype, ElemSize: large.es, Sizes: large.shape}, nil, fill)
		require.NoError(t, err)
		assert.Equal(t, off == 0, fill.filled, "from %d", off)
		if fill.filled {
			assert.Equal(t, data[:16], fill.parts[0])
		}
		assert.Equal(t, 2, r.reads)
	}
}

// TestRecordSourceReadsASmallRecordOnce: a chunk's first ReadAt locates it
// and takes its bytes from the record's one read; later reads read the
// file.
func TestRecordSourceReadsASmallRecordOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	treetest.CopyFixture(t, "fsdp2_4ranks", dir)
	tree := treetest.OpenCounting(t, dir)
	c, err := OpenTree(tree, Options{})
	require.NoError(t, err)
	defer c.Close()
	read := 0
	for _, tn := range c.Tensors {
		for i := range tn.Chunks.Len() {
			ch := tn.Chunks.At(i)
			numel, err := ckpt.NumElements(ch.Sizes)
			require.NoError(t, err)
			if numel == 0 {
				continue
			}
			name := filepath.Base(ch.Source.(ckpt.Backed).Backing().Path)
			tree.Reset()
			first, err := treetest.ReadChunk(t, tn, ch)
			require.NoError(t, err)
			assert.Equal(t, 1, tree.Count()[name].Reads, "%s chunk %d: its record, once", tn.Name, i)
			second, err := treetest.ReadChunk(t, tn, ch)
			require.NoError(t, err)
			assert.Equal(t, first, second)
			assert.Equal(t, 2, tree.Count()[name].Reads, "%s chunk %d: the located chunk read", tn.Name, i)
			read++
		}
	}
	assert.Greater(t, read, 10)
}

// TestLocateAfterRewriteInPlace: a shard rewritten in place once open (the
// same bytes, its mtime put back) fails the next chunk's locating with
// ErrSourceChanged, though its record's windows read well: the windows are
// read in one checked batch.
func TestLocateAfterRewriteInPlace(t *testing.T) {
	dir := copyDir(t, "plain")
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	p := filepath.Join(dir, "__0_0.distcp")
	var inFile []*ckpt.Tensor
	for _, tn := range c.Tensors {
		if s, ok := tn.Chunks.At(0).Source.(ckpt.Backed); ok && s.Backing().Path == p {
			inFile = append(inFile, tn)
		}
	}
	require.GreaterOrEqual(t, len(inFile), 2, "tensors with a chunk in %s", p)
	_, err = treetest.ReadChunk(t, inFile[0], inFile[0].Chunks.At(0))
	require.NoError(t, err) // the shard is open now

	info, err := os.Stat(p)
	require.NoError(t, err)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Chtimes(p, info.ModTime(), info.ModTime()))

	tn := inFile[1]
	_, err = treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	require.ErrorIs(t, err, ckpt.ErrSourceChanged)
	assert.ErrorContains(t, err, fmt.Sprintf("tensor %q chunk", tn.Name))
}

// TestLocateRecordMemo: a record whose data.pkl is the bytes the memo holds
// takes the memo's call (shown by planting a wrong one), one with other
// bytes is decoded and checked anew and replaces it; the memo never lets a
// record through that its own data.pkl would refuse.
func TestLocateRecordMemo(t *testing.T) {
	a, _ := writeRecord(t, recordCase{"a", "float32", 4, []int64{3, 4}}, 1)
	b, dataB := writeRecord(t, recordCase{"b", "float32", 4, []int64{4, 3}}, 2)
	wantA := recordWant{DType: "float32", ElemSize: 4, Sizes: []int64{3, 4}}
	wantB := recordWant{DType: "float32", ElemSize: 4, Sizes: []int64{4, 3}}
	var memo atomic.Pointer[pklMemo]

	_, err := locateRecordMemo(bytes.NewReader(a), int64(len(a)), wantA, &memo, nil)
	require.NoError(t, err)
	m := memo.Load()
	require.NotNil(t, m)
	require.Equal(t, []int64{3, 4}, m.call.Size)

	// The same bytes: the memo's call is taken, not the bytes decoded.
	wrong := *m.call
	wrong.Size = []int64{12}
	memo.Store(&pklMemo{data: m.data, call: &wrong})
	_, err = locateRecordMemo(bytes.NewReader(a), int64(len(a)), wantA, &memo, nil)
	assert.ErrorContains(t, err, "record holds shape [12], chunk sizes are [3 4]")

	// Other bytes: decoded, checked against the metadata, kept.
	loc, err := locateRecordMemo(bytes.NewReader(b), int64(len(b)), wantB, &memo, nil)
	require.NoError(t, err)
	assert.Equal(t, dataB, b[loc.off:loc.off+int64(len(dataB))])
	assert.Equal(t, []int64{4, 3}, memo.Load().call.Size)
	_, err = locateRecordMemo(bytes.NewReader(a), int64(len(a)), wantB, &memo, nil)
	assert.ErrorContains(t, err, "record holds shape [3 4], chunk sizes are [4 3]")
}

// TestLocateRecordMemoBound: a data.pkl over maxMemoPkl is decoded but not
// kept (a tensor's memo stays small).
func TestLocateRecordMemoBound(t *testing.T) {
	a, _ := writeRecord(t, recordCase{"a", "float32", 4, []int64{3, 4}}, 1)
	want := recordWant{DType: "float32", ElemSize: 4, Sizes: []int64{3, 4}}
	var memo atomic.Pointer[pklMemo]
	_, err := locateRecordMemo(bytes.NewReader(a), int64(len(a)), want, &memo, nil)
	require.NoError(t, err)
	require.NotNil(t, memo.Load())

	defer func(n int) { maxMemoPkl = n }(maxMemoPkl)
	memo.Store(nil)
	maxMemoPkl = 10
	_, err = locateRecordMemo(bytes.NewReader(a), int64(len(a)), want, &memo, nil)
	require.NoError(t, err)
	assert.Nil(t, memo.Load())
}

// memoHeld is what a tensor's data.pkl memo holds.
func memoHeld(m *pklMemo) int64 {
	if m == nil {
		return 0
	}
	c := m.call
	return int64(unsafe.Sizeof(*m)+unsafe.Sizeof(*c)+unsafe.Sizeof(*c.Storage)) + int64(len(m.data)) +
		int64(len(c.Storage.Key)+len(c.Storage.Type.Module)+len(c.Storage.Type.Name)+len(c.DType)) + 8*int64(len(c.Size)+len(c.Stride))
}

// TestResidentCountsMemo: what a DCP tensor's sources say they hold covers
// the data.pkl memo that reading its chunks keeps, counted from the open
// (when a mount's metadata budget reads it).
func TestResidentCountsMemo(t *testing.T) {
	for _, name := range []string{"plain", "sharded"} {
		c, err := Open(filepath.Join("testdata", name))
		require.NoError(t, err)
		memos := 0
		for _, tn := range c.Tensors {
			for i := range tn.Chunks.Len() {
				_, err := treetest.ReadChunk(t, tn, tn.Chunks.At(i))
				require.NoError(t, err)
			}
			src, ok := tn.Chunks.Source(0).(*recordSource)
			require.True(t, ok)
			held := memoHeld(src.t.pkl.Load())
			if held > 0 {
				memos++
			}
			own := int64(unsafe.Sizeof(*src) + unsafe.Sizeof(*src.loc.Load()))
			require.Nil(t, src.loc.Load().rest, "a stored record: offsets only")
			shared := src.ResidentBytes() - own
			assert.GreaterOrEqual(t, shared, int64(unsafe.Sizeof(*src.t))+held+int64(len(*src.t.entry.Load())), "%s: %s's memo of %d bytes and entry name", name, tn.Name, held)
		}
		assert.Positive(t, memos, "%s: no memo kept", name)
		require.NoError(t, c.Close())
	}
}

// TestResidentCountsLocatedChunks: what locating a chunk keeps (its
// chunkBytes; the entry name its tensor shares) is counted from the open,
// when a mount's metadata budget reads the count, not once it is kept: a
// checkpoint whose every chunk is located counts what it counted open, each
// source's count covers its located chunk, and a stored record's chunk
// keeps its offsets only.
func TestResidentCountsLocatedChunks(t *testing.T) {
	for _, name := range []string{"plain", "sharded", "zstd"} {
		t.Run(name, func(t *testing.T) {
			c, err := Open(filepath.Join("testdata", name))
			require.NoError(t, err)
			defer c.Close()
			atOpen := c.ResidentBytes()
			located := 0
			for _, tn := range c.Tensors {
				for i := range tn.Chunks.Len() {
					_, err := treetest.ReadChunk(t, tn, tn.Chunks.At(i))
					require.NoError(t, err)
					src := tn.Chunks.Source(i).(*recordSource)
					loc := src.loc.Load()
					require.NotNil(t, loc)
					_, err = loc.result()
					require.NoError(t, err)
					require.True(t, loc.named, "%s chunk %d: named by its tensor's entry name", tn.Name, i)
					assert.Equal(t, "archive/data/0", src.entryName(loc))
					assert.Equal(t, src.zstd, loc.mem, "%s chunk %d: a small zstd record is decompressed in memory (the checkpoint's records)", tn.Name, i)
					assert.Nil(t, loc.rest, "%s chunk %d: offsets only", tn.Name, i)
					assert.GreaterOrEqual(t, src.ResidentBytes(), int64(unsafe.Sizeof(*src)+unsafe.Sizeof(*loc)), "%s chunk %d", tn.Name, i)
					located++
				}
			}
			assert.Positive(t, located)
			assert.Equal(t, atOpen, c.ResidentBytes(), "every chunk located: counted at open")
		})
	}
}

// TestEntryNameShared: a tensor keeps the first entry name its chunks'
// records give, if short, and says which chunks name the same entry; a
// chunk naming another, or every chunk when the first name was long, is
// named by the entry's place in messages.
func TestEntryNameShared(t *testing.T) {
	src := &recordSource{t: &recordTensor{}}
	require.True(t, src.t.sharesEntry(strings.Clone("archive/data/0")))
	require.True(t, src.t.sharesEntry(strings.Clone("archive/data/0")))
	assert.False(t, src.t.sharesEntry("other/data/0"))
	assert.Equal(t, "archive/data/0", src.entryName(&chunkBytes{named: true}))
	assert.Equal(t, "the data entry at [10, 30)", src.entryName(&chunkBytes{entryOff: 10, entrySize: 20}))
	long := &recordSource{t: &recordTensor{}}
	assert.False(t, long.t.sharesEntry(strings.Repeat("a", maxEntryName+1)))
	assert.Nil(t, long.t.entry.Load())
	assert.Equal(t, "the data entry at [0, 5)", long.entryName(&chunkBytes{entrySize: 5, named: true}))
}
