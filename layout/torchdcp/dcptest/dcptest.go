// Package dcptest writes DCP checkpoints for tests: real torch.save
// records (torchdcp.NewRecordWriter), optionally zstd-compressed, in
// numbers of chunks that the fixtures torch writes do not reach.
package dcptest

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// memShard is a torchdcp.PosWriter in memory.
type memShard struct{ b []byte }

func (m *memShard) Write(p []byte) (int, error) { m.b = append(m.b, p...); return len(p), nil }
func (m *memShard) Pos() int64                  { return int64(len(m.b)) }
func (m *memShard) Patch(p []byte, off int64) error {
	copy(m.b[off:], p)
	return nil
}

// WriteChunked writes a DCP checkpoint of real records, one shard: tensor
// "rows" [n, 16] float32 in n one-row chunks (one run each) and "cols"
// [16, n] in n one-column chunks (16 runs each), every record compressed
// with zstd when compress is set. Element values are their index in the
// tensor, so a read can be checked.
func WriteChunked(t testing.TB, dir string, n int64, compress bool) {
	WriteWide(t, dir, n, 16, compress)
}

// WriteWide is WriteChunked with k numbers a chunk (4k bytes) for 16.
func WriteWide(t testing.TB, dir string, n, k int64, compress bool) {
	t.Helper()
	var shard memShard
	m := &torchdcp.Metadata{}
	var enc *zstd.Encoder
	if compress {
		var err error
		enc, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
		require.NoError(t, err)
		defer enc.Close()
	}
	add := func(fqn string, size []int64, chunk func(i int64) (off, sizes []int64, vals []float32)) {
		tm := &torchdcp.TensorMetadata{Properties: torchdcp.TensorProperties{DType: "float32", Layout: "torch.strided"}, Size: size}
		m.Items = append(m.Items, torchdcp.Item{FQN: fqn, Tensor: tm})
		m.Planner = append(m.Planner, torchdcp.PlannerEntry{Key: fqn, Path: []any{fqn}})
		for i := range n {
			off, sizes, vals := chunk(i)
			var rec memShard
			w, err := torchdcp.NewRecordWriter(&rec, "float32", 4, sizes)
			require.NoError(t, err)
			_, err = w.Write(unsafe.Slice((*byte)(unsafe.Pointer(&vals[0])), 4*len(vals)))
			require.NoError(t, err)
			require.NoError(t, w.Close())
			info := torchdcp.StorageInfo{RelativePath: torchdcp.ShardName(0, 0), Offset: shard.Pos()}
			if compress {
				rec.b = enc.EncodeAll(rec.b, nil)
				info.TransformDescriptors = []string{"stream.zstd/1"}
			}
			info.Length = int64(len(rec.b))
			shard.b = append(shard.b, rec.b...)
			tm.Chunks = append(tm.Chunks, torchdcp.ChunkMetadata{Offsets: off, Sizes: sizes})
			m.Storage = append(m.Storage, torchdcp.StorageEntry{Index: torchdcp.Index{FQN: fqn, Offset: off}, Info: info})
		}
	}
	add("rows", []int64{n, k}, func(i int64) ([]int64, []int64, []float32) {
		vals := make([]float32, k)
		for j := range vals {
			vals[j] = float32(i*k + int64(j))
		}
		return []int64{i, 0}, []int64{1, k}, vals
	})
	add("cols", []int64{k, n}, func(i int64) ([]int64, []int64, []float32) {
		vals := make([]float32, k)
		for j := range vals {
			vals[j] = float32(int64(j)*n + i)
		}
		return []int64{0, i}, []int64{k, 1}, vals
	})
	f, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	require.NoError(t, err)
	require.NoError(t, torchdcp.EncodeMetadata(f, m))
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, torchdcp.ShardName(0, 0)), shard.b, 0o644))
}
