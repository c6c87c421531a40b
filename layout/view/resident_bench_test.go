package view

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// BenchmarkViewResident opens and plans the view of the checkpoint in
// $CKPTFS_BENCH_SCALE (e2e/bench/gen_scale.py), else of one [100k, 16]
// tensor in 100k one-row chunks, and reports what one open view holds:
// counted (ResidentBytes, what a mount's metadata budget sees) and
// measured (the heap after a collection), per view and per chunk shown.
// With CKPTFS_BENCH_READ=1 (a checkpoint with its bytes) it reads every
// byte of the view, in 128 KiB reads, and reports the heap the view holds
// then, and its count again.
func BenchmarkViewResident(b *testing.B) {
	dir := os.Getenv("CKPTFS_BENCH_SCALE")
	if dir == "" {
		dir = b.TempDir()
		writeRows(b, dir, 100_000)
	}
	tree, err := source.OpenLocal(dir)
	if err != nil {
		b.Fatal(err)
	}
	read := os.Getenv("CKPTFS_BENCH_READ") == "1"
	var counted, held, heldRead, countedRead, chunks int64
	for b.Loop() {
		before := testenv.LiveHeap()
		c, err := layout.OpenAsWith(nil, tree, OpenOptions(Options{}))
		if err != nil {
			b.Fatal(err)
		}
		v, err := Plan(c, Options{})
		if err != nil {
			b.Fatal(err)
		}
		held = testenv.LiveHeap() - before
		counted = v.ResidentBytes()
		if read {
			buf := make([]byte, 128<<10)
			for _, f := range v.Files {
				for off := int64(0); off < f.Size; off += int64(len(buf)) {
					if _, err := f.ReadAt(buf[:min(int64(len(buf)), f.Size-off)], off); err != nil {
						b.Fatal(err)
					}
				}
			}
			heldRead, countedRead = testenv.LiveHeap()-before, v.ResidentBytes()
		}
		chunks = 0
		for _, t := range c.Tensors {
			chunks += int64(t.Chunks.Len())
		}
		v.Close()
	}
	b.ReportMetric(float64(counted), "counted-B/view")
	b.ReportMetric(float64(held), "heap-B/view")
	b.ReportMetric(float64(counted)/float64(chunks), "counted-B/chunk")
	if read {
		b.ReportMetric(float64(heldRead), "heap-read-B/view")
		b.ReportMetric(float64(countedRead), "counted-read-B/view")
	}
}

// writeRows writes a DCP checkpoint of one [n, 16] float32 tensor saved as
// n one-row chunks, its shard file sparse.
func writeRows(b *testing.B, dir string, n int64) {
	const cols, rec = 16, 1024
	t := &torchdcp.TensorMetadata{Properties: torchdcp.TensorProperties{DType: "float32", Layout: "torch.strided"},
		Size: []int64{n, cols}}
	m := &torchdcp.Metadata{Items: []torchdcp.Item{{FQN: "t", Tensor: t}},
		Planner: []torchdcp.PlannerEntry{{Key: "t", Path: []any{"t"}}}}
	for i := range n {
		off := []int64{i, 0}
		t.Chunks = append(t.Chunks, torchdcp.ChunkMetadata{Offsets: off, Sizes: []int64{1, cols}})
		m.Storage = append(m.Storage, torchdcp.StorageEntry{Index: torchdcp.Index{FQN: "t", Offset: off},
			Info: torchdcp.StorageInfo{RelativePath: torchdcp.ShardName(0, 0), Offset: i * rec, Length: rec}})
	}
	f, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	if err != nil {
		b.Fatal(err)
	}
	if err := torchdcp.EncodeMetadata(f, m); err != nil {
		b.Fatal(err)
	}
	f.Close()
	g, err := os.Create(filepath.Join(dir, torchdcp.ShardName(0, 0)))
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Truncate(n * rec); err != nil {
		b.Fatal(err)
	}
	g.Close()
}

// BenchmarkBoxesBuild is what building a tensor's chunk boxes again
// costs, once its view's cache dropped them (boxCache): per chunk, for
// the [100k, 16] tensor of one-row chunks.
func BenchmarkBoxesBuild(b *testing.B) {
	dir := b.TempDir()
	writeRows(b, dir, 100_000)
	c, err := layout.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	g, err := newGeometry(c.Tensors[0])
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := g.build(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(c.Tensors[0].Chunks.Len()), "ns/chunk")
}
