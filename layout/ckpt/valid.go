package ckpt

import (
	"slices"
	"unsafe"

	"github.com/ckptfs/ckptfs/safetensors"
)

// A tensor passes Validate once, in its format's reader, and the view plan
// needs the same guarantee of every tensor it serves, some of which no
// reader checked (built by a mapping or stacked after opening). A mark set
// by Validate lets CheckValid skip the second check, and it cannot outlive
// a change: it records what was checked (the dtype, a copy of the shape,
// the chunks' arrays by identity and length), and a tensor differing in any
// of them is checked again. Chunk geometry is never changed in place once
// stored (Chunks' contract); a new chunk, new arrays, a new shape or dtype
// all void the mark. The mark holds the arrays it names, so that they
// cannot be freed and their addresses reused by other chunks.
type validMark struct {
	dtype  safetensors.DType
	shape  []int64
	chunks Chunks // geometry only: no sources
}

// markValid records that t, as it is now, passed Validate.
func (t *Tensor) markValid() {
	c := t.Chunks
	c.srcs, c.table = nil, nil
	t.valid.Store(&validMark{dtype: t.DType, shape: slices.Clone(t.Shape), chunks: c})
}

// CheckValid is Validate, except that a tensor that passed Validate and has
// not changed since is not checked again.
func (t *Tensor) CheckValid() error {
	if m, _ := t.valid.Load().(*validMark); m != nil && m.dtype == t.DType && slices.Equal(m.shape, t.Shape) && m.chunks.sameGeometry(&t.Chunks) {
		return nil
	}
	return t.Validate()
}

// sameGeometry reports whether cs and o hold the same chunk geometry
// arrays: the same chunks, as geometry is never changed in place.
func (cs *Chunks) sameGeometry(o *Chunks) bool {
	return cs.n == o.n && cs.rank == o.rank &&
		len(cs.geom) == len(o.geom) && unsafe.SliceData(cs.geom) == unsafe.SliceData(o.geom) &&
		len(cs.ends) == len(o.ends) && unsafe.SliceData(cs.ends) == unsafe.SliceData(o.ends)
}

// validBytes is what t's mark holds beyond the arrays t holds itself.
func (t *Tensor) validBytes() int64 {
	if m, _ := t.valid.Load().(*validMark); m != nil {
		return int64(unsafe.Sizeof(*m)) + 8*int64(len(m.shape))
	}
	return 0
}
