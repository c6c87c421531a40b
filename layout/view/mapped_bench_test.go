package view

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// BenchmarkPermutedRead reads a 4096×4096 bf16 tensor (32 heads of 128
// rows) in 1 MiB windows from a shard file in $CKPTFS_BENCH_DIR (tmpfs:
// /dev/shm, so that the byte path, not a disk, is measured), as stored,
// and RoPE-permuted.
func BenchmarkPermutedRead(b *testing.B) {
	const rows, cols, heads = 4096, 4096, 32
	dir := b.TempDir()
	if base := os.Getenv("CKPTFS_BENCH_DIR"); base != "" {
		d, err := os.MkdirTemp(base, "ckptfs-bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	data := make([]byte, rows*cols*2)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(dir, "shard"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	tree, err := source.OpenLocal(dir)
	if err != nil {
		b.Fatal(err)
	}
	files := ckpt.NewFileSet(tree)
	defer files.Close()
	f, err := files.Get("shard")
	if err != nil {
		b.Fatal(err)
	}
	src := &ckpt.Tensor{Name: "wq", DType: safetensors.BF16, Shape: []int64{rows, cols},
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: []int64{0, 0}, Sizes: []int64{rows, cols}, Source: &ckpt.Section{File: f, Offset: 0, Length: int64(len(data))}})}
	perm := make([]int64, rows)
	d := int64(rows / heads)
	for h := int64(0); h < heads; h++ {
		for i := int64(0); i < d/2; i++ {
			perm[h*d+i], perm[h*d+d/2+i] = h*d+2*i, h*d+2*i+1
		}
	}
	whole := mapping.Piece{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{rows, cols}}
	permuted := whole
	permuted.Rows = perm
	for _, tc := range []struct {
		name  string
		piece mapping.Piece
	}{
		{"stored", whole},
		{"permuted", permuted},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m, err := newMapped(&mapping.Tensor{Name: "wq", Shape: []int64{rows, cols}, Pieces: []mapping.Piece{tc.piece}}, geometries{})
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				for pos := int64(0); pos < m.size(); pos += int64(len(buf)) {
					if err := readContent(m, buf, pos); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
