package ckpt

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/cost"
	"github.com/ckptfs/ckptfs/safetensors"
)

func box(off, size []int64) Chunk { return Chunk{Offsets: off, Sizes: size} }

func tensor(shape []int64, chunks ...Chunk) *Tensor {
	return &Tensor{Name: "w", DType: safetensors.F32, Shape: shape, Chunks: MakeChunks(chunks...)}
}

type i64 = []int64

func TestValidateCoverage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tensor *Tensor
		err    string // "" means valid
	}{
		{"one chunk", tensor(i64{4, 4}, box(i64{0, 0}, i64{4, 4})), ""},
		{"rows", tensor(i64{4, 4}, box(i64{0, 0}, i64{1, 4}), box(i64{1, 0}, i64{3, 4})), ""},
		{"columns, out of order", tensor(i64{4, 4}, box(i64{0, 3}, i64{4, 1}), box(i64{0, 0}, i64{4, 3})), ""},
		{"2x2 grid", tensor(i64{4, 6}, box(i64{0, 0}, i64{2, 3}), box(i64{0, 3}, i64{2, 3}), box(i64{2, 0}, i64{2, 3}), box(i64{2, 3}, i64{2, 3})), ""},
		{"pinwheel (no guillotine cut)", tensor(i64{3, 3},
			box(i64{0, 0}, i64{2, 1}), box(i64{0, 1}, i64{1, 2}), box(i64{1, 2}, i64{2, 1}), box(i64{2, 0}, i64{1, 2}), box(i64{1, 1}, i64{1, 1})), ""},
		{"empty chunks anywhere", tensor(i64{4}, box(i64{0}, i64{4}), box(i64{4}, i64{0}), box(i64{2}, i64{0})), ""},
		{"0-dim", tensor(i64{}, box(i64{}, i64{})), ""},
		{"0-dim twice", tensor(i64{}, box(i64{}, i64{}), box(i64{}, i64{})), "chunks 0 and 1 overlap (both hold element [])"},
		{"0-dim without chunks", tensor(i64{}), "chunks cover 0 of 1 elements (hole in chunk coverage): no chunk holds element []"},
		{"zero-size tensor, no chunks", tensor(i64{0, 5}), ""},
		{"zero-size tensor, empty chunks", tensor(i64{3, 0}, box(i64{0, 0}, i64{3, 0}), box(i64{1, 0}, i64{2, 0})), ""},
		{"unsplit dims of a 4-D tensor", tensor(i64{2, 3, 4, 5}, box(i64{0, 0, 0, 0}, i64{2, 3, 2, 5}), box(i64{0, 0, 2, 0}, i64{2, 3, 2, 5})), ""},
		{"touching in one dim, apart in another", tensor(i64{2, 2}, box(i64{0, 0}, i64{1, 1}), box(i64{1, 1}, i64{1, 1}), box(i64{0, 1}, i64{1, 1}), box(i64{1, 0}, i64{1, 1})), ""},

		{"hole between rows", tensor(i64{4, 4}, box(i64{0, 0}, i64{2, 4}), box(i64{3, 0}, i64{1, 4})),
			"chunks cover 12 of 16 elements (hole in chunk coverage): no chunk holds element [2 0]"},
		{"hole at the end", tensor(i64{5}, box(i64{0}, i64{4})), "chunks cover 4 of 5 elements (hole in chunk coverage): no chunk holds element [4]"},
		{"hole in the middle of a grid", tensor(i64{3, 3},
			box(i64{0, 0}, i64{2, 1}), box(i64{0, 1}, i64{1, 2}), box(i64{1, 2}, i64{2, 1}), box(i64{2, 0}, i64{1, 2})),
			"chunks cover 8 of 9 elements (hole in chunk coverage): no chunk holds element [1 1]"},
		{"overlap of rows", tensor(i64{4, 4}, box(i64{0, 0}, i64{3, 4}), box(i64{2, 0}, i64{2, 4})),
			"chunks 0 and 1 overlap (both hold element [2 0])"},
		{"duplicate chunk", tensor(i64{4}, box(i64{0}, i64{2}), box(i64{2}, i64{2}), box(i64{2}, i64{2})),
			"chunks 1 and 2 overlap (both hold element [2])"},
		{"one element shared by a corner, after a hole", tensor(i64{3, 3}, box(i64{0, 0}, i64{2, 2}), box(i64{1, 1}, i64{2, 2})),
			"chunks cover 8 of 9 elements (hole in chunk coverage): no chunk holds element [0 2]"},
		{"one element shared by a corner", tensor(i64{3, 3}, box(i64{0, 0}, i64{2, 2}), box(i64{1, 1}, i64{2, 2}), box(i64{0, 2}, i64{1, 1})),
			"chunks 0 and 1 overlap (both hold element [1 1])"},
		{"hole, then overlap, volumes add up", tensor(i64{3, 1}, box(i64{1, 0}, i64{2, 1}), box(i64{2, 0}, i64{1, 1})),
			"no chunk holds element [0 0] (hole in chunk coverage) and chunks overlap elsewhere: their sizes add up to 3 of 3 elements"},
		{"overlap first, then hole", tensor(i64{4, 4}, box(i64{0, 0}, i64{2, 4}), box(i64{1, 0}, i64{2, 4})),
			"chunks 0 and 1 overlap (both hold element [1 0])"},
		{"overlap in an unsplit dim's tensor", tensor(i64{2, 8}, box(i64{0, 0}, i64{2, 5}), box(i64{0, 4}, i64{2, 4})),
			"chunks 0 and 1 overlap (both hold element [0 4])"},
		{"out of bounds", tensor(i64{4}, box(i64{2}, i64{3})), "chunk 0 (offsets [2] sizes [3]) is outside shape [4]"},
		{"negative size", tensor(i64{4}, box(i64{2}, i64{-1})), "chunk 0 (offsets [2] sizes [-1]) is outside shape [4]"},
		{"rank mismatch", tensor(i64{4}, box(i64{0, 0}, i64{4, 1})), "chunk 0 has rank 2/2, tensor has rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.tensor.Validate()
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), `tensor "w": `)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
}

// countCover is the oracle: how many chunks hold each element, by brute force.
func countCover(shape []int64, chunks []Chunk, f func(elem []int64, n int) bool) {
	total, _ := NumElements(shape)
	elem := make([]int64, len(shape))
	for e := int64(0); e < total; e++ {
		r := e
		for d := len(shape) - 1; d >= 0; d-- {
			elem[d] = r % shape[d]
			r /= shape[d]
		}
		n := 0
		for _, c := range chunks {
			in := true
			for d := range shape {
				in = in && elem[d] >= c.Offsets[d] && elem[d] < c.Offsets[d]+c.Sizes[d]
			}
			if in {
				n++
			}
		}
		if !f(elem, n) {
			return
		}
	}
}

func pairwiseOverlap(chunks []Chunk) bool {
	for a := range chunks {
		for b := a + 1; b < len(chunks); b++ {
			va, _ := NumElements(chunks[a].Sizes)
			vb, _ := NumElements(chunks[b].Sizes)
			if va == 0 || vb == 0 {
				continue
			}
			over := true
			for d := range chunks[a].Offsets {
				ea, eb := chunks[a].Offsets[d]+chunks[a].Sizes[d], chunks[b].Offsets[d]+chunks[b].Sizes[d]
				over = over && chunks[a].Offsets[d] < eb && chunks[b].Offsets[d] < ea
			}
			if over {
				return true
			}
		}
	}
	return false
}

// tiling cuts shape into about n boxes by repeated guillotine cuts of a random
// box along a random dimension, so that it is irregular in every dimension.
func tiling(rng *rand.Rand, shape []int64, n int) []Chunk {
	chunks := []Chunk{box(make([]int64, len(shape)), slices.Clone(shape))}
	for tries := 0; len(chunks) < n && tries < 20*n && len(shape) > 0; tries++ {
		i := rng.Intn(len(chunks))
		d := rng.Intn(len(shape))
		c := chunks[i]
		if c.Sizes[d] < 2 {
			continue
		}
		cut := 1 + rng.Int63n(c.Sizes[d]-1)
		a, b := box(slices.Clone(c.Offsets), slices.Clone(c.Sizes)), box(slices.Clone(c.Offsets), slices.Clone(c.Sizes))
		a.Sizes[d] = cut
		b.Offsets[d] += cut
		b.Sizes[d] -= cut
		chunks[i] = a
		chunks = append(chunks, b)
	}
	rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	return chunks
}

// randomBoxes makes n boxes anywhere in shape, most often overlapping.
func randomBoxes(rng *rand.Rand, shape []int64, n int) []Chunk {
	chunks := make([]Chunk, n)
	for i := range chunks {
		c := box(make([]int64, len(shape)), make([]int64, len(shape)))
		for d, s := range shape {
			c.Offsets[d] = rng.Int63n(s + 1)
			c.Sizes[d] = rng.Int63n(s - c.Offsets[d] + 1)
		}
		chunks[i] = c
	}
	return chunks
}

// damage breaks a tiling in one of the ways a bad checkpoint does.
func damage(rng *rand.Rand, shape []int64, chunks []Chunk) []Chunk {
	if len(chunks) == 0 {
		return chunks
	}
	i := rng.Intn(len(chunks))
	switch rng.Intn(5) {
	case 0: // drop a chunk
		return slices.Delete(chunks, i, i+1)
	case 1: // repeat a chunk
		return append(chunks, chunks[i])
	case 2, 3: // move or grow a chunk by one within bounds
		if len(shape) == 0 {
			return chunks
		}
		d := rng.Intn(len(shape))
		c := box(slices.Clone(chunks[i].Offsets), slices.Clone(chunks[i].Sizes))
		if rng.Intn(2) == 0 && c.Offsets[d] > 0 {
			c.Offsets[d]--
		} else if c.Offsets[d]+c.Sizes[d] < shape[d] {
			c.Sizes[d]++
		} else if c.Sizes[d] > 0 {
			c.Sizes[d]--
		}
		chunks[i] = c
	case 4: // add an empty chunk, which is harmless
		c := box(slices.Clone(chunks[i].Offsets), slices.Clone(chunks[i].Sizes))
		if len(shape) > 0 {
			c.Sizes[rng.Intn(len(shape))] = 0
		}
		return append(chunks, c)
	}
	return chunks
}

// TestValidateAgainstBruteForce checks Validate on random tilings, intact and
// damaged, and on random boxes, against counting every element: valid exactly when every element
// is held once, and the element an error names is the first that is not; and
// against the general check alone (no one pass for rows).
func TestValidateAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 3000; iter++ {
		rank := rng.Intn(5)
		shape := make([]int64, rank)
		for d := range shape {
			shape[d] = 1 + rng.Int63n(6)
		}
		if rank > 0 && rng.Intn(20) == 0 {
			shape[rng.Intn(rank)] = 0
		}
		var chunks []Chunk
		if rng.Intn(4) == 0 {
			chunks = randomBoxes(rng, shape, rng.Intn(6))
		} else {
			chunks = tiling(rng, shape, 1+rng.Intn(12))
			for k := rng.Intn(3); k > 0; k-- {
				chunks = damage(rng, shape, chunks)
			}
		}
		tn := tensor(shape, chunks...)
		desc := fmt.Sprintf("shape %v chunks %v", shape, chunks)

		var first []int64
		firstN := 0
		countCover(shape, chunks, func(elem []int64, n int) bool {
			if n != 1 {
				first, firstN = slices.Clone(elem), n
				return false
			}
			return true
		})
		err := tn.Validate()
		require.Equal(t, errString(tn.validate(false)), errString(err), "one pass and general check differ: %s", desc)
		if first == nil {
			require.NoError(t, err, desc)
			require.False(t, pairwiseOverlap(chunks), desc)
			continue
		}
		require.Error(t, err, desc)
		msg := err.Error()
		if firstN > 1 {
			require.Contains(t, msg, fmt.Sprintf("overlap (both hold element %v)", first), desc)
		} else {
			require.Contains(t, msg, fmt.Sprintf("no chunk holds element %v", first), desc)
			if strings.Contains(msg, "overlap elsewhere") {
				require.True(t, pairwiseOverlap(chunks), desc)
			}
		}
	}
}

// irregular makes n chunks of a 1-, 2- or 3-D tensor with no two boundaries
// aligned: rows of random heights, each cut into columns of random widths
// (and, in 3-D, each cell cut again along the last dim).
func irregular(rng *rand.Rand, rank, n int) *Tensor {
	switch rank {
	case 1:
		return tensor(i64{int64(4 * n)}, tiling(rng, i64{int64(4 * n)}, n)...)
	case 2:
		return tensor(i64{int64(n), 1 << 20}, tiling(rng, i64{int64(n), 1 << 20}, n)...)
	default:
		return tensor(i64{int64(n), 1 << 10, 1 << 10}, tiling(rng, i64{int64(n), 1 << 10, 1 << 10}, n)...)
	}
}

func TestValidateManyIrregularChunksIsFast(t *testing.T) {
	const n = 100_000
	rng := rand.New(rand.NewSource(2))
	for rank := 1; rank <= 3; rank++ {
		tn := irregular(rng, rank, n)
		require.Equal(t, n, tn.Chunks.Len())
		var err error
		c := cost.Of(func() { err = tn.Validate() })
		require.NoError(t, err)
		t.Logf("rank %d: %d irregular chunks validated in %v CPU", rank, n, c.CPU)
		assert.Less(t, c.CPU, slowdown*time.Second/2)

		// The same chunks with one overlap and with one hole, found as fast.
		bad := tensor(tn.Shape, append(tn.Chunks.Values(), tn.Chunks.At(n/2))...)
		c = cost.Of(func() { err = bad.Validate() })
		assert.Less(t, c.CPU, slowdown*time.Second/2)
		assert.ErrorContains(t, err, fmt.Sprintf("and %d overlap", n))
		holed := tensor(tn.Shape, tn.Chunks.Values()[1:]...)
		assert.ErrorContains(t, holed.Validate(), "no chunk holds element")
	}
}

func TestValidateRegularGridIsFast(t *testing.T) {
	// 512 x 512 chunks of a 2-D tensor: the grid cancels level by level.
	var chunks []Chunk
	for i := int64(0); i < 512; i++ {
		for j := int64(0); j < 512; j++ {
			chunks = append(chunks, box(i64{i * 3, j * 5}, i64{3, 5}))
		}
	}
	tn := tensor(i64{512 * 3, 512 * 5}, chunks...)
	var err error
	c := cost.Of(func() { err = tn.Validate() })
	require.NoError(t, err)
	assert.Less(t, c.CPU, slowdown*time.Second/2)
}

func TestValidateBudget(t *testing.T) {
	// 20000 chunks cutting a 12-D tensor irregularly along every dimension:
	// too irregular to check within the budget, and said so quickly rather
	// than after minutes.
	rng := rand.New(rand.NewSource(3))
	shape := make([]int64, 12)
	for d := range shape {
		shape[d] = 1 << 5
	}
	chunks := tiling(rng, shape, 20000)
	var err error
	c := cost.Of(func() { err = tensor(shape, chunks...).Validate() })
	assert.Less(t, c.CPU, slowdown*time.Second/2)
	require.ErrorIs(t, err, ErrInvalid)
	assert.ErrorIs(t, err, errTooIrregular)
	assert.Contains(t, err.Error(), `tensor "w": 20000 chunks: chunk layout too irregular to check`)

	// Irregular along 5 dimensions is still checked.
	shape = []int64{64, 64, 64, 64, 64}
	require.NoError(t, tensor(shape, tiling(rng, shape, 20000)...).Validate())
}
