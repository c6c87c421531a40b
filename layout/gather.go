package layout

import (
	"fmt"
	"io"
	"sync"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// The byte-range math of a global tensor.
//
// A tensor's bytes are its elements in C order. Treat the element's bytes as
// one more, innermost, dimension of extent elemSize that every chunk covers
// fully. A chunk is then a box in that (rank+1)-dimensional byte array, and
// its own storage is the box in C order. Two facts make reads cheap:
//
//  1. The map from a chunk's local byte position to the global byte position
//     is strictly increasing. So the chunk bytes that land inside a global
//     window [lo, hi) are one contiguous local range: one pread per chunk.
//  2. The chunk's local bytes split into equal runs that are contiguous in the
//     global order too: the run spans the chunk's extent in the last dimension
//     it does not cover fully, times everything inside it. A Shard(0) chunk is
//     a single run; a Shard(1) chunk has one run per row.

// geometry is the precomputed layout of one tensor.
type geometry struct {
	tensor  *ckpt.Tensor
	size    int64   // total bytes
	gstride []int64 // byte stride of each dimension of the byte array (rank+1 dims)
	chunks  []chunkGeometry
}

type chunkGeometry struct {
	src     ckpt.Source
	offsets []int64 // rank+1, last is 0
	sizes   []int64 // rank+1, last is elemSize
	inner   []int64 // inner[d] = prod(sizes[d+1:]): local byte stride of dim d
	bytes   int64   // total local bytes
	runDim  int     // dims > runDim are covered fully
	runLen  int64   // bytes per run = sizes[runDim]*inner[runDim]
}

func newGeometry(t *ckpt.Tensor) (*geometry, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	es := int64(t.DType.Size())
	rank := len(t.Shape)
	shape := append(append([]int64(nil), t.Shape...), es)
	g := &geometry{tensor: t, gstride: make([]int64, rank+1)}
	stride := int64(1)
	for d := rank; d >= 0; d-- {
		g.gstride[d] = stride
		stride *= shape[d]
	}
	g.size = stride
	for _, c := range t.Chunks {
		cg := chunkGeometry{
			src:     c.Source,
			offsets: append(append([]int64(nil), c.Offsets...), 0),
			sizes:   append(append([]int64(nil), c.Sizes...), es),
			inner:   make([]int64, rank+1),
		}
		n := int64(1)
		for d := rank; d >= 0; d-- {
			cg.inner[d] = n
			n *= cg.sizes[d]
		}
		cg.bytes = n
		if n == 0 {
			continue // empty chunks hold no bytes
		}
		cg.runDim = rank
		for cg.runDim > 0 && cg.sizes[cg.runDim] == shape[cg.runDim] {
			cg.runDim--
		}
		cg.runLen = cg.sizes[cg.runDim] * cg.inner[cg.runDim]
		g.chunks = append(g.chunks, cg)
	}
	return g, nil
}

// countBefore returns how many of the chunk's bytes lie at global byte
// positions below pos (0 <= pos <= tensor size).
func (g *geometry) countBefore(c *chunkGeometry, pos int64) int64 {
	var count int64
	rem := pos
	for d := range c.sizes {
		idx := rem / g.gstride[d]
		rem %= g.gstride[d]
		lo, hi := c.offsets[d], c.offsets[d]+c.sizes[d]
		switch {
		case idx < lo:
			return count
		case idx >= hi:
			return count + c.sizes[d]*c.inner[d]
		}
		count += (idx - lo) * c.inner[d]
	}
	return count
}

// runStart is the global byte position of the chunk's run r.
func (g *geometry) runStart(c *chunkGeometry, r int64) int64 {
	pos := c.offsets[c.runDim] * g.gstride[c.runDim]
	for d := c.runDim - 1; d >= 0; d-- {
		pos += (c.offsets[d] + r%c.sizes[d]) * g.gstride[d]
		r /= c.sizes[d]
	}
	return pos
}

// bufPool recycles gather buffers so a read allocates nothing in the steady
// state. Buffers larger than maxPooled are not kept.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<20); return &b }}

const maxPooled = 8 << 20

// readAt fills dst with the tensor's bytes starting at global byte pos.
// It issues one read per chunk that intersects the window and scatters the
// runs; a chunk that is one run is read straight into dst.
func (g *geometry) readAt(dst []byte, pos int64) error {
	end := pos + int64(len(dst))
	if pos < 0 || end > g.size {
		return fmt.Errorf("layout: tensor %q: range [%d, %d) outside %d bytes", g.tensor.Name, pos, end, g.size)
	}
	for i := range g.chunks {
		c := &g.chunks[i]
		l0, l1 := g.countBefore(c, pos), g.countBefore(c, end)
		if l0 == l1 {
			continue
		}
		if c.runLen == c.bytes { // one run: contiguous in the global order
			at := g.runStart(c, 0) + l0 - pos
			if err := readFull(c.src, dst[at:at+l1-l0], l0); err != nil {
				return g.chunkError(c, err)
			}
			continue
		}
		bp := bufPool.Get().(*[]byte)
		buf := *bp
		if int64(cap(buf)) < l1-l0 {
			buf = make([]byte, l1-l0)
		}
		buf = buf[:l1-l0]
		err := readFull(c.src, buf, l0)
		if err == nil {
			g.scatter(c, dst, pos, buf, l0)
		}
		if cap(buf) <= maxPooled {
			*bp = buf[:0]
			bufPool.Put(bp)
		}
		if err != nil {
			return g.chunkError(c, err)
		}
	}
	return nil
}

// scatter copies the chunk bytes buf (local positions [l0, l0+len(buf))) to
// their places in dst (global positions from pos).
func (g *geometry) scatter(c *chunkGeometry, dst []byte, pos int64, buf []byte, l0 int64) {
	for l := l0; l < l0+int64(len(buf)); {
		r, within := l/c.runLen, l%c.runLen
		n := min(c.runLen-within, l0+int64(len(buf))-l)
		at := g.runStart(c, r) + within - pos
		copy(dst[at:at+n], buf[l-l0:l-l0+n])
		l += n
	}
}

func (g *geometry) chunkError(c *chunkGeometry, err error) error {
	return fmt.Errorf("tensor %q chunk at %v from %s: %w", g.tensor.Name, c.offsets[:len(c.offsets)-1], c.src, err)
}

func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}
