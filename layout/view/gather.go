package view

import (
	"container/list"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// The bytes of a global tensor are gathered from its chunks, each a box of
// the tensor (package box has the geometry): the chunk bytes that land in a
// window of the tensor are one contiguous range of the chunk, so a read is
// one extent per chunk, scattered run by run when the chunk is not one run
// (readplan.go reads them).

// geometry is the layout of one tensor, its chunks' boxes computed on a
// read (boxes): a view of a checkpoint of millions of chunks lists and
// opens without them, and keeps them for the tensors read last only
// (boxCache), within a bound it counts from the open.
type geometry struct {
	tensor *ckpt.Tensor
	bytes  int64     // total bytes
	cache  *boxCache // nil: boxes are kept once built

	mu    sync.Mutex                      // held while building
	built atomic.Pointer[[]chunkGeometry] // nil until built, and once dropped
	err   error                           // under mu: a lasting failure to build
	elem  *list.Element                   // in cache.lru, under cache.mu
}

type chunkGeometry struct {
	src ckpt.Source
	box *box.Geometry
	i   int // the chunk's index in its tensor, for messages
}

// newGeometry checks that t's chunks tile it, which its format's reader
// checked already unless t was built or changed since (CheckValid).
func newGeometry(t *ckpt.Tensor) (*geometry, error) {
	if err := t.CheckValid(); err != nil {
		return nil, err
	}
	return &geometry{tensor: t, bytes: t.ByteSize()}, nil
}

// boxes returns the geometry of each chunk that holds bytes, kept while
// the tensor is among those its view read last (boxCache).
func (g *geometry) boxes() ([]chunkGeometry, error) {
	if b := g.built.Load(); b != nil {
		g.cache.use(g)
		return *b, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return nil, g.err
	}
	if b := g.built.Load(); b != nil {
		g.cache.use(g)
		return *b, nil
	}
	chunks, err := g.build()
	if err != nil {
		g.err = err
		return nil, err
	}
	g.built.Store(&chunks)
	g.cache.add(g)
	return chunks, nil
}

// build computes the boxes: a slice sized for every chunk (as boxBytes
// counts it) and a box.Geometry each.
func (g *geometry) build() ([]chunkGeometry, error) {
	t := g.tensor
	chunks := make([]chunkGeometry, 0, t.Chunks.Len())
	for i, c := range t.Chunks.All() {
		b, err := box.New(t.Shape, int64(t.DType.Size()), box.Box{Offsets: c.Offsets, Sizes: c.Sizes})
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if b.Bytes() > 0 { // empty chunks hold no bytes
			chunks = append(chunks, chunkGeometry{src: c.Source, box: b, i: i})
		}
	}
	return chunks, nil
}

// bufPool recycles scratch buffers so a read allocates nothing in the
// steady state. Buffers larger than maxPooled are not kept.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<20); return &b }}

const maxPooled = 8 << 20

// getBuf returns a scratch buffer of n bytes; putBuf gives it back.
func getBuf(n int64) *[]byte {
	bp := bufPool.Get().(*[]byte)
	if int64(cap(*bp)) < n {
		*bp = make([]byte, n)
	}
	*bp = (*bp)[:n]
	return bp
}

func putBuf(bp *[]byte) {
	if cap(*bp) <= maxPooled {
		*bp = (*bp)[:0]
		bufPool.Put(bp)
	}
}

// plan adds the reads of the tensor's bytes from global byte pos into dst:
// an extent per chunk that intersects the window, straight into dst when
// the chunk is one run, else scattered run by run.
func (g *geometry) plan(p *readPlan, dst []byte, pos int64) error {
	end := pos + int64(len(dst))
	if pos < 0 || end > g.bytes {
		return fmt.Errorf("layout: tensor %q: range [%d, %d) outside %d bytes", g.tensor.Name, pos, end, g.bytes)
	}
	chunks, err := g.boxes()
	if err != nil {
		return err
	}
	for i := range chunks {
		c := &chunks[i]
		l0, l1 := c.box.CountBefore(pos), c.box.CountBefore(end)
		if l0 == l1 {
			continue
		}
		p.begin(g, c, l0, l0 == 0 && l1 == c.box.Bytes())
		if c.box.RunLen() == c.box.Bytes() { // one run: contiguous in the global order
			at := c.box.Start() + l0 - pos
			p.part(dst[at : at+l1-l0])
			continue
		}
		c.box.Spans(l0, l1, func(at, local, n int64) error {
			p.part(dst[at-pos : at-pos+n])
			return nil
		})
	}
	return nil
}

func (g *geometry) chunkError(c *chunkGeometry, err error) error {
	return fmt.Errorf("tensor %q chunk at %v from %s: %w", g.tensor.Name, g.tensor.Chunks.At(c.i).Offsets, c.src, err)
}
