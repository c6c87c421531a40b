package view

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/torchdcp/dcptest"
)

// TestResidentCountsWhatReadsBuild: a view counts from its open what
// reading every one of its tensors builds and keeps (the chunk boxes, the
// located chunks, small decompressed records), since a mount's budget
// reads the count once, at the open: the count after every byte of the
// view was read is the count at open, and the heap the open view holds
// then, measured, is within it.
func TestResidentCountsWhatReadsBuild(t *testing.T) {
	for _, compress := range []bool{false, true} {
		name := map[bool]string{false: "stored", true: "zstd"}[compress]
		t.Run(name, func(t *testing.T) {
			n := int64(3000)
			if compress {
				n = 1000 // a zstd decoder per record: slow under -race
			}
			// The view's bytes, from the records stored.
			ref := t.TempDir()
			dcptest.WriteChunked(t, ref, n, false)
			rc, rv := openPlanned(t, ref)
			stored := readEvery(t, rv)
			require.NoError(t, rc.Close())

			// A first view, small, makes what a process makes once
			// (the CRC32 tables, the decoders' pools), outside the count.
			warm := t.TempDir()
			dcptest.WriteChunked(t, warm, 4, compress)
			wc, wv := openPlanned(t, warm)
			readEvery(t, wv)
			require.NoError(t, wc.Close())

			dir := t.TempDir()
			dcptest.WriteChunked(t, dir, n, compress)
			before := testenv.LiveHeap()
			c, v := openPlanned(t, dir)
			defer c.Close()
			atOpen := v.ResidentBytes()
			got := readEvery(t, v)
			require.Equal(t, stored, got)
			got = nil
			held := testenv.LiveHeap() - before
			t.Logf("%s: %d chunks; counted %d at open (%d a chunk), %d after reads; heap held %d (%d a chunk)",
				name, 2*n, atOpen, atOpen/(2*n), v.ResidentBytes(), held, held/(2*n))
			assert.Equal(t, atOpen, v.ResidentBytes(), "the count after reads is the count at open")
			// ckpt.Chunks and the DCP sources count their flat arrays
			// by length; the allocator gives a large one whole pages.
			slack := int64(len(c.Tensors)) * 2 * 8 << 10
			assert.LessOrEqual(t, held, atOpen+slack, "the open view holds no more heap than it counts, once read")
			// Read again: chunks whose records were dropped decompress
			// them again.
			require.Equal(t, stored, readEvery(t, v))
			runtime.KeepAlive(v)
			runtime.KeepAlive(c)
		})
	}
}

func openPlanned(t *testing.T, dir string) (*ckpt.Checkpoint, *View) {
	c, err := layout.Open(dir)
	require.NoError(t, err)
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	return c, v
}

// readEvery reads every byte of every file of v, in FUSE-sized reads.
func readEvery(t *testing.T, v *View) []byte {
	var out []byte
	buf := make([]byte, 128<<10)
	for _, f := range v.Files {
		for off := int64(0); off < f.Size; off += int64(len(buf)) {
			m, err := f.ReadAt(buf[:min(int64(len(buf)), f.Size-off)], off)
			require.NoError(t, err)
			out = append(out, buf[:m]...)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// TestBoxesKeptWithinTheirBound: a view keeps the chunk boxes of the
// tensors it read last only, within the bound it counts (here its largest
// tensor's: one of two alike), and reads that drop and build them again
// under each other, concurrently, read the same bytes.
func TestBoxesKeptWithinTheirBound(t *testing.T) {
	defer func(b int64) { boxBudget = b }(boxBudget)
	const n = 3000
	dir := t.TempDir()
	dcptest.WriteChunked(t, dir, n, false)
	c0, v0 := openPlanned(t, dir)
	want := readAll(t, v0)
	require.NoError(t, c0.Close())

	boxBudget = 1
	warm := t.TempDir()
	dcptest.WriteChunked(t, warm, 4, false)
	wc, wv := openPlanned(t, warm)
	readEvery(t, wv)
	require.NoError(t, wc.Close())

	before := testenv.LiveHeap()
	c, v := openPlanned(t, dir)
	defer c.Close()
	atOpen := v.ResidentBytes()
	require.Equal(t, want, readAll(t, v))
	held := testenv.LiveHeap() - before
	bc := v.boxes
	t.Logf("counted %d at open; heap held %d; boxes %d within %d", atOpen, held, bc.used, bc.bound)
	assert.Equal(t, 1, bc.lru.Len(), "one tensor's boxes kept")
	assert.LessOrEqual(t, bc.used, bc.bound)
	slack := int64(len(c.Tensors)) * 2 * 8 << 10
	assert.LessOrEqual(t, held, atOpen+slack, "the open view holds no more heap than it counts, once read")

	done := make(chan []byte)
	for range 4 {
		go func() { done <- readAll(t, v) }()
	}
	for range 4 {
		assert.Equal(t, want, <-done)
	}
	assert.Equal(t, atOpen, v.ResidentBytes())
}

// readAll is every view file's bytes, one after the other.
func readAll(t *testing.T, v *View) []byte {
	var out []byte
	for _, f := range v.Files {
		b := make([]byte, f.Size)
		_, err := f.ReadAt(b, 0)
		if err != nil {
			t.Error(err)
			return nil
		}
		out = append(out, b...)
	}
	return out
}
