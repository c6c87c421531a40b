package dcpwrite

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// patternFile is a safetensors data buffer that exists only as a formula:
// byte i of the file is byte(i*7 + i>>11).
type patternFile struct{ size int64 }

func patternByte(i int64) byte { return byte(i*7 + i>>11) }

func (p patternFile) ReadAt(b []byte, off int64) (int, error) {
	for i := range b {
		b[i] = patternByte(off + int64(i))
	}
	return len(b), nil
}

// TestCommitMemoryBounded commits a 64 MiB tensor, column-sharded so that
// every rank's chunk is thousands of strided runs, and checks that the
// commit allocates a small fraction of the tensor: buffers, not tensors.
func TestCommitMemoryBounded(t *testing.T) {
	const rows, cols = 4096, 4096
	infos := safetensors.Layout([]safetensors.TensorInfo{{Name: "big", DType: safetensors.F32, Shape: []int64{rows, cols}}})
	const dataStart = 64
	h := &safetensors.Header{Tensors: infos, DataStart: dataStart}
	src := patternFile{size: dataStart + infos[0].End}

	dir := filepath.Join(t.TempDir(), "big")
	d, err := openDir(dir, Target{WorldSize: 2, Rules: mustRules(t, "big 1")}, nil)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, d.Commit(src, h))
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("commit of a %d MiB tensor allocated %.1f MiB", infos[0].Size()>>20, float64(alloc)/(1<<20))
	assert.Less(t, alloc, uint64(12<<20), "Commit must stream, not hold the tensor")

	c, err := treetest.OpenLocal(dir, torchdcp.Reader.Open)
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Tensors, 1)
	for _, ch := range c.Tensors[0].Chunks.All() {
		require.Equal(t, []int64{rows, cols / 2}, ch.Sizes)
		// Spot-check rows: element (r, ch.Offsets[1]+k) of the source.
		for _, r := range []int64{0, 1, 2047, rows - 1} {
			got := make([]byte, cols/2*4)
			_, err := ch.Source.ReadAt(got, r*cols/2*4)
			require.NoError(t, err)
			base := dataStart + (r*cols+ch.Offsets[1])*4
			for i := range got {
				if got[i] != patternByte(base+int64(i)) {
					t.Fatalf("chunk %v row %d byte %d: got %d want %d", ch.Offsets, r, i, got[i], patternByte(base+int64(i)))
				}
			}
		}
	}
}
