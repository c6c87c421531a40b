package torchdcp

import (
	"archive/zip"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// memRecords is a PosWriter in memory.
type memRecords struct{ b []byte }

func (m *memRecords) Write(p []byte) (int, error) { m.b = append(m.b, p...); return len(p), nil }
func (m *memRecords) Pos() int64                  { return int64(len(m.b)) }
func (m *memRecords) Patch(p []byte, off int64) error {
	copy(m.b[off:], p)
	return nil
}

type recordCase struct {
	name  string
	dtype string
	es    int64
	shape []int64
}

var recordCases = []recordCase{
	{"f32", "float32", 4, []int64{3, 4}},
	{"bf16", "bfloat16", 2, []int64{5}},
	{"bool", "bool", 1, []int64{2, 3}},
	{"scalar", "int64", 8, []int64{}},
	{"empty", "float32", 4, []int64{0, 4}},
	{"f8", "float8_e4m3fn", 1, []int64{7}},
	{"u16", "uint16", 2, []int64{2, 3}},
	{"u64", "uint64", 8, []int64{2}},
	{"c64", "complex64", 8, []int64{3}},
}

// writeRecord writes the record of c, with data bytes derived from seed, at
// a position that is not a multiple of 64 (records start anywhere in a
// shard file), and returns the record and its data.
func writeRecord(t *testing.T, c recordCase, seed byte) (rec, data []byte) {
	t.Helper()
	numel, err := ckpt.NumElements(c.shape)
	require.NoError(t, err)
	data = make([]byte, numel*c.es)
	for i := range data {
		data[i] = seed + byte(i*7)
		if c.dtype == "bool" {
			data[i] &= 1
		}
	}
	out := &memRecords{b: []byte("prefix of 13 ")}
	w, err := NewRecordWriter(out, c.dtype, c.es, c.shape)
	require.NoError(t, err)
	for off := 0; off < len(data); off += 5 { // written in pieces
		_, err := w.Write(data[off:min(off+5, len(data))])
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return out.b[13:], data
}

// TestRecordWriterRoundTrip: what RecordWriter writes is a zip archive
// whose every CRC holds, and the record locator finds the chunk's bytes in
// it; with ZIP64 records forced on too.
func TestRecordWriterRoundTrip(t *testing.T) {
	for _, z64 := range []bool{false, true} {
		if z64 {
			defer func(n int64) { zip64Limit = n }(zip64Limit)
			zip64Limit = 16
		}
		for _, c := range recordCases {
			t.Run(fmt.Sprintf("%s/zip64=%v", c.name, z64), func(t *testing.T) {
				rec, data := writeRecord(t, c, 3)
				zr, err := zip.NewReader(bytes.NewReader(rec), int64(len(rec)))
				require.NoError(t, err)
				var names []string
				for _, f := range zr.File {
					names = append(names, f.Name)
					rc, err := f.Open()
					require.NoError(t, err)
					_, err = io.Copy(io.Discard, rc) // checks the CRC
					require.NoError(t, err, f.Name)
					off, err := f.DataOffset()
					require.NoError(t, err)
					assert.Zero(t, off%archiveAlign, "%s data at %d", f.Name, off)
				}
				assert.Equal(t, []string{"archive/data.pkl", "archive/byteorder", "archive/data/0", "archive/version"}, names)
				loc, err := locateRecord(bytes.NewReader(rec), int64(len(rec)), recordWant{DType: c.dtype, ElemSize: c.es, Sizes: c.shape})
				require.NoError(t, err)
				assert.Equal(t, data, rec[loc.off:loc.off+int64(len(data))])
				assert.Equal(t, crc32.ChecksumIEEE(data), loc.crc)
			})
		}
	}
}

func TestRecordWriterCounts(t *testing.T) {
	w, err := NewRecordWriter(&memRecords{}, "float32", 4, []int64{2})
	require.NoError(t, err)
	_, err = w.Write(make([]byte, 4))
	require.NoError(t, err)
	require.ErrorContains(t, w.Close(), "only 4 written")
	_, err = w.Write(make([]byte, 5))
	require.ErrorContains(t, err, "1 more written")
	_, err = NewRecordWriter(&memRecords{}, "float4_e2m1fn_x2", 1, nil)
	require.ErrorContains(t, err, "no storage")
}

// TestRecordWriterTorchLoads has real torch load every record, ZIP64 ones
// too, as FileSystemReader loads a chunk.
func TestRecordWriterTorchLoads(t *testing.T) {
	py := testenv.Python(t, "torch")
	defer func(n int64) { zip64Limit = n }(zip64Limit)
	dir := t.TempDir()
	type entry struct {
		Name  string  `json:"name"`
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
		Hex   string  `json:"hex"`
	}
	var entries []entry
	for _, limit := range []int64{zip64Limit, 16} {
		zip64Limit = limit
		for _, c := range recordCases {
			rec, data := writeRecord(t, c, 11)
			name := fmt.Sprintf("%s-%d", c.name, limit)
			require.NoError(t, os.WriteFile(filepath.Join(dir, name+".pt"), rec, 0o644))
			entries = append(entries, entry{name, c.dtype, append([]int64{}, c.shape...), hex.EncodeToString(data)})
		}
	}
	b, err := json.Marshal(entries)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "records.json"), b, 0o644))
	out, err := exec.Command(py, filepath.Join("testdata", "check_records.py"), dir).CombinedOutput()
	t.Logf("check_records.py:\n%s", out)
	require.NoError(t, err, "torch rejected a record:\n%s", out)
}

// TestTensorPickle checks data.pkl against what torch.save writes for the
// same tensors, modulo torch's memo opcodes (BINPUT), which a loader does
// not need: the structure is decoded and compared.
func TestTensorPickle(t *testing.T) {
	for _, tc := range []struct {
		dtype   string
		es      int64
		shape   []int64
		rebuild string
		storage pickle.Global
		numel   int64
		stride  pickle.Tuple
		extra   int // trailing dtype argument
	}{
		{"float32", 4, []int64{3, 4}, "_rebuild_tensor_v2", pickle.Global{Module: "torch", Name: "FloatStorage"}, 12, pickle.Tuple{int64(4), int64(1)}, 0},
		{"bool", 1, []int64{}, "_rebuild_tensor_v2", pickle.Global{Module: "torch", Name: "BoolStorage"}, 1, pickle.Tuple{}, 0},
		{"uint16", 2, []int64{2, 0, 3}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 0, pickle.Tuple{int64(3), int64(3), int64(1)}, 1},
		{"float8_e4m3fn", 1, []int64{5}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 5, pickle.Tuple{int64(1)}, 1},
		{"uint64", 8, []int64{2}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 16, pickle.Tuple{int64(1)}, 1},
	} {
		b, err := tensorPickle(tc.dtype, tc.es, tc.shape)
		require.NoError(t, err)
		var pid pickle.Tuple
		v, err := pickle.DecodeBytes(b, pickle.Options{PersistentLoad: func(p any) (any, error) {
			pid = p.(pickle.Tuple)
			return "STORAGE", nil
		}})
		require.NoError(t, err)
		obj := v.(*pickle.Object)
		assert.Equal(t, pickle.Global{Module: "torch._utils", Name: tc.rebuild}, obj.Class)
		assert.Equal(t, pickle.Tuple{"storage", tc.storage, "0", "cpu", tc.numel}, pid)
		require.Len(t, obj.Args, 6+tc.extra)
		assert.Equal(t, "STORAGE", obj.Args[0])
		assert.Equal(t, int64(0), obj.Args[1])
		shape := pickle.Tuple{}
		for _, d := range tc.shape {
			shape = append(shape, d)
		}
		assert.Equal(t, shape, obj.Args[2])
		assert.Equal(t, tc.stride, obj.Args[3])
		assert.Equal(t, false, obj.Args[4])
		assert.True(t, obj.Args[5].(*pickle.Object).Is("collections", "OrderedDict"))
		if tc.extra == 1 {
			assert.Equal(t, pickle.Global{Module: "torch", Name: tc.dtype}, obj.Args[6])
		}
	}
	_, err := tensorPickle("float4_e2m1fn_x2", 1, nil)
	assert.ErrorContains(t, err, "no storage")
}
