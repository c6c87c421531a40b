package torchdcp

import (
	"bytes"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

func FuzzLocateRecord(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "records", "*.pt"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	// Records cut out of a real shard.
	m, err := decodeFile(f, filepath.Join("testdata", "plain", MetadataFile))
	require.NoError(f, err)
	shard, err := os.ReadFile(filepath.Join("testdata", "plain", "__0_0.distcp"))
	require.NoError(f, err)
	for _, e := range m.Storage[:4] {
		f.Add(shard[e.Info.Offset : e.Info.Offset+e.Info.Length])
	}
	wants := []recordWant{
		{DType: "float32", ElemSize: 4, Sizes: []int64{3, 4}},
		{DType: "int64", ElemSize: 8, Sizes: []int64{4}},
		{DType: "float8_e4m3fn", ElemSize: 1, Sizes: []int64{2, 3}},
		{DType: "float64", ElemSize: 8, Sizes: []int64{}},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, w := range wants {
			loc, err := locateRecord(bytes.NewReader(data), int64(len(data)), w)
			if err != nil {
				continue
			}
			n := int64(1)
			for _, s := range w.Sizes {
				n *= s
			}
			if loc.off < 0 || loc.off+n*w.ElemSize > int64(len(data)) {
				t.Fatalf("located [%d, %d) outside %d bytes", loc.off, loc.off+n*w.ElemSize, len(data))
			}
		}
	})
}
