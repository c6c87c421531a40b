package objstore

import (
	"context"
	"io"
	"sort"
)

// A reader waiting at a stream's frontier lends it its buffer: the body is
// read straight into it, as a plain GET reads into the block being filled,
// instead of into pieces that the reader then copies out of (a copy of
// every byte, and pieces touched for the first time). Pieces hold only the
// bytes no reader waited for when they came.
//
// A large read (the block cache's fills) that finds its first byte not yet
// in, and no other lend over its range, registers a lend at its offset and
// waits until fetch's goroutine is done with its buffer: fetch reads into
// the pieces up to the next lend's offset, then into the lend until it is
// full or the attempt ends (a cut body resumes, with the same pin, for the
// rest of the read, which lends again). A lend the body went past before it
// was registered (a piece was being read over it) gets nothing: its reader
// copies from the piece as before. The reader's buffer is the stream's until
// the lend is done, even when the stream is dropped, so that no byte is
// written into it after its read returned.
//
// Bytes lent are in no piece: a stream records their spans, holds no longer
// reports them, and a later read of them is a plain GET (the block cache
// reads each block once). A piece a lend began or ended in keeps its other
// bytes; the span in between is never served from it.

// lend is a reader's buffer at off, fetch's to write until done.
type lend struct {
	p    []byte
	off  int64
	got  int  // bytes read into p; GUARDED_BY(aheads.mu) once done
	done bool // GUARDED_BY(aheads.mu); fetch no longer writes into p
}

// lent reports whether the byte at off went to a lend; if not, next is
// where the next lent span begins (s.end if none). Called with aheads.mu
// held.
func (s *stream) lent(off int64) (in bool, next int64) {
	i := sort.Search(len(s.lentSpans), func(i int) bool { return s.lentSpans[i].hi > off })
	if i == len(s.lentSpans) {
		return false, s.end
	}
	if sp := s.lentSpans[i]; sp.lo <= off {
		return true, sp.hi
	}
	return false, s.lentSpans[i].lo
}

// lendTo registers p at off as a lend of s when the read may lend: large,
// its first byte not in yet, s not tentative (whose body reads only what is
// asked: see aheads), and no lend over its range. Called with aheads.mu
// held.
func (a *aheads) lendTo(s *stream, p []byte, off int64, large bool) *lend {
	if !large || s.tentative || s.done || s.elem == nil || off < s.arrived || off >= s.end {
		return nil
	}
	n := min(int64(len(p)), s.end-off)
	i := sort.Search(len(s.lends), func(i int) bool { return s.lends[i].off >= off })
	if i > 0 && s.lends[i-1].off+int64(len(s.lends[i-1].p)) > off || i < len(s.lends) && s.lends[i].off < off+n {
		return nil
	}
	l := &lend{p: p[:n], off: off}
	s.lends = append(s.lends, nil)
	copy(s.lends[i+1:], s.lends[i:])
	s.lends[i] = l
	return l
}

// awaitLend waits, as one of the waiters of s, until fetch is done with l;
// the bytes it got. Called with aheads.mu held; returns with it held.
func (a *aheads) awaitLend(s *stream, l *lend) int {
	s.waiters++
	a.roomMade() // a stream paused for memory needs none for a lend
	for !l.done {
		wake := s.wake
		a.mu.Unlock()
		<-wake
		a.mu.Lock()
	}
	s.waiters--
	return l.got
}

// lendAt returns the lend at the frontier of s, nil if none; lends the body
// went past get nothing and are let go. Called in fetch's goroutine.
func (a *aheads) lendAt(s *stream) *lend {
	a.mu.Lock()
	defer a.mu.Unlock()
	missed := false
	for len(s.lends) > 0 && s.lends[0].off < s.arrived {
		s.lends[0].done, s.lends = true, s.lends[1:]
		missed = true
	}
	if missed {
		s.broadcast()
	}
	if len(s.lends) > 0 && s.lends[0].off == s.arrived {
		return s.lends[0]
	}
	return nil
}

// pieceLimit is how far the current piece of s is read: limit's, and not
// past the next lend, so that the body reaches it at a piece's read's end.
func (a *aheads) pieceLimit(s *stream, want int) int {
	k := a.limit(s, want)
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(s.lends) > 0 {
		if at := s.lends[0].off - s.curAt; at >= int64(s.curN) && at < int64(k) {
			k = int(at)
		}
	}
	return k
}

// readLent reads the body of s straight into l (in fetch's goroutine) until
// it is full or the attempt ends, and hands l back to its reader.
func (a *aheads) readLent(s *stream, l *lend, r io.Reader) (int64, error) {
	k, err := io.ReadFull(r, l.p[l.got:])
	a.mu.Lock()
	defer a.mu.Unlock()
	if k > 0 {
		at := s.arrived
		if n := len(s.lentSpans); n > 0 && s.lentSpans[n-1].hi == at {
			s.lentSpans[n-1].hi += int64(k)
		} else {
			s.lentSpans = append(s.lentSpans, span{at, at + int64(k)})
		}
		s.arrived += int64(k)
		l.got += k
		a.lentBytes.Add(int64(k))
		if s.cur != nil {
			if s.arrived < s.curAt+pieceSize {
				s.curN = int(s.arrived - s.curAt) // the piece goes on after the lent span
			} else {
				a.dropCur(s)
			}
		}
	}
	if l.got == len(l.p) || err != nil || s.elem == nil {
		l.done = true
		s.lends = s.lends[1:]
	}
	s.broadcast()
	if s.elem == nil {
		return int64(k), context.Canceled
	}
	return int64(k), err
}

// placeCur points the current piece of s at its frontier: the piece that
// holds it, filled up to it (the bytes before it there, if any, were lent
// or are in the piece's earlier buffer, never this one's). Called with
// aheads.mu held, as the piece's buffer is taken.
func (s *stream) placeCur() {
	s.curAt = s.start + (s.arrived-s.start)/pieceSize*pieceSize
	s.curN = int(s.arrived - s.curAt)
}

// dropCur ends the current piece of s: kept if handed over to readers,
// else its buffer given back (a lend took the rest of its bytes, or the
// body ended). Called with aheads.mu held.
func (a *aheads) dropCur(s *stream) {
	i := (s.curAt - s.start) / pieceSize
	if b := s.pieces[i]; s.elem == nil || b == nil || &b[0] != &s.cur[0] {
		s.held -= pieceSize
		a.used -= pieceSize
		if a.used+a.freeN+pieceSize <= a.memory {
			a.free = append(a.free, s.cur[:0])
			a.freeN += pieceSize
		}
		a.roomMade()
	}
	s.cur = nil
}

// finishLends hands every lend left back to its reader as it is: the
// request ended. Called with aheads.mu held.
func (s *stream) finishLends() {
	for _, l := range s.lends {
		l.done = true
	}
	s.lends = nil
}
