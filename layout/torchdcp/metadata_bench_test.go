package torchdcp

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/source"
)

// BenchmarkDecodeManyChunks decodes the .metadata of a checkpoint of 100k
// chunks: the one in $CKPTFS_BENCH_CHUNKS (e2e/bench/gen_chunks.py, pickled
// by Python with the memo), else one of the same shape written with
// EncodeMetadata (protocol 2, no memo). layout's BenchmarkOpenManyChunks
// times the whole open.
func BenchmarkDecodeManyChunks(b *testing.B) {
	var data []byte
	if dir := os.Getenv("CKPTFS_BENCH_CHUNKS"); dir != "" {
		var err error
		if data, err = os.ReadFile(filepath.Join(dir, MetadataFile)); err != nil {
			b.Fatal(err)
		}
	} else {
		data = manyChunksMetadata(b, 100_000)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMetadata(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// manyChunksMetadata encodes the .metadata of one [n, 16] float32 tensor
// saved as n one-row chunks of 1 KiB records in one file.
func manyChunksMetadata(b *testing.B, n int64) []byte {
	const cols, rec = 16, 1024
	t := &TensorMetadata{
		Properties: TensorProperties{DType: "float32", Layout: "torch.strided"},
		Size:       []int64{n, cols},
	}
	m := &Metadata{Items: []Item{{FQN: "t", Tensor: t}},
		Planner: []PlannerEntry{{Key: "t", Path: []any{"t"}}}}
	for i := range n {
		off := []int64{i, 0}
		t.Chunks = append(t.Chunks, ChunkMetadata{Offsets: off, Sizes: []int64{1, cols}})
		m.Storage = append(m.Storage, StorageEntry{Index: Index{FQN: "t", Offset: off},
			Info: StorageInfo{RelativePath: "__0_0.distcp", Offset: i * rec, Length: rec}})
	}
	var buf bytes.Buffer
	if err := EncodeMetadata(&buf, m); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkOpenScale opens the checkpoint in $CKPTFS_BENCH_SCALE
// (e2e/bench/gen_scale.py): the stream decoding and the ckpt model; else
// one of 100k chunks written with EncodeMetadata, its shard file sparse.
func BenchmarkOpenScale(b *testing.B) {
	dir := os.Getenv("CKPTFS_BENCH_SCALE")
	if dir == "" {
		const n, rec = 100_000, 1024 // manyChunksMetadata's
		dir = b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, MetadataFile), manyChunksMetadata(b, n), 0o644); err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, "__0_0.distcp"))
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Truncate(n * rec); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	tree, err := source.OpenLocal(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c, err := OpenTree(tree, Options{})
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
