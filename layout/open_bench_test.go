package layout

import (
	"os"
	"testing"
)

// BenchmarkOpenManyChunks opens the checkpoint in $CKPTFS_BENCH_CHUNKS (made
// by e2e/bench/gen_chunks.py) and plans its view.
func BenchmarkOpenManyChunks(b *testing.B) {
	dir := os.Getenv("CKPTFS_BENCH_CHUNKS")
	if dir == "" {
		b.Skip("CKPTFS_BENCH_CHUNKS is not set")
	}
	for b.Loop() {
		c, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Plan(c, PlanOptions{}); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
