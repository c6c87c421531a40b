package ckpt

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type namedSource struct{ Section }

type table []namedSource

func (t table) Source(i int) Source { return &t[i] }

func TestChunksStoreWhatWasAdded(t *testing.T) {
	a, b, c := &Section{Offset: 1}, &Section{Offset: 2}, &Section{Offset: 3}
	want := []Chunk{
		{Offsets: []int64{0, 0}, Sizes: []int64{2, 4}, Source: a},
		{Offsets: []int64{2, 0}, Sizes: []int64{2, 4}, Source: b},
		// A chunk of another rank (Validate reports it) and one whose
		// offsets and sizes differ in length are kept as they are.
		{Offsets: []int64{4}, Sizes: []int64{1, 1, 1}, Source: c},
		{Offsets: []int64{4, 0}, Sizes: []int64{1, 4}},
	}
	cs := MakeChunks(want...)
	require.Equal(t, len(want), cs.Len())
	assert.Equal(t, want, cs.Values())
	for i, ch := range cs.All() {
		assert.Equal(t, want[i], ch)
		assert.Equal(t, len(ch.Offsets), cap(ch.Offsets), "a chunk's offsets cannot be appended to in place")
	}
	cs.SetSource(3, a)
	assert.Same(t, a, cs.At(3).Source)
	assert.Same(t, b, cs.Source(1))

	scalar := MakeChunks(Chunk{Offsets: []int64{}, Sizes: []int64{}})
	assert.Equal(t, Chunk{Offsets: []int64{}, Sizes: []int64{}}, scalar.At(0))
	assert.Panics(t, func() { scalar.At(1) })
}

func TestChunksFromATable(t *testing.T) {
	var cs Chunks
	cs.Grow(3, 1)
	for i := range int64(3) {
		cs.Add([]int64{i}, []int64{1}, nil)
	}
	assert.Nil(t, cs.Source(0))
	srcs := make(table, 3)
	cs.SetSources(srcs)
	for i := range 3 {
		assert.Same(t, &srcs[i], cs.At(i).Source)
	}
	// Replacing one source (a --verify wrapper) keeps the others.
	other := &Section{}
	cs.SetSource(1, other)
	assert.Same(t, &srcs[0], cs.Source(0))
	assert.Same(t, other, cs.Source(1))
	assert.Same(t, &srcs[2], cs.Source(2))
	assert.Equal(t, []int64{2}, cs.At(2).Offsets)

	tn := &Tensor{Name: "w", DType: "F32", Shape: []int64{3}, Chunks: cs}
	require.NoError(t, tn.Validate())
}

// ChunksOf takes a decoded flat array as it is: the same chunks as Add
// would store, and a chunk added after it does not write into it.
func TestChunksOf(t *testing.T) {
	geom := []int64{0, 0, 2, 4, 2, 0, 2, 4}
	cs := ChunksOf(2, 2, geom)
	want := MakeChunks(Chunk{Offsets: []int64{0, 0}, Sizes: []int64{2, 4}}, Chunk{Offsets: []int64{2, 0}, Sizes: []int64{2, 4}})
	assert.Equal(t, want.Values(), cs.Values())
	assert.Equal(t, 2, cap(cs.At(0).Offsets))
	cs.Add([]int64{4, 0}, []int64{1, 4}, nil)
	assert.Equal(t, []int64{0, 0, 2, 4, 2, 0, 2, 4}, geom)
	assert.Equal(t, []int64{4, 0}, cs.At(2).Offsets)

	scalars := ChunksOf(3, 0, nil)
	assert.Equal(t, Chunk{Offsets: []int64{}, Sizes: []int64{}}, scalars.At(2))
	none := ChunksOf(0, 2, nil)
	assert.Equal(t, 0, none.Len())
	for _, bad := range []struct{ n, rank, len int }{{2, 2, 7}, {2, 2, 9}, {-1, 1, 0}, {1, -1, 0}, {1 << 62, 1 << 62, 0}} {
		assert.Panics(t, func() { ChunksOf(bad.n, bad.rank, make([]int64, bad.len)) }, "%+v", bad)
	}
}
