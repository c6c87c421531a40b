package ckpt

import (
	"iter"
	"math"
)

// Chunks are the chunks of one tensor, stored flat: every chunk's offsets
// then sizes in one []int64, and their sources in one slice, or in a table
// the format keeps (SetSources). A checkpoint of hundreds of ranks has
// hundreds of thousands of chunks per view, and a Chunk of its own per chunk
// (two slice headers, two allocations) and a source repeating its geometry
// were most of an open view's memory.
//
// A chunk read with At or All is a view of the flat array: its Offsets and
// Sizes must not be modified. Chunks of any rank can be stored (Validate
// reports a chunk whose rank is not its tensor's); the common case, every
// chunk of one rank, costs nothing beyond the numbers.
type Chunks struct {
	n    int
	rank int // of every chunk, while ends is nil
	// ends, once a chunk's rank differs from the others', holds for every
	// chunk where its offsets end and where its sizes end in geom.
	ends []uint32
	geom []int64
	// srcs, when not nil, holds every chunk's source; else table does, or
	// no chunk has one.
	srcs  []Source
	table SourceTable
}

// SourceTable holds the sources of a tensor's chunks, in the chunks' order,
// where a format keeps them in an array of its own: one interface value per
// chunk less.
type SourceTable interface {
	Source(i int) Source
}

var noDims = []int64{}

// MakeChunks stores cs.
func MakeChunks(cs ...Chunk) Chunks {
	var out Chunks
	if len(cs) > 0 {
		out.Grow(len(cs), len(cs[0].Offsets))
	}
	out.Append(cs...)
	return out
}

// ChunksOf is n chunks of one rank whose offsets then sizes are geom's,
// chunk after chunk (2*rank*n numbers): geom becomes theirs, not copied
// (a format reader that decoded them so).
func ChunksOf(n, rank int, geom []int64) Chunks {
	if n < 0 || rank < 0 || (n > 0 && rank > len(geom)/2/n) || len(geom) != 2*rank*n {
		panic("ckpt: ChunksOf: geometry of another length")
	}
	if geom == nil {
		geom = noDims[:0:0]
	}
	return Chunks{n: n, rank: rank, geom: geom}
}

// Grow makes room for n more chunks of the given rank.
func (cs *Chunks) Grow(n, rank int) {
	if cs.n == 0 {
		cs.rank = rank
	}
	if n > 0 && rank > 0 && n <= math.MaxInt/(2*rank)-len(cs.geom) {
		cs.geom = growTo(cs.geom, len(cs.geom)+2*rank*n)
	}
	if cs.srcs != nil {
		cs.srcs = growTo(cs.srcs, cs.n+n)
	}
}

func growTo[T any](s []T, n int) []T {
	if n <= cap(s) {
		return s
	}
	out := make([]T, len(s), n)
	copy(out, s)
	return out
}

// Add appends a chunk, copying offsets and sizes.
func (cs *Chunks) Add(offsets, sizes []int64, src Source) {
	if cs.n == 0 && cs.ends == nil {
		cs.rank = len(offsets)
	}
	if cs.ends == nil && (len(offsets) != cs.rank || len(sizes) != cs.rank) {
		cs.ends = make([]uint32, 0, 2*(cs.n+1))
		for i := range cs.n {
			cs.ends = append(cs.ends, uint32((2*i+1)*cs.rank), uint32((2*i+2)*cs.rank))
		}
	}
	if cs.geom == nil {
		cs.geom = noDims[:0:0]
	}
	cs.geom = append(cs.geom, offsets...)
	if cs.ends != nil {
		cs.ends = append(cs.ends, uint32(len(cs.geom)))
	}
	cs.geom = append(cs.geom, sizes...)
	if cs.ends != nil {
		cs.ends = append(cs.ends, uint32(len(cs.geom)))
	}
	if src != nil {
		cs.ownSources()
	}
	if cs.srcs != nil {
		cs.srcs = append(cs.srcs, src)
	}
	cs.n++
}

// Append appends chunks, copying their offsets and sizes.
func (cs *Chunks) Append(chunks ...Chunk) {
	for _, c := range chunks {
		cs.Add(c.Offsets, c.Sizes, c.Source)
	}
}

// ownSources moves the sources into srcs.
func (cs *Chunks) ownSources() {
	if cs.srcs != nil {
		return
	}
	cs.srcs = make([]Source, cs.n, max(cs.n, cap(cs.geom)/max(1, 2*cs.rank)))
	if cs.table != nil {
		for i := range cs.n {
			cs.srcs[i] = cs.table.Source(i)
		}
		cs.table = nil
	}
}

// SetSources makes t hold the chunks' sources, chunk i's t.Source(i).
func (cs *Chunks) SetSources(t SourceTable) { cs.srcs, cs.table = nil, t }

// Len is the number of chunks.
func (cs *Chunks) Len() int { return cs.n }

// At returns chunk i; its Offsets and Sizes are read-only.
func (cs *Chunks) At(i int) Chunk {
	if i < 0 || i >= cs.n {
		panic("ckpt: chunk index out of range")
	}
	off, sizes := cs.box(i)
	return Chunk{Offsets: off, Sizes: sizes, Source: cs.Source(i)}
}

// box returns chunk i's offsets and sizes (read-only), without its source.
func (cs *Chunks) box(i int) (offsets, sizes []int64) {
	var o0, o1, s1 int
	if cs.ends == nil {
		o0 = 2 * i * cs.rank
		o1, s1 = o0+cs.rank, o0+2*cs.rank
	} else {
		if i > 0 {
			o0 = int(cs.ends[2*i-1])
		}
		o1, s1 = int(cs.ends[2*i]), int(cs.ends[2*i+1])
	}
	return cs.geom[o0:o1:o1], cs.geom[o1:s1:s1]
}

// Source returns chunk i's source.
func (cs *Chunks) Source(i int) Source {
	switch {
	case cs.srcs != nil:
		return cs.srcs[i]
	case cs.table != nil:
		return cs.table.Source(i)
	}
	return nil
}

// SetSource replaces chunk i's source.
func (cs *Chunks) SetSource(i int, s Source) {
	cs.ownSources()
	cs.srcs[i] = s
}

// All yields every chunk with its index, in order.
func (cs *Chunks) All() iter.Seq2[int, Chunk] {
	return func(yield func(int, Chunk) bool) {
		for i := range cs.n {
			if !yield(i, cs.At(i)) {
				return
			}
		}
	}
}

// Values returns a copy of the chunks as a slice (small tensors, tests).
func (cs *Chunks) Values() []Chunk {
	out := make([]Chunk, cs.n)
	for i := range out {
		out[i] = cs.At(i)
	}
	return out
}

// residentBytes is what the flat arrays hold (the sources themselves not
// included).
func (cs *Chunks) residentBytes() int64 {
	return 8*int64(cap(cs.geom)) + 4*int64(cap(cs.ends)) + 16*int64(cap(cs.srcs))
}
