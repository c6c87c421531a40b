package cache

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// block is one filled, immutable block. It carries its own identity so that a
// ristretto key collision is detected instead of serving another block.
//
// Its buffer is reused by a later fill once nobody holds the block: refs
// counts the holders (the reader that led its fill, the staging ring,
// ristretto, and every reader copying from it or replying with its bytes).
// A block whose count reached zero is dead: acquire refuses it, so a reader
// that finds it in a lookup just looks again. Holders that lose a reference
// without releasing it (a FUSE reply never written) only keep the buffer
// from being reused; the GC frees it.
type block struct {
	id   uint64
	idx  int64
	data []byte
	// prefetched is set when read-ahead filled the block and cleared by the
	// first foreground read that uses it (ReadAheadHits counts those).
	prefetched atomic.Bool
	// lastUse is the staging ring's clock at the block's last foreground
	// use (or its fill).
	lastUse atomic.Uint64

	refs atomic.Int32
	inRC atomic.Bool // ristretto holds one of refs (released once, however often it says the block left)
	bufs *buffers    // where the buffer goes back; nil for a buffer not from the pool
}

// acquire takes a reference unless the block is dead.
func (b *block) acquire() bool {
	for {
		r := b.refs.Load()
		if r <= 0 {
			return false
		}
		if b.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// retain takes another reference; the caller holds one.
func (b *block) retain() {
	if b.refs.Add(1) <= 1 {
		panic(fmt.Sprintf("cache: block %d of file %d retained after its last release", b.idx, b.id))
	}
}

// release drops a reference; the last one gives the buffer back.
func (b *block) release() {
	switch r := b.refs.Add(-1); {
	case r == 0:
		if b.bufs != nil {
			b.bufs.put(b.data)
		}
	case r < 0:
		// Another holder may already be reading a later fill's bytes
		// through this buffer: stop rather than serve them.
		panic(fmt.Sprintf("cache: block %d of file %d released more often than held", b.idx, b.id))
	}
}

// enterRC takes the reference ristretto will hold, before it is offered the
// block (it may let go of it before Set returns).
func (b *block) enterRC() {
	b.retain()
	b.inRC.Store(true)
}

// leaveRC drops ristretto's reference, once.
func (b *block) leaveRC() {
	if b != nil && b.inRC.CompareAndSwap(true, false) {
		b.release()
	}
}

// poisonFreed overwrites every buffer given back, so that a read through a
// block after its last release shows as wrong bytes: on in this package's
// tests, and wherever CKPTFS_DEBUG_POISON is set (make test sets it for
// every Go test and every mount the e2e tests start).
var poisonFreed = os.Getenv("CKPTFS_DEBUG_POISON") != ""

// buffers hands out the buffers of full blocks and keeps those given back
// for the next fills: a fresh 4 MiB buffer costs its zeroing and page
// faults (and the GC its sweep), about a seventh of the mount's CPU in a
// cold read. It also counts the bytes being filled, so that the bytes
// filling plus the bytes kept free stay within limit, the share of Size
// the fills have.
type buffers struct {
	size  int64 // bytes of a full block
	limit int64

	mu      sync.Mutex
	free    [][]byte // GUARDED_BY(mu); each of len size
	filling int64    // GUARDED_BY(mu)

	freeBytes, reused atomic.Int64 // for Stats and tests
}

// gauges returns the bytes being filled and kept free, at one instant.
func (p *buffers) gauges() (filling, free int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.filling, p.freeBytes.Load()
}

// get returns a buffer of n bytes for a fill and counts it as filling until
// filled is called. Only the buffers of full blocks come from the pool and
// go back to it (recycle).
func (p *buffers) get(n int64) (buf []byte, recycle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filling += n
	if n == p.size && len(p.free) > 0 {
		buf = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.freeBytes.Add(-p.size)
		p.reused.Add(1)
		return buf, true
	}
	return make([]byte, n), n == p.size
}

// filled ends the fill of n bytes that get began.
func (p *buffers) filled(n int64) {
	p.mu.Lock()
	p.filling -= n
	p.mu.Unlock()
}

// put takes back the buffer of a dead block, or leaves it to the GC when
// keeping it would exceed the limit.
func (p *buffers) put(buf []byte) {
	if int64(len(buf)) != p.size {
		return
	}
	if poisonFreed {
		for i := range buf {
			buf[i] = 0xA5
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling+int64(len(p.free)+1)*p.size > p.limit {
		return
	}
	p.free = append(p.free, buf)
	p.freeBytes.Add(p.size)
}

// drop gives every kept buffer to the GC.
func (p *buffers) drop() {
	p.mu.Lock()
	clear(p.free)
	p.free = p.free[:0]
	p.freeBytes.Store(0)
	p.mu.Unlock()
}
