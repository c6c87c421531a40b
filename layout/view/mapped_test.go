package view

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/convert"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/safetensors"
)

// expectedBytes assembles a mapped tensor the slow, obvious way from the
// sources' full bytes: extract each box, permute its rows, concatenate,
// convert.
func expectedBytes(t *testing.T, m *mapping.Tensor, full map[string][]byte) []byte {
	var out []byte
	for _, p := range m.Pieces {
		es := int64(p.Source.DType.Size())
		b := extract(full[p.Source.Name], p.Source.Shape, es, p.Offsets, p.Sizes)
		if len(p.Rows) > 0 {
			rowLen := len(b) / len(p.Rows)
			var perm []byte
			for _, r := range p.Rows {
				perm = append(perm, b[int(r)*rowLen:int(r+1)*rowLen]...)
			}
			b = perm
		}
		out = append(out, b...)
	}
	if to := m.ViewType(); to != m.SourceType() {
		conv := make([]byte, len(out)/m.SourceType().Size()*to.Size())
		require.NoError(t, convert.Convert(conv, to, out, m.SourceType()))
		out = conv
	}
	return out
}

// TestMappedMatchesNaive reads mapped tensors (layer slices of a stacked
// tensor, fused-row splits interleaved by group, permuted rows, type
// conversion) of randomly chunked sources at random windows and compares
// with the naive assembly.
func TestMappedMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	// a stacked [layers=3, rows=12, cols=5] tensor, split on rows and cols
	stack, stackFull := gridTensor(rng, []int64{3, 12, 5}, safetensors.F32, [][]int64{{1}, {4, 7}, {2}})
	stack.Name = "stack"
	// a [vocab_padded=10, 4] bf16 table, split on rows
	emb, embFull := gridTensor(rng, []int64{10, 4}, safetensors.BF16, [][]int64{{5}, nil})
	emb.Name = "emb"
	full := map[string][]byte{"stack": stackFull, "emb": embFull}

	// rows of group g, part k of a [q(2 rows), k(1), v(1)] x 3 groups layout of layer 1
	part := func(g, k int64) mapping.Piece {
		starts := []int64{0, 2, 3}
		lens := []int64{2, 1, 1}
		return mapping.Piece{Source: stack, Offsets: []int64{1, g*4 + starts[k], 0}, Sizes: []int64{1, lens[k], 5}}
	}
	rope := []int64{0, 2, 4, 1, 3, 5} // interleaved pairs → halves, one head of 6 rows
	cases := []*mapping.Tensor{
		{Name: "layer1", Shape: []int64{12, 5}, Pieces: []mapping.Piece{{Source: stack, Offsets: []int64{1, 0, 0}, Sizes: []int64{1, 12, 5}}}},
		{Name: "q", Shape: []int64{6, 5}, Pieces: []mapping.Piece{part(0, 0), part(1, 0), part(2, 0)}},
		{Name: "k", Shape: []int64{3, 5}, Pieces: []mapping.Piece{part(0, 1), part(1, 1), part(2, 1)}},
		{Name: "cols", Shape: []int64{3, 12, 2}, Pieces: []mapping.Piece{{Source: stack, Offsets: []int64{0, 0, 3}, Sizes: []int64{3, 12, 2}}}},
		{Name: "rope", Shape: []int64{6, 5}, Pieces: []mapping.Piece{{Source: stack, Offsets: []int64{2, 3, 0}, Sizes: []int64{1, 6, 5}, Rows: rope}}},
		{Name: "unpadded vocab to f32", Shape: []int64{7, 4}, DType: safetensors.F32, Pieces: []mapping.Piece{{Source: emb, Offsets: []int64{0, 0}, Sizes: []int64{7, 4}}}},
		{Name: "f32 to bf16 permuted", Shape: []int64{6, 5}, DType: safetensors.BF16, Pieces: []mapping.Piece{{Source: stack, Offsets: []int64{0, 6, 0}, Sizes: []int64{1, 6, 5}, Rows: rope}}},
		{Name: "f32 to f16, two pieces", Shape: []int64{2, 12, 5}, DType: safetensors.F16, Pieces: []mapping.Piece{
			{Source: stack, Offsets: []int64{2, 0, 0}, Sizes: []int64{1, 12, 5}}, {Source: stack, Offsets: []int64{0, 0, 0}, Sizes: []int64{1, 12, 5}}}},
	}
	gs := geometries{}
	for _, mt := range cases {
		t.Run(mt.Name, func(t *testing.T) {
			m, err := newMapped(mt, gs)
			require.NoError(t, err)
			want := expectedBytes(t, mt, full)
			require.EqualValues(t, len(want), m.size())
			requireWindows(t, rng, m, want, 300)
		})
	}
}

func TestMappedRejects(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	src, _ := gridTensor(rng, []int64{4, 4}, safetensors.I32, [][]int64{nil, nil})
	for _, mt := range []*mapping.Tensor{
		{Name: "too few elements", Shape: []int64{4, 4}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{2, 4}}}},
		{Name: "outside", Shape: []int64{2, 4}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{3, 0}, Sizes: []int64{2, 4}}}},
		{Name: "not a permutation", Shape: []int64{2, 4}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{2, 4}, Rows: []int64{0, 0}}}},
		{Name: "int to bf16", Shape: []int64{4, 4}, DType: safetensors.BF16, Pieces: []mapping.Piece{mapping.Whole(src)}},
	} {
		_, err := newMapped(mt, geometries{})
		require.Error(t, err, mt.Name)
	}
}

// --dtype bf16 converts the floating tensors of a view on read and leaves
// the others alone; the export equals torch's .to(torch.bfloat16) (the
// conversion itself is checked against torch in package convert).
func TestPlanDType(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	w, wFull := gridTensor(rng, []int64{4, 6}, safetensors.F32, [][]int64{{2}, {3}})
	w.Name = "w"
	ids, idsFull := gridTensor(rng, []int64{5}, safetensors.I64, [][]int64{{2}})
	ids.Name = "ids"
	c := treetest.NewCheckpoint(t, t.TempDir(), w, ids)
	v, err := Plan(c, Options{DType: safetensors.BF16})
	require.NoError(t, err)
	f := v.Lookup("model.safetensors")
	got, h := sttest.Tensors(t, f, f.Size)
	for _, info := range h.Tensors {
		if info.Name == "w" {
			require.Equal(t, safetensors.BF16, info.DType)
		}
	}
	want := make([]byte, len(wFull)/2)
	require.NoError(t, convert.Convert(want, safetensors.BF16, wFull, safetensors.F32))
	require.Equal(t, want, got["w"])
	require.Equal(t, idsFull, got["ids"])
	require.Equal(t, "F32 to BF16", v.Tensors[0].Origin().Transform)

	_, err = ParseDType("int8")
	require.Error(t, err)
}

// A RoPE-permuted tensor costs one source read per window, as the same
// tensor unpermuted does, not one per row.
func TestPermutedReadsCoalesced(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	src, full := gridTensor(rng, []int64{256, 64}, safetensors.BF16, [][]int64{nil, nil}) // one chunk, 128-byte rows
	perm := make([]int64, 256)
	for h := int64(0); h < 4; h++ { // 4 heads of 64 rows: pairs to halves
		for i := int64(0); i < 32; i++ {
			perm[h*64+i], perm[h*64+32+i] = h*64+2*i, h*64+2*i+1
		}
	}
	mt := &mapping.Tensor{Name: "rope", Shape: []int64{256, 64}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{256, 64}, Rows: perm}}}
	m, err := newMapped(mt, geometries{})
	require.NoError(t, err)
	want := expectedBytes(t, mt, map[string][]byte{"t": full})
	chunk := src.Chunks.At(0).Source.(*treetest.MemSource)
	for _, w := range []struct{ pos, n int64 }{{0, 32 << 10}, {8 << 10, 8 << 10}, {100, 5000}, {32<<10 - 1, 1}} {
		chunk.Reads = 0
		got := make([]byte, w.n)
		require.NoError(t, readContent(m, got, w.pos))
		require.True(t, bytes.Equal(want[w.pos:w.pos+w.n], got), "window %v", w)
		require.Equal(t, 1, chunk.Reads, "window %v", w)
	}
}

// Rows too far apart for one read are read one by one, and right.
func TestPermutedReadsApart(t *testing.T) {
	defer func(g int64) { mergeGap = g }(mergeGap)
	mergeGap = 0
	rng := rand.New(rand.NewSource(6))
	src, full := gridTensor(rng, []int64{64, 8}, safetensors.F32, [][]int64{{20}, {3}})
	perm := rng.Perm(64)
	rows := make([]int64, 64)
	for i, r := range perm {
		rows[i] = int64(r)
	}
	mt := &mapping.Tensor{Name: "shuffled", Shape: []int64{64, 8}, Pieces: []mapping.Piece{{Source: src, Offsets: []int64{0, 0}, Sizes: []int64{64, 8}, Rows: rows}}}
	m, err := newMapped(mt, geometries{})
	require.NoError(t, err)
	requireWindows(t, rng, m, expectedBytes(t, mt, map[string][]byte{"t": full}), 200)
}

// TestMappedBacking: a view tensor cut from a stacked tensor comes from the
// files of the chunks its box overlaps, not from every file of the stack
// (a view file's Sources bound its mode and are stat'ed at each open).
func TestMappedBacking(t *testing.T) {
	// [layers=4, rows=6, cols=2], one chunk per (layer pair, row half),
	// each in a file of its own, and an empty chunk in a file of its own.
	stack := &ckpt.Tensor{Name: "stack", DType: safetensors.F32, Shape: []int64{4, 6, 2}}
	files := map[string]*ckpt.File{}
	var chunks []ckpt.Chunk
	for l := int64(0); l < 4; l += 2 {
		for r := int64(0); r < 6; r += 3 {
			name := fmt.Sprintf("l%d_r%d", l, r)
			files[name] = &ckpt.File{Rel: name}
			chunks = append(chunks, ckpt.Chunk{Offsets: []int64{l, r, 0}, Sizes: []int64{2, 3, 2},
				Source: &ckpt.Section{File: files[name], Length: 2 * 3 * 2 * 4}})
		}
	}
	files["empty"] = &ckpt.File{Rel: "empty"}
	chunks = append(chunks, ckpt.Chunk{Offsets: []int64{1, 2, 0}, Sizes: []int64{0, 3, 2}, Source: &ckpt.Section{File: files["empty"]}})
	stack.Chunks = ckpt.MakeChunks(chunks...)

	piece := func(l, r, rows int64) mapping.Piece {
		return mapping.Piece{Source: stack, Offsets: []int64{l, r, 0}, Sizes: []int64{1, rows, 2}}
	}
	cases := []struct {
		name   string
		pieces []mapping.Piece
		want   []string
	}{
		{"one layer, first rows", []mapping.Piece{piece(1, 0, 3)}, []string{"l0_r0"}},
		{"one layer, rows across the cut", []mapping.Piece{piece(2, 2, 2)}, []string{"l2_r0", "l2_r3"}},
		{"two layers", []mapping.Piece{piece(3, 3, 3), piece(0, 4, 1)}, []string{"l2_r3", "l0_r3"}},
		{"boxes of several lengths", []mapping.Piece{
			{Source: stack, Offsets: []int64{3, 5, 0}, Sizes: []int64{1, 1, 2}}, {Source: stack, Offsets: []int64{0, 0, 0}, Sizes: []int64{3, 1, 2}}},
			[]string{"l0_r0", "l2_r0", "l2_r3"}},
		{"the whole stack", []mapping.Piece{mapping.Whole(stack)}, []string{"l0_r0", "l0_r3", "l2_r0", "l2_r3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var n int64
			for _, p := range c.pieces {
				n += p.Elements()
			}
			mt := &mapping.Tensor{Name: c.name, Shape: []int64{n}, Pieces: c.pieces}
			m, err := newMapped(mt, geometries{})
			require.NoError(t, err)
			s := newSourceSet()
			m.backing(s)
			var got []string
			for _, f := range s.files() {
				got = append(got, f.Rel)
			}
			require.ElementsMatch(t, c.want, got)
		})
	}
	// A view of a file per case: FindSources on several cores finds each
	// file's the same.
	v := &View{}
	for i, c := range cases {
		var n int64
		for _, p := range c.pieces {
			n += p.Elements()
		}
		m, err := newMapped(&mapping.Tensor{Name: c.name, Shape: []int64{n}, Pieces: c.pieces}, geometries{})
		require.NoError(t, err)
		f, err := newTensorFile(fmt.Sprintf("f%d.safetensors", i), []viewTensor{{c.name, m}}, time.Time{})
		require.NoError(t, err)
		v.Files = append(v.Files, f)
	}
	v.FindSources()
	for i, c := range cases {
		var got []string
		for _, f := range v.Files[i].Sources() {
			got = append(got, f.Rel)
		}
		require.ElementsMatch(t, c.want, got, c.name)
	}
}
