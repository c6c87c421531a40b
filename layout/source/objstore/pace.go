package objstore

import "slices"

// How far a stream reads ahead of its reader (see aheads): a loader that
// faults tensors in its state dict's order (from_pretrained through mmap)
// reads an object in runs of a tensor's part, then jumps to another
// tensor's, and comes back later. A stream that read its whole share of
// memory ahead of such a reader held bytes nobody asked for yet, and when
// memory ran short they were dropped and fetched again (issue 36: 1.25x the
// view fetched, BENCHMARKS.md run AA-load). So a stream's body is read
// only so far ahead of what its readers took or wait for: aheadFirst at
// first, twice what they took from it as they follow it, at most its share
// of memory; and once a large read of its object lands elsewhere (the
// reader jumped), no further than what waiting readers ask for, until a
// read comes back past where it had been. A stream's request still asks
// for its whole range: pacing costs no request, only the body's bytes
// wait in the connection.
//
// Nor does a stream of an object whose readers come ahead of its body:
// a lend past the frontier, or one while another waits (the block cache's
// fills of the next blocks, several at once). Bytes read ahead into
// pieces would be copied out again by the next fill (their pieces touched
// for the first time on the way); waiting in the connection, they go
// straight into that fill's buffer (lend.go). The object's later streams
// start so too. A lone reader that lends at the frontier (one read at a
// time) keeps the read-ahead: nothing else reads its next bytes early.
//
// And a stream does not fetch what its object's reads already delivered:
// it ends where the next delivered span begins (a jumping reader's plain
// reads lie ahead of the frontier), and it begins past the span its start
// falls in.

// aheadFirst is how far a new stream reads past what its first reader asks
// for.
const aheadFirst = 4 << 20

// maxSpans bounds the delivered spans kept per object; past it the
// lowest are forgotten (a stream may then fetch them again).
const maxSpans = 256

// span is bytes [lo, hi) of an object.
type span struct{ lo, hi int64 }

// pace is a stream's read-ahead state. GUARDED_BY(aheads.mu).
type pace struct {
	took   int64 // the end of the furthest bytes a reader took from it
	ahead  int64 // how far past took and need its body is read
	left   bool  // a large read of its object landed elsewhere
	leftAt int64 // took when it did
}

// paceReach is where a stream that is not tentative may read its body to.
// Called with aheads.mu held.
func (s *stream) paceReach() int64 {
	if s.left || s.f.fillsAhead {
		return s.need
	}
	return max(s.need, max(s.took, s.start)+s.ahead)
}

// startPace sets the read-ahead of a new stream of a tree whose streams
// each get share bytes of memory.
func (s *stream) startPace(share int64) {
	s.ahead = min(aheadFirst, share)
}

// tookFrom records that a reader took [off, off+n) from s: its read-ahead
// grows with what its readers took, and a paused body is woken. Called
// with aheads.mu held.
func (a *aheads) tookFrom(s *stream, off, n int64) {
	if off+n <= s.took {
		return
	}
	s.took = off + n
	s.ahead = max(s.ahead, min(2*(s.took-s.start), a.memory/minStreams))
	if s.paused {
		a.roomMade()
	}
}

// readersAhead is told that l was lent to s: a lend past its frontier, or
// beside another, stops its object's read-ahead (see above). Called with
// aheads.mu held.
func readersAhead(s *stream, l *lend) {
	if l.off > s.arrived || len(s.lends) > 1 {
		s.f.fillsAhead = true
	}
}

// followed is told that a large read of f begins at off in s: a reader
// back past where s was left makes s read ahead again. Called with
// aheads.mu held.
func (a *aheads) followed(s *stream, off int64) {
	if s.left && off >= s.leftAt {
		s.left = false
		if s.paused {
			a.roomMade()
		}
	}
}

// jumped is told that a large read of f at off is served by none of its
// streams: streams it does not follow stop reading ahead. Called with
// aheads.mu held.
func (a *aheads) jumped(f *file, off int64) {
	for _, s := range f.streams {
		if !s.left && (off < s.start || off > max(s.took, s.need)+a.request) {
			s.left, s.leftAt = true, max(s.took, s.start)
		}
	}
}

// delivered records that reads of f were given [lo, hi). Called with
// aheads.mu held.
func (f *file) delivered(lo, hi int64) {
	i, _ := slices.BinarySearchFunc(f.spans, lo, func(s span, lo int64) int {
		switch {
		case s.hi < lo:
			return -1
		case s.hi > lo:
			return 1
		}
		return 0
	})
	// f.spans[i:] end at or after lo: merge those that begin by hi.
	j := i
	for j < len(f.spans) && f.spans[j].lo <= hi {
		lo, hi = min(lo, f.spans[j].lo), max(hi, f.spans[j].hi)
		j++
	}
	f.spans = slices.Replace(f.spans, i, j, span{lo, hi})
	if len(f.spans) > maxSpans {
		f.spans = slices.Delete(f.spans, 0, len(f.spans)-maxSpans)
	}
}

// pastDelivered is where a stream for a read at off that follows the
// frontier from begins: past the delivered span from falls in, not past
// off. Called with aheads.mu held.
func (f *file) pastDelivered(from, off int64) int64 {
	for _, s := range f.spans {
		if s.lo <= from && from < s.hi {
			return min(s.hi, off)
		}
	}
	return from
}

// undelivered is where a stream from start ends: end, or the first span
// delivered after start, but not before want (the end of the read that
// starts it, fetched whatever). Called with aheads.mu held.
func (f *file) undelivered(start, end, want int64) int64 {
	for _, s := range f.spans {
		if s.lo > start {
			return min(end, max(s.lo, want))
		}
	}
	return end
}
