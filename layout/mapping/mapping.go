// Package mapping turns the tensors a training framework saves into the
// tensors an HF model loads, as data: a view tensor is a list of pieces,
// each a box of one checkpoint tensor (optionally with its rows permuted),
// concatenated in order, optionally converted to another floating type.
// Renaming, slicing a layer out of a stacked tensor, splitting fused Q/K/V
// or gate/up tensors, unpadding a vocabulary and RoPE row orders are all
// such pieces, so a mapped view is still gathered lazily from shard byte
// ranges: nothing here reads or holds tensor data.
package mapping

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Tensor is one tensor of a mapped view.
type Tensor struct {
	Name  string
	Shape []int64
	// DType is the view's type; the pieces' type when empty.
	DType  safetensors.DType
	Pieces []Piece
	// Transform says what was done, for inspect ("" for a plain rename).
	Transform string
}

// Piece is a box of one checkpoint tensor. Its elements, in C order, are
// the next elements of the view tensor.
type Piece struct {
	Source  *ckpt.Tensor
	Offsets []int64
	Sizes   []int64
	// Rows, when set, cuts the box into len(Rows) equal rows (in its C
	// order) and takes them in this order: view row i is box row Rows[i].
	Rows []int64
}

// Whole is the piece that is all of t.
func Whole(t *ckpt.Tensor) Piece {
	return Piece{Source: t, Offsets: make([]int64, len(t.Shape)), Sizes: t.Shape}
}

// Elements is the number of elements in the piece's box.
func (p Piece) Elements() int64 {
	n, _ := ckpt.NumElements(p.Sizes)
	return n
}

// Check verifies that the tensor's pieces exist, fit in their sources, share
// one type and add up to its shape.
func (t *Tensor) Check() error {
	n, err := ckpt.NumElements(t.Shape)
	if err != nil {
		return fmt.Errorf("mapping: %s: %w", t.Name, err)
	}
	var sum int64
	var from safetensors.DType
	for i, p := range t.Pieces {
		if p.Source == nil {
			return fmt.Errorf("mapping: %s: piece %d has no source", t.Name, i)
		}
		if from == "" {
			from = p.Source.DType
		} else if p.Source.DType != from {
			return fmt.Errorf("mapping: %s: pieces of types %s and %s", t.Name, from, p.Source.DType)
		}
		if len(p.Offsets) != len(p.Source.Shape) || len(p.Sizes) != len(p.Source.Shape) {
			return fmt.Errorf("mapping: %s: piece of %s has rank %d, the tensor %d", t.Name, p.Source.Name, len(p.Sizes), len(p.Source.Shape))
		}
		for d := range p.Sizes {
			if p.Offsets[d] < 0 || p.Sizes[d] < 0 || p.Offsets[d]+p.Sizes[d] > p.Source.Shape[d] {
				return fmt.Errorf("mapping: %s: box %v+%v outside %s %v", t.Name, p.Offsets, p.Sizes, p.Source.Name, p.Source.Shape)
			}
		}
		e := p.Elements()
		if len(p.Rows) > 0 {
			if e%int64(len(p.Rows)) != 0 {
				return fmt.Errorf("mapping: %s: %d rows do not divide a box of %d elements", t.Name, len(p.Rows), e)
			}
			seen := make([]bool, len(p.Rows))
			for _, r := range p.Rows {
				if r < 0 || r >= int64(len(p.Rows)) || seen[r] {
					return fmt.Errorf("mapping: %s: rows are not a permutation", t.Name)
				}
				seen[r] = true
			}
		}
		sum += e
	}
	if sum != n {
		return fmt.Errorf("mapping: %s: pieces hold %d elements, shape %v needs %d", t.Name, sum, t.Shape, n)
	}
	if len(t.Pieces) == 0 && n != 0 {
		return fmt.Errorf("mapping: %s: no pieces", t.Name)
	}
	return nil
}

// SourceType is the type of the tensor's pieces.
func (t *Tensor) SourceType() safetensors.DType {
	if len(t.Pieces) == 0 {
		return t.DType
	}
	return t.Pieces[0].Source.DType
}

// ViewType is the type of the view tensor.
func (t *Tensor) ViewType() safetensors.DType {
	if t.DType != "" {
		return t.DType
	}
	return t.SourceType()
}
