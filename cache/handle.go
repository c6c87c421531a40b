package cache

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// errNegativeOffset matches os.File.ReadAt's complaint.
var errNegativeOffset = errors.New("cache: negative offset")

// Handle is one open of a virtual file. It tracks the access pattern of its
// reads to drive read-ahead; the blocks themselves are shared by every handle
// of every file in the Cache. A Handle is safe for concurrent use.
type Handle struct {
	c      *Cache
	f      file
	closed atomic.Bool

	mu      sync.Mutex
	lastEnd int64 // GUARDED_BY(mu); end of the previous read, -1 before the first
	raNext  int64 // GUARDED_BY(mu); first block this stream has not yet offered to read-ahead
	run     int64 // GUARDED_BY(mu); bytes read by the current sequential stream
}

// Open returns a handle for one open of file id (a stable id for the virtual
// file, unique per Cache) of size bytes served by src. Handles of the same id
// share cached blocks, so they must have the same src content and size.
func (c *Cache) Open(id uint64, src Source, size int64) *Handle {
	size = max(size, 0)
	bs := c.opts.BlockSize
	nb := size / bs
	if size%bs != 0 {
		nb++
	}
	c.openHandles.Add(1)
	return &Handle{c: c, f: file{id: id, src: src, size: size, nblocks: nb}, lastEnd: -1}
}

// Size returns the size of the file.
func (h *Handle) Size() int64 { return h.f.size }

// Close ends the handle: its queued read-ahead is dropped and later reads
// return ErrClosed. Idempotent.
func (h *Handle) Close() {
	if h.closed.CompareAndSwap(false, true) {
		h.c.openHandles.Add(-1)
	}
}

// ReadAt reads len(p) bytes at off, assembled from the blocks that cover
// them. Like os.File.ReadAt: a read that reaches the end of the file returns
// the bytes there are and io.EOF; an empty p returns 0, nil.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	err := h.blocks(off, len(p), func(b *block, part []byte) {
		n += copy(p[n:], part)
		b.release()
	})
	return n, err
}

// Pinned is bytes of the cache's blocks, handed out without a copy. The
// blocks' buffers are not reused for other bytes until Release.
type Pinned struct {
	Parts    [][]byte // the bytes, in order, one slice per block
	blocks   []*block
	released atomic.Bool
	// A FUSE read (at most 1 MiB) spans one or two blocks: room for them
	// here saves two allocations per read.
	partsBuf  [2][]byte
	blocksBuf [2]*block
}

// Len is the number of bytes in Parts.
func (p *Pinned) Len() int {
	n := 0
	for _, part := range p.Parts {
		n += len(part)
	}
	return n
}

// Release lets the blocks' buffers be reused; Parts must not be read after
// it. Idempotent. A Pinned that is never released only keeps its buffers
// from being reused (the GC frees them).
func (p *Pinned) Release() {
	if p == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	for _, b := range p.blocks {
		b.release()
	}
}

// Slices returns up to n bytes at off as slices of the blocks that hold
// them, without copying, with the errors of ReadAt: on io.EOF, the bytes up
// to the end of the file; on any other error, nil. The caller releases the
// result once it is done with the bytes (a FUSE reply, once written); the
// cache's bound does not count them once their blocks left the cache.
func (h *Handle) Slices(off int64, n int) (*Pinned, error) {
	p := &Pinned{}
	p.Parts, p.blocks = p.partsBuf[:0], p.blocksBuf[:0]
	err := h.blocks(off, n, func(b *block, part []byte) {
		p.Parts = append(p.Parts, part)
		p.blocks = append(p.blocks, b)
	})
	if err != nil && !errors.Is(err, io.EOF) {
		p.Release()
		return nil, err
	}
	return p, err
}

// blocks passes the parts of the blocks covering [off, off+n), in order, to
// use, each block acquired: use releases it when done with the part. It
// returns io.EOF when the range runs past the end of the file.
func (h *Handle) blocks(off int64, n int, use func(*block, []byte)) error {
	if off < 0 {
		return errNegativeOffset
	}
	if h.closed.Load() {
		return ErrClosed
	}
	if n == 0 {
		return nil
	}
	if off >= h.f.size {
		return io.EOF
	}
	c := h.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return ErrClosed
	}

	end := off + min(int64(n), h.f.size-off)
	h.readAhead(off, end)

	bs := c.opts.BlockSize
	for cur := off; cur < end; {
		idx := cur / bs
		b, err := c.getBlock(&h.f, idx)
		if err != nil {
			c.bytesServed.Add(cur - off)
			return err
		}
		part := b.data[cur-idx*bs : min(int64(len(b.data)), end-idx*bs)]
		if len(part) == 0 { // a block shorter than the file says: never loop on it
			b.release()
			c.bytesServed.Add(cur - off)
			return io.ErrUnexpectedEOF
		}
		use(b, part)
		cur += int64(len(part))
	}
	c.bytesServed.Add(end - off)
	if end-off < int64(n) {
		return io.EOF
	}
	return nil
}

// readAhead updates the access pattern with the read [off, end) and, when it
// is sequential, offers the next ReadAhead blocks after end to the workers.
// A read is sequential when it starts where the previous one ended, or in the
// block where the previous one ended, or in the block after it. The window
// ramps up with the stream: one block ahead per block already read, up to
// ReadAhead, so short runs (mmap faults hopping between small tensors) do not
// pull in blocks nobody reads.
func (h *Handle) readAhead(off, end int64) {
	c := h.c
	if c.opts.ReadAhead <= 0 {
		return
	}
	bs := c.opts.BlockSize
	h.mu.Lock()
	seq := false
	if h.lastEnd > 0 {
		lastBlk, startBlk := (h.lastEnd-1)/bs, off/bs
		seq = off == h.lastEnd || startBlk == lastBlk || startBlk == lastBlk+1
	}
	h.lastEnd = end
	if !seq {
		h.raNext, h.run = 0, end-off
		h.mu.Unlock()
		return
	}
	h.run += end - off
	window := min(int64(c.opts.ReadAhead), max(1, h.run/bs))
	endBlk := (end - 1) / bs
	from := max(h.raNext, endBlk+1)
	to := min(endBlk+window, h.f.nblocks-1)
	if from > to {
		h.mu.Unlock()
		return
	}
	h.raNext = to + 1
	h.mu.Unlock()
	c.enqueue(h, from, to)
}
