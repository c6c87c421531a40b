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
	// served is which of its bytes foreground reads took: once every one
	// was, the block is consumed.
	served servedSet

	refs atomic.Int32
	inRC atomic.Bool // ristretto holds one of refs (released once, however often it says the block left)
	bufs *buffers    // the account its bytes are counted in and its buffer goes back to; nil in tests of a block alone
}

// cost is the bytes a block holds: its buffer's capacity (a short block
// may sit in a full block's buffer).
func (b *block) cost() int64 { return int64(cap(b.data)) }

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
			b.bufs.put(b.data[:cap(b.data)])
		}
	case r < 0:
		// Another holder may already be reading a later fill's bytes
		// through this buffer: stop rather than serve them.
		panic(fmt.Sprintf("cache: block %d of file %d released more often than held", b.idx, b.id))
	}
}

// enterRC takes the reference ristretto will hold, before it is offered the
// block (it may let go of it before Set returns), and moves its bytes from
// staged to cached.
func (b *block) enterRC() {
	b.retain()
	b.inRC.Store(true)
	if b.bufs != nil {
		b.bufs.move(&b.bufs.staged, &b.bufs.cached, b.cost())
	}
}

// leaveRC drops ristretto's reference, once.
func (b *block) leaveRC() {
	if b != nil && b.inRC.CompareAndSwap(true, false) {
		if b.bufs != nil {
			b.bufs.add(&b.bufs.cached, -b.cost())
		}
		b.release()
	}
}

// poisonFreed overwrites every buffer given back, so that a read through a
// block after its last release shows as wrong bytes: on in this package's
// tests, and wherever CKPTFS_DEBUG_POISON is set (make test sets it for
// every Go test and every mount the e2e tests start).
var poisonFreed = os.Getenv("CKPTFS_DEBUG_POISON") != ""

// buffers is the one account of the bytes of block buffers a Cache holds,
// and the pool they are reused from. Every byte is in exactly one of:
//   - filling: buffers handed to fills in flight;
//   - staged: blocks the staging ring holds;
//   - cached: blocks ristretto holds (or was offered and has not yet
//     refused);
//   - free: buffers kept for the next fills (a fresh 16 MiB buffer costs its
//     zeroing and page faults, and left to the GC it is RSS until the next
//     collection, which the memory limit puts off).
//
// Their sum stays within limit (the Cache's Bound): a fill takes a free
// buffer, or a fresh one while the sum leaves room; else the cache makes
// room (the staging ring gives up a block) or, with the ring at its
// minimum, the fills' reserve pays (see Cache.buffer). A block moves
// between them by adding to the new place before taking from the old, so
// the sum read under mu never understates. Bytes of a block that left the
// cache while a reader still copies or replies with it are in none: when
// that reader lets go the buffer is kept if it fits, else left to the GC.
type buffers struct {
	size  int64 // bytes of a full block
	limit int64

	mu                            sync.Mutex
	free                          [][]byte // GUARDED_BY(mu); each of len size
	filling, staged, cached, kept int64    // GUARDED_BY(mu); kept: bytes of free

	freeBytes, reused atomic.Int64 // for Stats and tests
}

// account is the four parts of the account at one instant.
type account struct{ filling, staged, cached, free int64 }

func (a account) sum() int64 { return a.filling + a.staged + a.cached + a.free }

// gauges returns the account at one instant.
func (p *buffers) gauges() account {
	p.mu.Lock()
	defer p.mu.Unlock()
	return account{p.filling, p.staged, p.cached, p.kept}
}

// add moves n bytes into (n < 0: out of) one part of the account.
func (p *buffers) add(part *int64, n int64) {
	p.mu.Lock()
	*part += n
	p.mu.Unlock()
}

// move counts n bytes in part to instead of from, in one step.
func (p *buffers) move(from, to *int64, n int64) {
	p.mu.Lock()
	*from -= n
	*to += n
	p.mu.Unlock()
}

// get returns a buffer of n bytes (n <= size) for a fill and counts it as
// filling until filled is called: a kept buffer when there is one, else a
// fresh one when the account has room for it (ok false: none) or force is
// set (the fills' reserve pays for it). A short block takes a kept buffer
// when there is one, so that its bytes stay in the pool.
func (p *buffers) get(n int64, force bool) (buf []byte, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := len(p.free); k > 0 && n <= p.size {
		buf = p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.kept -= p.size
		p.freeBytes.Store(p.kept)
		p.filling += p.size
		p.reused.Add(1)
		return buf[:n], true
	}
	if !force && p.filling+p.staged+p.cached+p.kept+n > p.limit {
		return nil, false
	}
	p.filling += n
	return make([]byte, n), true
}

// filled ends a failed fill that get began with buf, whose buffer is
// dropped (a fill that succeeds moves its bytes to staged: staging.put).
func (p *buffers) filled(buf []byte) { p.add(&p.filling, -int64(cap(buf))) }

// put takes back the buffer of a dead block (its whole capacity), or leaves
// it to the GC when it is not a full block's or keeping it would pass the
// limit.
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
	if p.filling+p.staged+p.cached+p.kept+p.size > p.limit {
		return
	}
	p.free = append(p.free, buf)
	p.kept += p.size
	p.freeBytes.Store(p.kept)
}

// drop gives every kept buffer to the GC.
func (p *buffers) drop() {
	p.mu.Lock()
	clear(p.free)
	p.free = p.free[:0]
	p.kept = 0
	p.freeBytes.Store(0)
	p.mu.Unlock()
}
