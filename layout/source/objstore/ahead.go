package objstore

import (
	"container/list"
	"slices"
	"sync"
)

// A view's reads of one shard object come in record order, a few at a
// time: the zip directory at the end of a torch.save record (small reads),
// then the record's data, then the next record's directory, 4 MiB further on
// for a layer's chunk. One GET each is two requests per record, and a block
// straddling two records of an object two more. So a read that starts at
// or shortly after where the object's last read ended (its frontier) is
// fetched from that frontier to at least Limits.MinRequest bytes further, in
// one GET, and what that holds beyond the read is kept as a span that the
// next reads (small ones included) are served from. A read elsewhere is a
// plain ranged GET (a small one through a window) and moves the frontier.
//
// Spans are bounded by Limits.AheadMemory across the tree, their buffers
// reused. A span large reads have taken is dropped at once; one left unused while the tree fetched staleAfter × (AheadMemory /
// MinRequest) other spans may be dropped to make room; a read that finds
// no room is a plain GET. A read whose bytes a span being fetched will hold
// waits for it instead of asking the store again; a span that failed is
// dropped, and its readers get its error.
type aheads struct {
	minRequest, memory int64

	mu    sync.Mutex
	used  int64     // GUARDED_BY(mu); bytes of the spans' buffers, held or still copied from
	lru   list.List // GUARDED_BY(mu); *span, the most recently used first
	tick  uint64    // GUARDED_BY(mu); spans fetched so far
	free  [][]byte  // GUARDED_BY(mu); buffers of dropped spans, for the next ones
	freeN int64     // GUARDED_BY(mu); their bytes
}

// staleAfter: see aheads.
const staleAfter = 4

// span is bytes [start, end) of an object, fetched (or being fetched) ahead.
type span struct {
	f          *file
	start, end int64
	elem       *list.Element // GUARDED_BY(aheads.mu); nil once dropped
	read       int64         // GUARDED_BY(aheads.mu); bytes large reads took from it
	refs       int           // GUARDED_BY(aheads.mu); readers copying from it
	touched    uint64        // GUARDED_BY(aheads.mu); aheads.tick when last read
	recycled   bool          // GUARDED_BY(aheads.mu); its buffer went back (recycle)

	ready chan struct{} // closed once buf or err is set
	buf   []byte
	err   error
}

func newAheads(l Limits) *aheads {
	return &aheads{minRequest: l.MinRequest, memory: l.AheadMemory}
}

// read serves p at off from spans, fetching a new one when the read follows
// the object's frontier; ok is false when it did not take the read (then it
// is a plain one, which the caller reads).
func (a *aheads) read(f *file, p []byte, off int64) (n int, ok bool, err error) {
	if a.minRequest <= 0 || a.memory < a.minRequest {
		return 0, false, nil
	}
	large := len(p) > smallRead
	for n < len(p) {
		at := off + int64(n)
		s, fresh := a.spanFor(f, at, int64(len(p)-n), large)
		if s == nil {
			if n == 0 {
				return 0, false, nil
			}
			m, err := f.read(p[n:], at) // the rest of a read that began in a span
			return n + m, true, err
		}
		if fresh {
			if t := a.following(f, s); t != nil {
				go func() { a.fill(t); a.release(t, 0, false) }()
			}
			a.fill(s)
		}
		<-s.ready
		if s.err != nil {
			a.release(s, 0, false)
			return n, true, s.err
		}
		k := copy(p[n:], s.buf[at-s.start:])
		n += k
		a.release(s, int64(k), large)
	}
	return n, true, nil
}

// spanFor returns the span holding off, or a new one (fresh: the caller
// fetches it) when the read of n bytes at off follows the frontier of f;
// nil when the read is a plain one. The caller releases the span.
func (a *aheads) spanFor(f *file, off, n int64, large bool) (s *span, fresh bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range f.spans {
		if s.start <= off && off < s.end {
			a.lru.MoveToFront(s.elem)
			s.refs++
			s.touched = a.tick
			return s, false
		}
	}
	next := f.next
	if next >= 0 && off >= next && off-next < a.minRequest {
		if s = a.newSpan(f, next); s != nil {
			return s, true
		}
	}
	// A plain read. A large one is where the object's reader is now,
	// unless spans lie beyond it (a block read after the next ones):
	// the frontier stays after them, so that spans never overlap. A small
	// read (a record's directory) says nothing of where a reader is.
	if large && !slices.ContainsFunc(f.spans, func(s *span) bool { return s.end > off }) {
		f.next = off + n
	}
	return nil, false
}

// newSpan is a span of f from start, the object's new frontier, when there
// is room for it. Every span takes a buffer of MinRequest bytes (one size:
// buffers are reused), the last of an object fewer of them.
func (a *aheads) newSpan(f *file, start int64) *span {
	buf, ok := a.room()
	if !ok {
		return nil
	}
	end := min(f.info.Size, start+a.minRequest)
	a.tick++
	s := &span{f: f, start: start, end: end, buf: buf, ready: make(chan struct{}), refs: 1, touched: a.tick}
	s.elem = a.lru.PushFront(s)
	a.used += a.minRequest
	f.spans = append(f.spans, s)
	f.next = end
	return s
}

// following is a span after s, fetched at once when there is room, so
// that an object read in order has two requests in flight.
func (a *aheads) following(f *file, s *span) *span {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f.next != s.end || s.end >= f.info.Size {
		return nil
	}
	return a.newSpan(f, s.end)
}

// room makes room for one more span: it takes a kept buffer (nil: none is
// kept) and drops stale spans that have arrived, least recently used
// first, then kept buffers; false if there is not enough.
func (a *aheads) room() ([]byte, bool) {
	var buf []byte
	if k := len(a.free); k > 0 {
		buf, a.free = a.free[k-1], a.free[:k-1]
		a.freeN -= int64(cap(buf))
	}
	full := func() bool { return a.used+a.freeN+a.minRequest > a.memory }
	stale := uint64(staleAfter * (a.memory / a.minRequest))
	for e := a.lru.Back(); e != nil && full(); {
		prev := e.Prev()
		if s := e.Value.(*span); s.arrived() && a.tick-s.touched >= stale {
			a.drop(s)
		}
		e = prev
	}
	for k := len(a.free); k > 0 && full(); k-- {
		a.freeN -= int64(cap(a.free[k-1]))
		a.free[k-1], a.free = nil, a.free[:k-1]
	}
	if full() {
		if buf != nil {
			a.free = append(a.free, buf)
			a.freeN += int64(cap(buf))
		}
		return nil, false
	}
	return buf, true
}

// drop forgets s; its buffer is reused once no reader copies from it.
func (a *aheads) drop(s *span) {
	if s.elem == nil {
		return
	}
	a.lru.Remove(s.elem)
	s.elem = nil
	for i, t := range s.f.spans {
		if t == s {
			s.f.spans = append(s.f.spans[:i], s.f.spans[i+1:]...)
			break
		}
	}
	if s.refs == 0 {
		a.recycle(s)
	}
}

// recycle keeps the buffer of a dropped span that no reader holds, once.
func (a *aheads) recycle(s *span) {
	if s.recycled {
		return
	}
	s.recycled = true
	a.used -= a.minRequest
	if s.buf != nil && a.used+a.freeN+int64(cap(s.buf)) <= a.memory {
		a.free = append(a.free, s.buf[:0])
		a.freeN += int64(cap(s.buf))
	}
	s.buf = nil
}

// release ends a reader's copy of n bytes from s. Once large reads took
// all of it but what a window holds (the record directories between the
// data, which small reads took), nothing in it will be asked for again:
// reads of a view's blocks come in any order, so it is their sum that
// says so, not how far the last one went.
func (a *aheads) release(s *span, n int64, large bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s.refs--
	if large {
		s.read += n
		if s.read+windowSize >= s.end-s.start {
			a.drop(s)
		}
	}
	if s.elem == nil && s.refs == 0 && s.arrived() {
		a.recycle(s)
	}
}

func (s *span) arrived() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// fill fetches s; a failed span is dropped, so the next read asks again.
func (a *aheads) fill(s *span) {
	buf := s.buf
	if buf == nil {
		buf = make([]byte, a.minRequest)
	}
	buf = buf[:s.end-s.start]
	n, err := s.f.read(buf, s.start)
	if err == nil && n < len(buf) {
		err = &AttemptError{Cause: "short read"} // f.read returns all or an error
	}
	a.mu.Lock()
	s.buf = buf
	if err != nil {
		s.err = err
		a.drop(s)
		s.f.next = -1
	}
	close(s.ready)
	a.mu.Unlock()
}
