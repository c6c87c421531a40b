package view

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/safetensors"
)

// gridTensor builds a tensor of the given shape whose global bytes are full,
// split into a grid by cuts (per dimension, the interior cut points), with the
// chunks listed in a shuffled order.
func gridTensor(rng *rand.Rand, shape []int64, dtype safetensors.DType, cuts [][]int64) (*ckpt.Tensor, []byte) {
	es := int64(dtype.Size())
	n, _ := ckpt.NumElements(shape)
	full := make([]byte, n*es)
	rng.Read(full)
	t := &ckpt.Tensor{Name: "t", DType: dtype, Shape: shape}
	bounds := make([][]int64, len(shape))
	for d := range shape {
		bounds[d] = append(append([]int64{0}, cuts[d]...), shape[d])
	}
	idx := make([]int, len(shape))
	var chunks []ckpt.Chunk
	for {
		off, size := make([]int64, len(shape)), make([]int64, len(shape))
		for d := range shape {
			off[d] = bounds[d][idx[d]]
			size[d] = bounds[d][idx[d]+1] - off[d]
		}
		chunks = append(chunks, ckpt.Chunk{Offsets: off, Sizes: size, Source: &treetest.MemSource{Data: extract(full, shape, es, off, size)}})
		d := len(shape) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < len(bounds[d])-1 {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			break
		}
	}
	rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	t.Chunks = ckpt.MakeChunks(chunks...)
	return t, full
}

// extract copies a box out of a C-order array, element by element (slow and obviously right).
func extract(full []byte, shape []int64, es int64, off, size []int64) []byte {
	n, _ := ckpt.NumElements(size)
	out := make([]byte, 0, n*es)
	idx := make([]int64, len(size))
	for i := int64(0); i < n; i++ {
		lin := int64(0)
		for d := range shape {
			lin = lin*shape[d] + off[d] + idx[d]
		}
		out = append(out, full[lin*es:(lin+1)*es]...)
		for d := len(size) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

func TestGatherMatchesGroundTruth(t *testing.T) {
	cases := []struct {
		name  string
		shape []int64
		dtype safetensors.DType
		cuts  [][]int64
	}{
		{"dim0 uneven", []int64{10, 3}, safetensors.F32, [][]int64{{3, 6, 9}, nil}},
		{"dim0 with empty tail", []int64{5, 3}, safetensors.BF16, [][]int64{{2, 4, 5}, nil}},
		{"dim1", []int64{2, 12}, safetensors.F32, [][]int64{nil, {3, 6, 9}}},
		{"dim1 uneven", []int64{7, 10}, safetensors.I64, [][]int64{nil, {3, 6, 9}}},
		{"2d mesh", []int64{4, 4}, safetensors.F16, [][]int64{{2}, {2}}},
		{"2d mesh uneven", []int64{5, 7}, safetensors.U8, [][]int64{{3}, {4}}},
		{"3d middle", []int64{3, 8, 5}, safetensors.F32, [][]int64{nil, {2, 5}, nil}},
		{"3d all", []int64{4, 6, 5}, safetensors.F64, [][]int64{{1}, {2, 3}, {4}}},
		{"1d", []int64{17}, safetensors.I8, [][]int64{{4, 8, 16}}},
		{"0-dim", []int64{}, safetensors.F32, [][]int64{}},
		{"zero-size", []int64{0, 4}, safetensors.F32, [][]int64{nil, nil}},
		{"replicated", []int64{6, 6}, safetensors.C64, [][]int64{nil, nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(1))
			tensor, full := gridTensor(rng, tc.shape, tc.dtype, tc.cuts)
			g, err := newGeometry(tensor)
			require.NoError(t, err)
			require.Equal(t, int64(len(full)), g.size())
			requireWindows(t, rng, g, full, 300)
		})
	}
}

func TestGatherOneReadPerChunk(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	tensor, full := gridTensor(rng, []int64{64, 48}, safetensors.F32, [][]int64{nil, {12, 24, 36}})
	g, err := newGeometry(tensor)
	require.NoError(t, err)
	got := make([]byte, len(full))
	require.NoError(t, readContent(g, got, 0))
	require.Equal(t, full, got)
	for _, c := range tensor.Chunks.All() {
		require.Equal(t, 1, c.Source.(*treetest.MemSource).Reads, "each column shard is read with one call, not one per row")
	}
}

func TestGatherRejectsBadTilings(t *testing.T) {
	src := &treetest.MemSource{Data: make([]byte, 1024)}
	chunk := func(off, size []int64) ckpt.Chunk { return ckpt.Chunk{Offsets: off, Sizes: size, Source: src} }
	cases := map[string][]ckpt.Chunk{
		"hole":         {chunk([]int64{0, 0}, []int64{2, 4}), chunk([]int64{3, 0}, []int64{1, 4})},
		"overlap":      {chunk([]int64{0, 0}, []int64{3, 4}), chunk([]int64{2, 0}, []int64{2, 4})},
		"out of bound": {chunk([]int64{0, 0}, []int64{4, 4}), chunk([]int64{4, 0}, []int64{1, 4})},
		"rank":         {chunk([]int64{0}, []int64{4})},
		"overlap+hole": {chunk([]int64{0, 0}, []int64{2, 4}), chunk([]int64{1, 0}, []int64{2, 4})},
	}
	for name, chunks := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := newGeometry(&ckpt.Tensor{Name: "w", DType: safetensors.F32, Shape: []int64{4, 4}, Chunks: ckpt.MakeChunks(chunks...)})
			require.ErrorIs(t, err, ckpt.ErrInvalid)
			require.Contains(t, err.Error(), `"w"`)
		})
	}
}

// A tensor its reader validated is not checked again by the view unless it
// changed since; changed, it is, and a view of it is refused.
func TestGatherChecksTensorsChangedAfterValidation(t *testing.T) {
	src := &treetest.MemSource{Data: make([]byte, 1024)}
	rows := func() *ckpt.Tensor {
		return &ckpt.Tensor{Name: "w", DType: safetensors.F32, Shape: []int64{4, 4}, Chunks: ckpt.MakeChunks(
			ckpt.Chunk{Offsets: []int64{0, 0}, Sizes: []int64{2, 4}, Source: src},
			ckpt.Chunk{Offsets: []int64{2, 0}, Sizes: []int64{2, 4}, Source: src})}
	}
	for name, change := range map[string]func(tn *ckpt.Tensor){
		"chunk added":     func(tn *ckpt.Tensor) { tn.Chunks.Add([]int64{1, 0}, []int64{1, 4}, src) },
		"shape grown":     func(tn *ckpt.Tensor) { tn.Shape[0] = 5 },
		"chunks replaced": func(tn *ckpt.Tensor) { tn.Chunks = ckpt.MakeChunks(tn.Chunks.At(0)) },
		"dtype unknown":   func(tn *ckpt.Tensor) { tn.DType = "X3" },
	} {
		t.Run(name, func(t *testing.T) {
			tn := rows()
			require.NoError(t, tn.Validate())
			_, err := newGeometry(tn)
			require.NoError(t, err)
			change(tn)
			_, err = newGeometry(tn)
			require.ErrorIs(t, err, ckpt.ErrInvalid)

			// The same through a plan of a checkpoint of it.
			tn = rows()
			require.NoError(t, tn.Validate())
			change(tn)
			_, err = Plan(treetest.NewCheckpoint(t, t.TempDir(), tn), Options{NoMapping: true})
			require.ErrorIs(t, err, ckpt.ErrInvalid)
			require.ErrorContains(t, err, `"w"`)
		})
	}
}

func BenchmarkGather(b *testing.B) {
	for _, cuts := range [][][]int64{{{256, 512, 768}, nil}, {nil, {256, 512, 768}}} {
		rng := rand.New(rand.NewSource(3))
		tensor, full := gridTensor(rng, []int64{1024, 1024}, safetensors.F32, cuts)
		g, _ := newGeometry(tensor)
		dst := make([]byte, 1<<20)
		b.Run(fmt.Sprintf("cuts=%v", cuts), func(b *testing.B) {
			b.SetBytes(int64(len(dst)))
			for i := 0; i < b.N; i++ {
				off := int64(i%4) << 20
				if err := readContent(g, dst, off); err != nil {
					b.Fatal(err)
				}
			}
			_ = full
		})
	}
}
