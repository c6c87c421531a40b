package view

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// A RoPE-permuted tensor in a file costs one read and one freshness check
// per window, as the tensor stored does: its rows are extents the plan
// merges, not a read each.
func TestPermutedRowsAreOneReadOfTheFile(t *testing.T) {
	const rows, cols, heads = 512, 64, 4 // 128-byte rows of bf16
	dir := t.TempDir()
	data := make([]byte, rows*cols*2)
	rand.New(rand.NewSource(3)).Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shard"), data, 0o644))
	tree := treetest.OpenCounting(t, dir)
	files := ckpt.NewFileSet(tree)
	defer files.Close()
	f, err := files.Get("shard")
	require.NoError(t, err)
	src := &ckpt.Tensor{Name: "wq", DType: safetensors.BF16, Shape: []int64{rows, cols},
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: []int64{0, 0}, Sizes: []int64{rows, cols}, Source: &ckpt.Section{File: f, Length: int64(len(data))}})}
	perm := make([]int64, rows)
	d := int64(rows / heads)
	for h := range int64(heads) {
		for i := range d / 2 {
			perm[h*d+i], perm[h*d+d/2+i] = h*d+2*i, h*d+2*i+1
		}
	}
	mt := &mapping.Tensor{Name: "wq", Shape: []int64{rows, cols}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{rows, cols}, Rows: perm}}}
	m, err := newMapped(mt, geometries{})
	require.NoError(t, err)
	rowLen := int64(cols * 2)
	for _, w := range []struct{ pos, n int64 }{
		{0, int64(len(data))},     // every head
		{d * rowLen, d * rowLen},  // one head
		{0, d / 2 * rowLen},       // the even rows of a head: every other row
		{100, 3 * rowLen},         // rows 0, 2, 4, 6 from the middle of one
		{int64(len(data)) - 1, 1}, // one byte
	} {
		tree.Reset()
		got := make([]byte, w.n)
		require.NoError(t, readContent(m, got, w.pos))
		want := make([]byte, 0, w.n)
		for r := w.pos / rowLen; r*rowLen < w.pos+w.n; r++ {
			want = append(want, data[perm[r]*rowLen:(perm[r]+1)*rowLen]...)
		}
		skip := w.pos % rowLen
		require.True(t, bytes.Equal(want[skip:skip+w.n], got), "window %v", w)
		require.Equal(t, 1, tree.Count()["shard"].Reads, "window %v: reads", w)
		require.Equal(t, 1, tree.Count()["shard"].Checks, "window %v: freshness checks", w)
	}
}

// A read that covers a chunk whole checks the record's CRC32 through the
// plan as through the record's own ReadAt: a byte flipped in a shard fails
// the whole-file read of the view, and partial reads serve what is there.
func TestPlanChecksCRCOfWholeChunks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	flipChunkByte(t, dir)
	c, err := layout.Open(dir)
	require.NoError(t, err)
	defer c.Close()
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	f := v.Lookup("model.safetensors")
	_, err = f.ReadAt(make([]byte, f.Size), 0)
	require.ErrorIs(t, err, torchdcp.ErrChecksum)
	require.ErrorContains(t, err, "CRC32 mismatch")
	require.ErrorContains(t, err, "model.safetensors")
	p := f.Placements()[0]
	_, err = f.ReadAt(make([]byte, 4), p.Offset)
	require.NoError(t, err, "a partial read cannot check the record")
}

// requireWindows reads c whole, then in n random windows, and requires the
// bytes of want.
func requireWindows(t *testing.T, rng *rand.Rand, c content, want []byte, n int) {
	t.Helper()
	got := make([]byte, len(want))
	require.NoError(t, readContent(c, got, 0))
	require.True(t, bytes.Equal(want, got))
	for i := 0; i < n && len(want) > 0; i++ {
		a := rng.Int63n(int64(len(want)))
		b := a + rng.Int63n(int64(len(want))-a+1)
		w := make([]byte, b-a)
		require.NoError(t, readContent(c, w, a))
		require.True(t, bytes.Equal(want[a:b], w), "window [%d,%d)", a, b)
	}
}

// BenchmarkViewTensorRead reads the last tensor of the fsdp2_4ranks view
// (four chunks in four shard files) again and again: the cost of a read's
// plan, its reads and freshness checks, with -benchmem its allocations.
func BenchmarkViewTensorRead(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "ck")
	treetest.CopyFixture(b, "fsdp2_4ranks", dir)
	c, err := layout.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	v, err := Plan(c, Options{})
	if err != nil {
		b.Fatal(err)
	}
	f := v.Lookup("model.safetensors")
	p := f.Placements()[len(f.Placements())-1]
	buf := make([]byte, p.Size)
	for b.Loop() {
		if _, err := f.ReadAt(buf, p.Offset); err != nil {
			b.Fatal(err)
		}
	}
}

// readContent reads c's bytes from pos into dst with a plan of its own.
func readContent(c content, dst []byte, pos int64) error {
	p := newPlan()
	defer p.release()
	if err := c.plan(p, dst, pos); err != nil {
		return err
	}
	return p.run()
}

// A small DCP record is read once: locating its chunk reads the record
// whole (torchzip's windows), and the plan takes the chunk's bytes from
// there (ckpt.Filler) instead of reading them again. The first whole read
// of the view costs each shard one read per record located in it, and no
// more; the second, every chunk located, reads each shard's data again
// with the plan's merged reads and no window. Both reads are the same
// bytes, whole chunks checked against their CRC32.
func TestSmallRecordsAreReadOnce(t *testing.T) {
	_, tree, c, f := fsdp2View(t)
	records := map[string]int{} // non-empty chunks by shard file
	for _, tn := range c.Tensors {
		for i := range tn.Chunks.Len() {
			ch := tn.Chunks.At(i)
			if n, _ := ckpt.NumElements(ch.Sizes); n > 0 {
				records[filepath.Base(ch.Source.(ckpt.Backed).Backing().Path)]++
			}
		}
	}
	require.Len(t, records, 4)

	tree.Reset()
	first := make([]byte, f.Size)
	_, err := f.ReadAt(first, 0)
	require.NoError(t, err)
	counts := tree.Count()
	for path, n := range records {
		assert.Equal(t, n, counts[path].Reads, "%s: one read per record, none for its data", path)
		assert.Equal(t, 1, counts[path].Checks, "%s: one freshness check, not one per record", path)
	}

	tree.Reset()
	second := make([]byte, f.Size)
	_, err = f.ReadAt(second, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(first, second))
	counts = tree.Count()
	for path := range records {
		assert.Equal(t, 1, counts[path].Reads, "%s: the located chunks' data in one merged read", path)
	}
}

// A shard rewritten in place once open (the same bytes, its mtime put back)
// fails a read of the view whose records in it are located by that read and
// all filled from the locating's reads (no read of the data after): the
// plan checks the file it located in once, after, and serves nothing.
func TestPlanChecksFilesItOnlyLocatedIn(t *testing.T) {
	dir, tree, c, f := fsdp2View(t)

	shard := filepath.Join(dir, "__1_0.distcp")
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			if b := ch.Source.(ckpt.Backed).Backing(); b.Path == shard {
				require.NoError(t, b.Check()) // open now, nothing located
			}
		}
	}
	info, err := os.Stat(shard)
	require.NoError(t, err)
	b, err := os.ReadFile(shard)
	require.NoError(t, err)
	w, err := os.OpenFile(shard, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt(b, 0)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, os.Chtimes(shard, info.ModTime(), info.ModTime()))

	tree.Reset()
	_, err = f.ReadAt(make([]byte, f.Size), 0)
	require.ErrorIs(t, err, ckpt.ErrSourceChanged)
	require.ErrorContains(t, err, "__1_0.distcp")
	counts := tree.Count()["__1_0.distcp"]
	assert.Positive(t, counts.Reads, "records located")
	assert.Equal(t, 1, counts.Checks, "the one check after them")
}

// fsdp2View opens a copy of the fsdp2_4ranks fixture (in dir) through a
// counting tree, and returns its checkpoint and its view's model.safetensors.
func fsdp2View(t *testing.T) (dir string, tree *treetest.CountingTree, c *layout.Checkpoint, f *File) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "ck")
	treetest.CopyFixture(t, "fsdp2_4ranks", dir)
	tree = treetest.OpenCounting(t, dir)
	c, err := layout.OpenTree(tree)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	f = v.Lookup("model.safetensors")
	require.NotNil(t, f)
	return dir, tree, c, f
}
