package deepspeed

import (
	"bytes"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
)

// openCounting opens the checkpoint in dir through a tree that counts what
// is read of each file.
func openCounting(t *testing.T, dir string) (*ckpt.Checkpoint, *treetest.CountingTree) {
	t.Helper()
	tree := treetest.OpenCounting(t, dir)
	c, err := OpenTree(tree)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, tree
}

// expected is zero_to_fp32's state dict of a fixture, by name.
func expected(t *testing.T, name string) map[string][]byte {
	t.Helper()
	data, err := os.ReadFile(treetest.Testdata(name, "expected.safetensors"))
	require.NoError(t, err)
	h, err := safetensors.ReadHeader(bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, ti := range h.Tensors {
		out[ti.Name] = data[h.DataStart+ti.Begin : h.DataStart+ti.End]
	}
	return out
}

func rankFiles(counts map[string]treetest.Counts) []string {
	var out []string
	for name := range counts {
		if strings.HasSuffix(name, "_optim_states.pt") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// A view of a ZeRO checkpoint reads through the read plan: a read of the
// whole view is one merged read and one freshness check per rank file
// (before: a pread and an fstat per piece of every parameter), its bytes
// those of DeepSpeed's own zero_to_fp32; rank 1's file is opened on the
// first read of bytes in it, not at open.
func TestViewReadsRanksThroughThePlan(t *testing.T) {
	for _, name := range []string{"deepspeed_zero2_llama", "deepspeed_zero3_llama"} {
		t.Run(name, func(t *testing.T) {
			want := expected(t, name)
			c, tree := openCounting(t, copyCase(t, name))
			opened := tree.Count()
			require.Contains(t, opened, optimFile("", 0))
			require.NotContains(t, opened, optimFile("", 1), "rank 1 is read on first use, not at open")

			v, err := view.Plan(c, view.Options{})
			require.NoError(t, err)
			defer v.Close()
			f := v.Lookup("model.safetensors")
			require.NotNil(t, f)
			// Every rank file is a source of the view file before any is
			// read: its owner and mode bound the view's, its freshness is
			// checked at each open.
			var sources []string
			for _, s := range f.Sources() {
				sources = append(sources, s.Rel)
			}
			require.ElementsMatch(t, []string{optimFile("", 0), optimFile("", 1)}, sources)
			require.NotContains(t, tree.Count(), optimFile("", 1))
			got := make([]byte, f.Size)
			for round := range 2 { // the first opens rank 1; the second reads alone
				tree.Reset()
				_, err = f.ReadAt(got, 0)
				require.NoError(t, err)
				counts := tree.Count()
				require.Equal(t, []string{optimFile("", 0), optimFile("", 1)}, rankFiles(counts), "round %d", round)
				if round == 1 {
					for _, rf := range rankFiles(counts) {
						require.Equal(t, treetest.Counts{Reads: 1, Checks: 1}, counts[rf], "round %d: %s", round, rf)
					}
				}
			}
			require.Len(t, f.Placements(), len(want))
			for _, p := range f.Placements() {
				w, ok := want[p.Name]
				require.True(t, ok, p.Name)
				require.True(t, bytes.Equal(w, got[p.Offset:p.Offset+p.Size]), "%s: bytes differ from zero_to_fp32's", p.Name)
			}
			// Random windows, each through its own plan.
			rng := rand.New(rand.NewSource(1))
			for range 50 {
				a := rng.Int63n(f.Size)
				b := a + rng.Int63n(f.Size-a+1)
				w := make([]byte, b-a)
				_, err := f.ReadAt(w, a)
				if err == io.EOF {
					err = nil
				}
				require.NoError(t, err)
				require.True(t, bytes.Equal(got[a:b], w), "window [%d, %d)", a, b)
			}
		})
	}
}

// Each chunk's source says where it lies (the plan merges it) and reads
// the same bytes by itself.
func TestChunksLocateAndRead(t *testing.T) {
	for _, name := range []string{"deepspeed_zero2_llama", "deepspeed_zero3_llama"} {
		want := expected(t, name)
		c, _ := openCounting(t, copyCase(t, name))
		for _, tn := range c.Tensors {
			got := make([]byte, tn.ByteSize())
			for _, ch := range tn.Chunks.All() {
				l, ok := ch.Source.(ckpt.Locator)
				require.True(t, ok, "%s: %T", tn.Name, ch.Source)
				_, ok, err := l.Locate()
				require.NoError(t, err)
				require.True(t, ok, tn.Name)
				b, err := treetest.ReadChunk(t, tn, ch)
				require.NoError(t, err)
				start, n := boxRun(tn.Shape, ch.Offsets, ch.Sizes)
				require.Equal(t, n*4, int64(len(b)))
				copy(got[start*4:], b)
			}
			require.True(t, bytes.Equal(want[tn.Name], got), tn.Name)
		}
	}
}

// boxRun is where a box that is one C-order run of its tensor starts, and
// its elements.
func boxRun(shape, off, size []int64) (start, n int64) {
	n = 1
	for i := range shape {
		start = start*shape[i] + off[i]
		n *= size[i]
	}
	return start, n
}

// flatBoxes tiles any range of any shape with boxes, each one run of the
// tensor's C order starting where it says, in order.
func TestFlatBoxes(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for range 2000 {
		shape := make([]int64, rng.Intn(4))
		numel := int64(1)
		for i := range shape {
			shape[i] = 1 + rng.Int63n(5)
			numel *= shape[i]
		}
		a := rng.Int63n(numel + 1)
		b := a + rng.Int63n(numel-a+1)
		next := a
		var boxes int
		flatBoxes(shape, a, b, func(off, size []int64, start, n int64) {
			boxes++
			require.Equal(t, next, start, "shape %v [%d,%d)", shape, a, b)
			require.Len(t, off, len(shape))
			// Every element of the box, in its C order, is the next of the run.
			idx := slices.Clone(off)
			for k := range n {
				var flat int64
				for i := range shape {
					flat = flat*shape[i] + idx[i]
				}
				require.Equal(t, start+k, flat, "shape %v [%d,%d) box %v %v", shape, a, b, off, size)
				for i := len(idx) - 1; i >= 0; i-- {
					idx[i]++
					if idx[i] < off[i]+size[i] {
						break
					}
					idx[i] = off[i]
				}
			}
			next = start + n
		})
		require.Equal(t, b, next, "shape %v [%d,%d)", shape, a, b)
		require.LessOrEqual(t, boxes, max(1, 2*len(shape)-1))
	}
}

// A rank file that disagrees with the placement rank 0 implies fails the
// reads of its bytes, naming it, and the reads of other ranks' bytes work.
func TestLazyRankThatDisagrees(t *testing.T) {
	dir := copyCase(t, "deepspeed_zero3_llama")
	// Rank 1 of the ZeRO-2 fixture: another stage, other partition sizes.
	replace(t, filepath.Join(dir, optimFile("", 1)),
		filepath.Join("..", "..", "testdata", "deepspeed_zero2_llama", "ckpt", "global_step1", optimFile("", 1)))
	c, _ := openCounting(t, dir)
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			_, err := treetest.ReadChunk(t, tn, ch)
			if ch.Source.(*rankSource).r.want == nil { // rank 0
				require.NoError(t, err)
				continue
			}
			require.ErrorContains(t, err, optimFile("", 1))
			require.ErrorContains(t, err, "zero_stage")
			require.NotContains(t, err.Error(), "\n")
		}
	}
}

// --verify checks each rank's partition against its CRC32 once, whatever
// the boxes in it: a byte flipped in rank 1's partition fails, naming the
// file; the intact fixture verifies every chunk.
func TestVerifyPartitions(t *testing.T) {
	dir := copyCase(t, "deepspeed_zero3_llama")
	c, tree := openCounting(t, dir)
	verified, unverifiable, err := ckpt.VerifyChunks(c)
	require.NoError(t, err)
	require.Zero(t, unverifiable)
	require.Equal(t, len(c.Tensors)*2, verified, "a box per rank and parameter here")
	tree.Reset()
	_, _, err = ckpt.VerifyChunks(c)
	require.NoError(t, err)
	require.Empty(t, tree.Count(), "each partition is verified once")

	var at int64 = -1
	for _, ch := range c.Tensors[0].Chunks.All() {
		if s := ch.Source.(*rankSource); s.r.want != nil {
			loc, _, err := s.Locate()
			require.NoError(t, err)
			at = loc.Offset
			break
		}
	}
	require.GreaterOrEqual(t, at, int64(0))
	path := filepath.Join(dir, optimFile("", 1))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[at] ^= 0x40
	dir2 := filepath.Join(t.TempDir(), "global_step1")
	require.NoError(t, os.CopyFS(dir2, os.DirFS(dir)))
	require.NoError(t, os.WriteFile(filepath.Join(dir2, optimFile("", 1)), b, 0o644))
	c2, _ := openCounting(t, dir2)
	_, _, err = ckpt.VerifyChunks(c2)
	require.ErrorContains(t, err, "CRC32 mismatch")
	require.ErrorContains(t, err, optimFile("", 1))
}

// A rank's chunks read and locate through one source per partition: after
// the rank is opened, neither allocates (a source per call was an
// allocation per chunk of each read's plan).
func TestRankSourcesShareTheirPartition(t *testing.T) {
	c, _ := openCounting(t, copyCase(t, "deepspeed_zero3_llama"))
	var checked int
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			s, ok := ch.Source.(*rankSource)
			require.True(t, ok, "%s: %T", tn.Name, ch.Source)
			o, err := s.r.partitions()
			require.NoError(t, err)
			if s.off == 0 && s.n == o.parts[s.g].Size {
				continue // the whole partition: a source of its own
			}
			buf := make([]byte, s.n)
			_, _, err = s.Locate()
			require.NoError(t, err)
			allocs := testing.AllocsPerRun(10, func() {
				if _, _, err := s.Locate(); err != nil {
					t.Fatal(err)
				}
				if _, err := s.ReadAt(buf, 0); err != nil {
					t.Fatal(err)
				}
			})
			require.Zero(t, allocs, "%s", s)
			checked++
		}
	}
	require.NotZero(t, checked)
}
