package cache

import (
	"context"
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
	c *Cache
	f file
	// closed is apart from the Handle so that the staging ring can tell
	// a closed handle's blocks without keeping the handle (and its Source).
	closed *atomic.Bool

	mu      sync.Mutex
	streams [maxStreams]stream // GUARDED_BY(mu)
	tick    uint64             // GUARDED_BY(mu); orders the streams' last use
	// readFull has a bit set for each block whose last byte not yet read
	// was served by this handle (see block.consumed); nil until one was.
	readFull []uint64 // GUARDED_BY(mu)
}

// maxStreams is how many sequential streams one handle tracks at once.
// Several threads copying one mapped tensor (torch splits a large copy
// between its threads) fault it in as interleaved streams through one
// handle; tracked as one, each read would break the other's run and
// read-ahead would never ramp up.
const maxStreams = 4

// stream is one sequential run of a handle's reads.
type stream struct {
	lastEnd int64  // end of its last read; 0: unused
	raNext  int64  // first block it has not yet offered to read-ahead
	run     int64  // bytes read by the run
	used    uint64 // the handle's tick at its last read
}

// continues reports whether a read at off continues the stream: it starts
// where the stream's last read ended, or in the block where it ended, or in
// the block after it.
func (s *stream) continues(off, bs int64) bool {
	if s.lastEnd <= 0 {
		return false
	}
	lastBlk, startBlk := (s.lastEnd-1)/bs, off/bs
	return off == s.lastEnd || startBlk == lastBlk || startBlk == lastBlk+1
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
	return &Handle{c: c, f: file{id: id, src: src, size: size, nblocks: nb}, closed: new(atomic.Bool)}
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
	err := h.blocks(context.Background(), off, len(p), func(b *block, part []byte) {
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
//
// Once ctx is done (a FUSE INTERRUPT, the request's deadline) Slices stops
// waiting for fills and returns context.Cause(ctx); the fills go on for the
// readers that come next.
func (h *Handle) Slices(ctx context.Context, off int64, n int) (*Pinned, error) {
	p := &Pinned{}
	p.Parts, p.blocks = p.partsBuf[:0], p.blocksBuf[:0]
	err := h.blocks(ctx, off, n, func(b *block, part []byte) {
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
func (h *Handle) blocks(ctx context.Context, off int64, n int, use func(*block, []byte)) error {
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
		b, err := c.getBlockCtx(ctx, &h.f, idx)
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
		if lo := cur - idx*bs; b.serve(lo, lo+int64(len(part))) {
			h.markReadFull(idx)
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
// continues one of the handle's streams, offers the next blocks after end to
// the workers. A read that continues none starts a stream in place of the
// least recently used one. The window ramps up with the stream: one block
// ahead per whole block already read, up to ReadAhead, so short runs (mmap
// faults hopping between small tensors, a loader touching the first pages of
// every tensor long before it reads them) pull in nothing.
func (h *Handle) readAhead(off, end int64) {
	c := h.c
	if c.opts.ReadAhead <= 0 {
		return
	}
	bs := c.opts.BlockSize
	h.mu.Lock()
	h.tick++
	var s *stream
	for i := range h.streams {
		if h.streams[i].continues(off, bs) {
			s = &h.streams[i]
			break
		}
	}
	if s == nil {
		s = &h.streams[0]
		for i := range h.streams {
			if h.streams[i].used < s.used {
				s = &h.streams[i]
			}
		}
		*s = stream{lastEnd: end, run: end - off, used: h.tick}
		h.mu.Unlock()
		return
	}
	s.lastEnd, s.used = end, h.tick
	s.run += end - off
	window := min(int64(c.opts.ReadAhead), s.run/bs)
	endBlk := (end - 1) / bs
	from := max(s.raNext, endBlk+1)
	to := min(endBlk+window, h.f.nblocks-1)
	if from <= to {
		s.raNext = c.enqueue(h, from, to)
	}
	h.mu.Unlock()
}

// markReadFull records that the handle's read took the last byte of block
// idx that no read had taken (block.consumed). A loader that faults tensors
// in its state dict's order through mmap reads a block's parts at moments
// far apart and each byte once (the kernel keeps the pages): read-ahead
// that follows one of its runs into blocks it already read fetched them
// again once the cache had let them go (issue 36, BENCHMARKS.md run
// AA-load). Read-ahead skips them (wasReadFull).
func (h *Handle) markReadFull(idx int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.readFull == nil {
		h.readFull = make([]uint64, (h.f.nblocks+63)/64)
	}
	if idx >= 0 && idx < h.f.nblocks {
		h.readFull[idx/64] |= 1 << (idx % 64)
	}
}

// wasReadFull is wasReadFullLocked for a caller without mu.
func (h *Handle) wasReadFull(idx int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wasReadFullLocked(idx)
}

// wasReadFullLocked reports whether one of the handle's reads made block
// idx read in full (markReadFull). Caller holds mu.
func (h *Handle) wasReadFullLocked(idx int64) bool {
	return h.readFull != nil && idx >= 0 && idx < h.f.nblocks && h.readFull[idx/64]&(1<<(idx%64)) != 0
}
