package view

import (
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/mapping"
)

// ResidentBytes is an upper bound of the bytes the view and its
// checkpoint's index hold in memory while it is open (ckpt.Checkpoint.
// ResidentBytes, the generated headers and files, the placements, and what
// reading its tensors builds): what a mount's metadata budget counts
// (vfs.Options.MetadataBudget). The budget reads it once, when the view
// opens, so it is the same before and after any read.
func (v *View) ResidentBytes() int64 {
	n := int64(unsafe.Sizeof(*v)) + v.Checkpoint.ResidentBytes() + v.boxes.resident()
	seen := map[*geometry]bool{}
	for _, f := range v.Files {
		n += int64(unsafe.Sizeof(*f)) + int64(len(f.Name)+len(f.Path)+cap(f.header)+cap(f.data))
		for _, p := range f.placements {
			n += int64(unsafe.Sizeof(p)) + int64(len(p.Name)) + p.content.resident(seen)
		}
	}
	n += int64(len(v.Tensors)) * int64(unsafe.Sizeof(Placement{}))
	for _, o := range v.Omitted {
		n += int64(unsafe.Sizeof(o)) + int64(len(o.Name)+len(o.Reason))
	}
	return n
}

// resident is the geometry, counted once per view (seen): mapped tensors
// share their sources'. The boxes its reads build are counted too: in its
// view's cache bound (boxCache.resident), or here when it has no cache.
func (g *geometry) resident(seen map[*geometry]bool) int64 {
	if seen[g] {
		return 0
	}
	seen[g] = true
	n := ckpt.HeapSize(int64(unsafe.Sizeof(*g)))
	if g.cache == nil {
		n += g.boxBytes()
	}
	return n
}

// boxBytes is what building the tensor's boxes keeps, known before it
// does: a chunkGeometry slice sized for every chunk (and its header, which
// geometry.built points to), and a box per chunk.
func (g *geometry) boxBytes() int64 {
	n := int64(g.tensor.Chunks.Len())
	return ckpt.HeapSize(int64(unsafe.Sizeof([]chunkGeometry{}))) + ckpt.HeapSize(n*int64(unsafe.Sizeof(chunkGeometry{}))) + n*boxHeap(len(g.tensor.Shape))
}

// boxHeap is what box.New keeps for a box of a tensor of the given rank:
// the Geometry and its four slices of rank+1 numbers.
func boxHeap(rank int) int64 {
	return ckpt.HeapSize(int64(unsafe.Sizeof(box.Geometry{}))) + 4*ckpt.HeapSize(8*int64(rank+1))
}

// resident is the mapped tensor, its mapping, its pieces' boxes and the
// geometries of the tensors they are cut from.
func (m *mapped) resident(seen map[*geometry]bool) int64 {
	n := ckpt.HeapSize(int64(unsafe.Sizeof(*m))) + ckpt.HeapSize(int64(cap(m.pieces))*int64(unsafe.Sizeof(mappedPiece{})))
	n += mappingBytes(m.t)
	for _, p := range m.pieces {
		n += boxHeap(len(p.src.tensor.Shape)) + p.src.resident(seen)
	}
	return n
}

// mappingBytes is what a mapping's tensor holds (slices it shares with
// others counted as its own: an upper bound).
func mappingBytes(t *mapping.Tensor) int64 {
	n := ckpt.HeapSize(int64(unsafe.Sizeof(*t))) + int64(len(t.Name)+len(t.Transform)) + ckpt.HeapSize(8*int64(cap(t.Shape)))
	n += ckpt.HeapSize(int64(cap(t.Pieces)) * int64(unsafe.Sizeof(mapping.Piece{})))
	for _, p := range t.Pieces {
		n += ckpt.HeapSize(8*int64(cap(p.Offsets))) + ckpt.HeapSize(8*int64(cap(p.Sizes))) + ckpt.HeapSize(8*int64(cap(p.Rows)))
	}
	return n
}
