package cache

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// servedSet records which bytes of a block foreground reads took, so that
// "read in full" means that every byte was read, not that as many bytes were
// read as the block has (a block whose first half is read twice - two
// handles, a re-read, faults in another order - is not read in full).
//
// The block is cut into granules of a power of two between 64 B and 4 KiB
// (see granuleShift): a bit per granule is set, lock-free, by a read that
// covers the granule whole. Reads through the page cache (FUSE, mmap faults)
// start on a page and run whole pages or to the end of the file, so with
// blocks of whole pages they take only that path. The piece of a read that covers a granule in part (a
// ReadAt at any offset) is kept as a span under mu until the granule's spans
// cover it; a granule read in more than maxSpans disjoint pieces keeps only
// the first ones, and so can only be judged read in part, never the other
// way. The zero value is empty.
type servedSet struct {
	bits  atomic.Pointer[[]atomic.Uint64] // a bit per granule read whole; nil until the first read
	whole atomic.Int64                    // bits set

	mu    sync.Mutex
	parts map[int64][]span // GUARDED_BY(mu); by granule: the pieces read of one not yet read whole
}

// span is the bytes [lo, hi) of a block.
type span struct{ lo, hi int64 }

// maxSpans bounds the disjoint pieces kept for one granule.
const maxSpans = 32

// granuleShift is log2 of the granule of a block of n bytes: 4 KiB (a page)
// from 16 MiB up, finer below so that a block has up to 4096 granules, down
// to 64 B. A block of more than 16 MiB has n/4 KiB of them.
func granuleShift(n int64) uint {
	return uint(min(max(bits.Len64(uint64(n>>12))-1, 6), 12))
}

// granules is how many granules a block of n bytes has at shift s.
func granules(n int64, s uint) int64 { return (n + 1<<s - 1) >> s }

// full says that every byte of a block of n bytes was read.
func (s *servedSet) full(n int64) bool { return s.whole.Load() >= granules(n, granuleShift(n)) }

// add records that a read took bytes [off, end) of a block of n bytes
// (0 <= off < end <= n). It returns true to the one call whose bytes made
// the block read in full.
func (s *servedSet) add(off, end, n int64) bool {
	if off >= end {
		return false
	}
	sh := granuleShift(n)
	g := int64(1) << sh
	ng := granules(n, sh)
	// The granules read whole: a short last granule is whole once the read
	// reaches the block's end.
	lo, hi := (off+g-1)>>sh, end>>sh
	if end == n {
		hi = ng
	}
	var newly int64
	if lo < hi {
		newly += s.mark(lo, hi, ng)
	}
	head, tail := off>>sh, end>>sh
	if off&(g-1) != 0 { // the read starts inside a granule
		newly += s.part(head, off, min(end, (head+1)<<sh), sh, n)
	}
	if end != n && end&(g-1) != 0 && (tail != head || off&(g-1) == 0) { // and ends inside another
		newly += s.part(tail, max(off, tail<<sh), end, sh, n)
	}
	return newly > 0 && s.whole.Add(newly) == ng
}

// words returns the bitmap of a block of ng granules, made by the first read.
func (s *servedSet) words(ng int64) []atomic.Uint64 {
	if p := s.bits.Load(); p != nil {
		return *p
	}
	w := make([]atomic.Uint64, (ng+63)/64)
	if s.bits.CompareAndSwap(nil, &w) {
		return w
	}
	return *s.bits.Load()
}

// mark sets the bits of granules [lo, hi) and returns how many were not set.
func (s *servedSet) mark(lo, hi, ng int64) int64 {
	w := s.words(ng)
	var newly int64
	for i := lo; i < hi; {
		k := i / 64
		upto := min(hi, (k+1)*64)
		m := ^uint64(0) << (i % 64)
		if upto%64 != 0 {
			m &= 1<<(upto%64) - 1
		}
		if w[k].Load()&m != m { // a block read again sets nothing
			newly += int64(bits.OnesCount64(m &^ w[k].Or(m)))
		}
		i = upto
	}
	return newly
}

// isSet reports whether granule i was read whole.
func (s *servedSet) isSet(i, ng int64) bool {
	return s.words(ng)[i/64].Load()&(1<<(i%64)) != 0
}

// part records that a read took [lo, hi) of granule i, part of it, and
// returns 1 when that made the granule read whole and marked it (see mark).
func (s *servedSet) part(i, lo, hi int64, sh uint, n int64) int64 {
	ng := granules(n, sh)
	if s.isSet(i, ng) {
		return 0
	}
	s.mu.Lock()
	if s.isSet(i, ng) { // a read covering it whole came in between
		delete(s.parts, i)
		s.mu.Unlock()
		return 0
	}
	if s.parts == nil {
		s.parts = make(map[int64][]span)
	}
	spans := addSpan(s.parts[i], span{lo, hi})
	gLo, gHi := i<<sh, min((i+1)<<sh, n)
	whole := len(spans) == 1 && spans[0].lo <= gLo && spans[0].hi >= gHi
	if whole {
		delete(s.parts, i)
	} else if len(spans) <= maxSpans {
		s.parts[i] = spans
	}
	s.mu.Unlock()
	if !whole {
		return 0
	}
	return s.mark(i, i+1, ng)
}

// addSpan returns the sorted, disjoint spans of sorted, disjoint spans and
// one more, touching ones merged. It does not write spans.
func addSpan(spans []span, n span) []span {
	out := make([]span, 0, len(spans)+1)
	placed := false
	for _, s := range spans {
		switch {
		case s.hi < n.lo:
			out = append(out, s)
		case n.hi < s.lo:
			if !placed {
				out, placed = append(out, n), true
			}
			out = append(out, s)
		default:
			n.lo, n.hi = min(n.lo, s.lo), max(n.hi, s.hi)
		}
	}
	if !placed {
		out = append(out, n)
	}
	return out
}

// serve records that a foreground read took bytes [off, end) of b, and
// returns true to the one read that made it read in full.
func (b *block) serve(off, end int64) bool {
	return b.served.add(off, end, int64(len(b.data)))
}

// consumed says that foreground reads took every byte of the block (see
// servedSet): the one judgment of "read in full" that the staging ring's
// order (evictLocked, spillRead), demote and Handle.markReadFull go by.
func (b *block) consumed() bool { return b.served.full(int64(len(b.data))) }
