package layout

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/view"
)

// BenchmarkOpenManyChunks opens a checkpoint of 100k chunks and plans its
// view: the one in $CKPTFS_BENCH_CHUNKS (made by e2e/bench/gen_chunks.py
// with real torch), else one of the same shape written here with this
// module's .metadata encoder (one [100000, 16] float32 tensor saved as
// one-row chunks of one shard file, sparse).
func BenchmarkOpenManyChunks(b *testing.B) {
	dir := os.Getenv("CKPTFS_BENCH_CHUNKS")
	if dir == "" {
		dir = manyChunks(b, 100_000)
	}
	for b.Loop() {
		c, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := view.Plan(c, view.Options{}); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// manyChunks writes a DCP checkpoint of one [n, 16] float32 tensor in n
// one-row chunks, as gen_chunks.py does; the shard is sparse (opening and
// planning never read the records).
func manyChunks(b *testing.B, n int64) string {
	const cols, rec = 16, 1024 // a torch.save record of one row is about 1 KiB
	dir := b.TempDir()
	t := &torchdcp.TensorMetadata{
		Properties: torchdcp.TensorProperties{DType: "float32", Layout: "torch.strided"},
		Size:       []int64{n, cols},
	}
	m := &torchdcp.Metadata{Items: []torchdcp.Item{{FQN: "t", Tensor: t}},
		Planner: []torchdcp.PlannerEntry{{Key: "t", Path: []any{"t"}}}}
	for i := range n {
		off := []int64{i, 0}
		t.Chunks = append(t.Chunks, torchdcp.ChunkMetadata{Offsets: off, Sizes: []int64{1, cols}})
		m.Storage = append(m.Storage, torchdcp.StorageEntry{Index: torchdcp.Index{FQN: "t", Offset: off},
			Info: torchdcp.StorageInfo{RelativePath: "__0_0.distcp", Offset: i * rec, Length: rec}})
	}
	md, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	if err != nil {
		b.Fatal(err)
	}
	shard, err := os.Create(filepath.Join(dir, "__0_0.distcp"))
	if err != nil {
		b.Fatal(err)
	}
	for _, err := range []error{torchdcp.EncodeMetadata(md, m), md.Close(), shard.Truncate(n * rec), shard.Close()} {
		if err != nil {
			b.Fatal(err)
		}
	}
	return dir
}
