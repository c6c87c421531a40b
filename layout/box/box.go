// Package box is the byte geometry of a rectangular box inside a C-order
// tensor: the one piece of arithmetic that reading a view (gathering chunks),
// writing a checkpoint (cutting chunks out of a tensor) and mapping (slicing
// a layer or a head out of a stacked tensor) all rest on.
//
// Treat an element's bytes as one more, innermost, dimension of extent
// elemSize that every box covers fully. A box is then a box of a byte
// array, and two facts make it cheap:
//
//  1. The map from a box's own byte position (its bytes in C order) to the
//     tensor's byte position is strictly increasing, so the box's bytes that
//     land in a window of the tensor are one contiguous range of the box.
//  2. The box's bytes split into equal runs that are contiguous in the
//     tensor too: a run spans the box's extent in the last dimension it does
//     not cover fully, times everything inside it. A box of whole rows
//     (dim-0 split) is a single run; a column block has one run per row.
package box

import "fmt"

// Box is the part [Offsets[d], Offsets[d]+Sizes[d]) of each dimension d.
type Box struct {
	Offsets []int64
	Sizes   []int64
}

// Geometry is a box of a C-order tensor with its byte layout precomputed.
type Geometry struct {
	offsets []int64 // rank+1 (the element bytes last: offset 0)
	sizes   []int64 // rank+1 (the element bytes last: elemSize)
	stride  []int64 // byte stride of each dimension in the tensor
	inner   []int64 // byte stride of each dimension in the box
	bytes   int64   // bytes in the box
	runDim  int     // dimensions after runDim are covered fully
	runLen  int64   // bytes per run
}

// New returns the geometry of b inside a tensor of the given shape and
// element size. The box must lie inside the shape (checked).
func New(shape []int64, elemSize int64, b Box) (*Geometry, error) {
	rank := len(shape)
	if len(b.Offsets) != rank || len(b.Sizes) != rank {
		return nil, fmt.Errorf("box: box of rank %d/%d in a tensor of rank %d", len(b.Offsets), len(b.Sizes), rank)
	}
	g := &Geometry{
		offsets: append(append(make([]int64, 0, rank+1), b.Offsets...), 0),
		sizes:   append(append(make([]int64, 0, rank+1), b.Sizes...), elemSize),
		stride:  make([]int64, rank+1),
		inner:   make([]int64, rank+1),
	}
	full := append(append(make([]int64, 0, rank+1), shape...), elemSize)
	stride, inner := int64(1), int64(1)
	for d := rank; d >= 0; d-- {
		if g.offsets[d] < 0 || g.sizes[d] < 0 || g.offsets[d] > full[d] || g.sizes[d] > full[d]-g.offsets[d] {
			return nil, fmt.Errorf("box: box (offsets %v sizes %v) outside shape %v", b.Offsets, b.Sizes, shape)
		}
		g.stride[d], g.inner[d] = stride, inner
		stride *= full[d]
		inner *= g.sizes[d]
	}
	g.bytes = inner
	for g.runDim = rank; g.runDim > 0 && g.sizes[g.runDim] == full[g.runDim]; g.runDim-- {
	}
	g.runLen = g.sizes[g.runDim] * g.inner[g.runDim]
	return g, nil
}

// Bytes is the number of bytes in the box.
func (g *Geometry) Bytes() int64 { return g.bytes }

// RunLen is the length of each of the box's runs; a box with one run
// (RunLen == Bytes) is contiguous in the tensor.
func (g *Geometry) RunLen() int64 { return g.runLen }

// Runs is the number of runs.
func (g *Geometry) Runs() int64 {
	if g.bytes == 0 {
		return 0
	}
	return g.bytes / g.runLen
}

// RunStart is the tensor byte offset of run r.
func (g *Geometry) RunStart(r int64) int64 {
	pos := g.offsets[g.runDim] * g.stride[g.runDim]
	for d := g.runDim - 1; d >= 0; d-- {
		pos += (g.offsets[d] + r%g.sizes[d]) * g.stride[d]
		r /= g.sizes[d]
	}
	return pos
}

// Start and End are the tensor byte offsets of the box's first byte and
// just past its last (both 0 for an empty box).
func (g *Geometry) Start() int64 {
	if g.bytes == 0 {
		return 0
	}
	return g.RunStart(0)
}

func (g *Geometry) End() int64 {
	if g.bytes == 0 {
		return 0
	}
	return g.RunStart(g.Runs()-1) + g.runLen
}

// CountBefore returns how many of the box's bytes lie at tensor byte
// positions below pos (0 <= pos <= the tensor's size): the box's own byte
// position of the first of its bytes at or after pos.
func (g *Geometry) CountBefore(pos int64) int64 {
	if g.bytes == 0 {
		return 0
	}
	var count int64
	rem := pos
	for d := range g.sizes {
		idx := rem / g.stride[d]
		rem %= g.stride[d]
		lo, hi := g.offsets[d], g.offsets[d]+g.sizes[d]
		switch {
		case idx < lo:
			return count
		case idx >= hi:
			return count + g.sizes[d]*g.inner[d]
		}
		count += (idx - lo) * g.inner[d]
	}
	return count
}

// Spans calls fn for each contiguous piece of the box's bytes [l0, l1)
// (box byte positions), with the tensor byte offset where the piece lies
// and its position in the box, in order. It stops at fn's first error.
func (g *Geometry) Spans(l0, l1 int64, fn func(at, local, n int64) error) error {
	for l := l0; l < l1; {
		r, within := l/g.runLen, l%g.runLen
		n := min(g.runLen-within, l1-l)
		if err := fn(g.RunStart(r)+within, l, n); err != nil {
			return err
		}
		l += n
	}
	return nil
}
