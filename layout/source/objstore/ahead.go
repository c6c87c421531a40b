package objstore

import (
	"container/list"
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A view's reads of one shard object come in record order, a few at a
// time and several objects at once: the zip directory at the end of a
// torch.save record (small reads), then the record's data, then the next
// record's directory, and the block cache's fills of consecutive view
// blocks, out of order. One GET each is two requests per record and more
// per block. So the object's first read of data (firstRead), and a read at
// or shortly after its frontier (where its last large read or stream ended), starts a
// stream there: one ranged GET of Limits.MinRequest bytes (more for a
// larger read), whose body is read into pieces as it arrives, only so far
// ahead of its readers, and which fetches nothing reads were already given
// (pace.go). Reads inside
// a stream (small ones included) are served from its pieces as soon as
// their bytes are in, waiting for them otherwise (a large read waiting
// at the stream's frontier lends it its buffer instead: lend.go); the block cache's
// read-ahead, reading past a stream's end, starts the next. A read
// elsewhere is a plain ranged GET (a small one through a window) and, when
// large, moves the frontier.
//
// Memory: the pieces held are bounded by Limits.AheadMemory across the
// tree, a stream's by a minStreams-th of it (so that the objects read in
// turn each have their next bytes in): a stream whose next piece finds no
// room stops reading its body until pieces are given back, unless a reader
// waits on it (then it goes over by that piece, maxStreams pieces at most
// across the tree). A piece is given back once reads took all of it but a
// window's worth (bytes no reader asks for) and went on past it. A stream
// untouched while the tree started staleAfter × maxStreams others may be
// dropped (its request canceled) to make room; a read that finds the tree
// at maxStreams and none stale is a plain GET. Piece buffers are reused.
//
// A zip archive (a torch.save record at an object's start) is read from
// its directory at its end, then its entries' local headers at its start,
// then its data after them: the headers' small read, when the object's
// first one past the first window came before it, starts a tentative
// stream at 0 instead of a window's GET. It reads a window's worth of its
// body, and past that only what waiting readers ask for (a large data.pkl),
// until a read of data (firstRead bytes or more) lets it go on as any
// stream; none within tentativeFor ends it, what it read kept and the
// frontier where its bytes end (so a later read there starts the next
// stream). A safetensors header (the object's first read is at its start)
// starts none, as before.
//
// Errors: a stream's attempt cut short is resumed from where its body
// stopped, with the same pin and checks (file.readTo); a stream that failed
// for good fails the reads waiting past what it delivered with its error
// (a changed object: ErrChanged; never bytes of two versions), and the
// object's frontier is set past reach, so that later reads are plain ones
// until a large one sets it again.
type aheads struct {
	request, memory int64

	mu    sync.Mutex
	used  int64         // GUARDED_BY(mu); bytes of the streams' piece buffers, not given back
	lru   list.List     // GUARDED_BY(mu); *stream, the most recently used first
	tick  uint64        // GUARDED_BY(mu); streams started so far
	free  [][]byte      // GUARDED_BY(mu); piece buffers for the next pieces
	freeN int64         // GUARDED_BY(mu); their bytes
	room  chan struct{} // GUARDED_BY(mu); closed when pieces are given back

	// Bytes read straight into readers' buffers (lend.go), and copied to
	// readers out of pieces.
	lentBytes, copiedBytes atomic.Int64
}

const (
	// staleAfter: see aheads.
	staleAfter = 4
	// minStreams is the streams the memory is shared by at least: the
	// shard objects of a 4-rank checkpoint, read in turn.
	minStreams = 4
	// pieceSize is the unit a stream's body is read in, handed to readers
	// and given back.
	pieceSize = 1 << 20
	// An object's first read starts a stream when it is at least
	// firstRead bytes (or a request): a read of data, not of a header (a
	// safetensors header, tens of KiB, is read at each open of an
	// HF-sharded view, one object after another, and a stream for each
	// would fetch megabytes for kilobytes).
	firstRead = 1 << 20
	// failMemory is how long a stream's failure fails the reads that go
	// past what it delivered, as the block cache serves a failed fill's
	// error again (cache's failMemory).
	failMemory = time.Second
)

// tentativeFor is how long a tentative stream waits for a large read (see
// aheads): a record's data is read right after its headers. A variable for
// tests.
var tentativeFor = 2 * time.Second

// stream is bytes [start, end) of an object: one request, its body read
// into pieces as it arrives.
type stream struct {
	f          *file
	start, end int64
	ctx        context.Context // its request's: canceled when dropped, or with the tree's
	cancel     context.CancelFunc
	elem       *list.Element // GUARDED_BY(aheads.mu); nil once dropped

	// GUARDED_BY(aheads.mu):
	pieces   [][]byte // by index from start; nil: not in yet, or given back
	gone     []bool   // pieces given back
	taken    []int64  // bytes of each piece reads took
	arrived  int64    // bytes [start, arrived) are in
	held     int64    // bytes of its piece buffers not given back
	refs     int      // readers copying from it
	waiters  int      // readers waiting for its bytes
	touched  uint64   // aheads.tick when last read
	done     bool     // the request ended
	paused   bool     // its body waits for memory
	err      error    // why, when it failed
	failedAt time.Time
	// tentative: it reads its first window, then up to need, and waits
	// until expires for a read of data (see aheads); expired: none came.
	tentative, expired bool
	expires            time.Time
	need               int64    // the end of what readers waiting on it asked for
	retired            [][]byte // buffers given back while refs > 0
	lends              []*lend  // readers' buffers the body goes into, by offset (lend.go)
	lentSpans          []span   // bytes that went to lends, in no piece; in order
	wake               chan struct{}
	pace               // how far ahead its body is read (pace.go)

	// The body being read, owned by fetch's goroutine: the piece it goes
	// into (set and cleared with aheads.mu held), where that starts and how
	// far it is filled.
	cur   []byte
	curAt int64
	curN  int
	a     *aheads
}

func newAheads(l Limits) *aheads {
	return &aheads{request: l.MinRequest, memory: l.AheadMemory, room: make(chan struct{})}
}

// afterFailure is the frontier of an object whose stream failed: no
// stream starts until a plain large read sets it again.
const afterFailure = math.MaxInt64

// errGone is a stream that no longer holds the bytes asked for: the read
// looks again (another stream, or a plain GET).
var errGone = errors.New("objstore: stream gone")

// read serves p at off from streams, starting one when the read follows
// the object's frontier; ok is false when it did not take the read (then it
// is a plain one, which the caller reads).
func (a *aheads) read(f *file, p []byte, off int64) (n int, ok bool, err error) {
	if a.request <= 0 || a.memory < a.request {
		return 0, false, nil
	}
	large := len(p) > smallRead
	for tries := 0; n < len(p); {
		at := off + int64(n)
		s, ahead := a.streamFor(f, at, int64(len(p)-n), large, n == 0)
		if s == nil || tries > 2 {
			if s != nil {
				a.release(s, at, 0, false)
			}
			if n == 0 && ahead == 0 {
				return 0, false, nil
			}
			// The rest of a read that began in a stream, or the part of one
			// before the stream that holds the rest.
			k := len(p) - n
			if ahead > 0 && tries <= 2 {
				k = int(ahead)
			}
			m, err := f.read(p[n:n+k], at)
			if large && m > 0 {
				a.mu.Lock()
				f.delivered(at, at+int64(m))
				a.mu.Unlock()
			}
			n += m
			if err != nil || n == len(p) {
				return n, true, err
			}
			continue
		}
		k, err := a.copyFrom(s, p[n:], at, large)
		n += k
		switch {
		case errors.Is(err, errGone):
			tries++
		case err != nil:
			return n, true, err
		}
	}
	return n, true, nil
}

// streamFor returns the stream holding off, or a new one when the read of
// n bytes at off follows the frontier of f (its request sent); nil when the
// read is a plain one: then ahead > 0 when a stream holds the read's bytes
// from off+ahead on. first: off is where a read begins. The caller
// releases the stream.
func (a *aheads) streamFor(f *file, off, n int64, large, first bool) (s *stream, ahead int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range f.streams {
		if s.holds(off) {
			a.lru.MoveToFront(s.elem)
			s.refs++
			s.touched = a.tick
			if first && large {
				a.followed(s, off)
			}
			if s.tentative && n >= firstRead { // a read of data
				s.tentative = false
				a.roomMade()
			}
			return s, 0
		}
	}
	if from := f.next; from < 0 && n >= min(a.request, firstRead) || from >= 0 && off >= from && off-from < a.request {
		if from < 0 {
			from = off
		}
		from = f.pastDelivered(from, off)
		if s := a.start(f, from, off+n); s != nil {
			s.refs++
			return s, 0
		}
	}
	if f.next < 0 && !large && off < windowSize && f.tail {
		// A zip archive's local headers, its directory read: its data
		// follows.
		if s := a.start(f, 0, off+n); s != nil {
			s.tentative, s.expires = true, time.Now().Add(tentativeFor)
			s.refs++
			return s, 0
		}
	}
	if f.next < 0 && !large && off >= windowSize {
		f.tail = true
	}
	for _, s := range f.streams {
		if off < s.start && s.start < off+n && s.holds(s.start) && (ahead == 0 || s.start-off < ahead) {
			ahead = s.start - off
		}
	}
	// A plain read. A large one is where the object's reader is now,
	// unless streams lie beyond it: the frontier stays after them, so that
	// streams never overlap. A small read (a record's directory) says
	// nothing of where a reader is.
	if large {
		a.jumped(f, off)
		beyond := false
		for _, s := range f.streams {
			beyond = beyond || s.end > off
		}
		if !beyond {
			f.next = off + n
		}
	}
	return nil, ahead
}

// holds reports whether s has, or will have, the byte at off.
func (s *stream) holds(off int64) bool {
	if off < s.start || off >= s.end || s.done && off >= s.arrived {
		return false
	}
	i := (off - s.start) / pieceSize
	if s.gone[i] {
		return false
	}
	in, _ := s.lent(off)
	return !in
}

// start sends a stream of f from start to at least MinRequest bytes and
// past want, when the tree has fewer than maxStreams (dropping a stale one
// if need be); the object's frontier moves to its end.
func (a *aheads) start(f *file, start, want int64) *stream {
	end := min(f.info.Size, max(start+a.request, want))
	end = f.undelivered(start, end, want)
	if end <= start || a.lru.Len() >= a.maxStreams() && !a.dropStale() {
		return nil
	}
	k := (end - start + pieceSize - 1) / pieceSize
	a.tick++
	ctx, cancel := context.WithCancel(f.t.requestCtx())
	s := &stream{f: f, start: start, end: end, ctx: ctx, cancel: cancel, a: a, arrived: start, curAt: start,
		pieces: make([][]byte, k), gone: make([]bool, k), taken: make([]int64, k),
		touched: a.tick, wake: make(chan struct{})}
	s.startPace(a.memory / minStreams)
	s.elem = a.lru.PushFront(s)
	f.streams = append(f.streams, s)
	f.next = end
	go a.fetch(ctx, s)
	return s
}

// maxStreams bounds the streams of a tree, each a connection: four for
// each request's worth of memory (the one being read and the next, of two
// objects read in turn, each paused while the memory is full), four more.
func (a *aheads) maxStreams() int { return int(4*max(1, a.memory/a.request)) + 4 }

// dropStale drops the least recently used stream that no reader holds or
// waits on and that went unread while the tree started staleAfter ×
// maxStreams others; false if there is none.
func (a *aheads) dropStale() bool {
	stale := uint64(staleAfter * a.maxStreams())
	for e := a.lru.Back(); e != nil; e = e.Prev() {
		if s := e.Value.(*stream); s.refs == 0 && s.waiters == 0 && a.tick-s.touched >= stale {
			a.drop(s)
			return true
		}
	}
	return false
}

// buffer sets the next piece buffer of s, within AheadMemory: it waits
// while the pieces held fill it, unless a reader waits on s: then s goes
// over by this piece (a reader is never left waiting on memory that only
// later reads would give back; the piece is given back once read), and
// beyond maxStreams pieces over, streams no reader holds are dropped, least
// recently used first. false once s is dropped or its request canceled.
func (a *aheads) buffer(s *stream) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if s.elem == nil {
			return false
		}
		if len(s.lends) > 0 && s.lends[0].off == s.arrived {
			return true // no piece: the body goes into the lend
		}
		for a.used+a.freeN+pieceSize > a.memory && len(a.free) == 0 && a.dropStale() {
		}
		for k := len(a.free); k > 0 && a.used+a.freeN+pieceSize > a.memory; k-- {
			a.freeN -= int64(cap(a.free[k-1]))
			a.free[k-1], a.free = nil, a.free[:k-1]
		}
		if s.held+pieceSize <= a.memory/minStreams && (len(a.free) > 0 || a.used+a.freeN+pieceSize <= a.memory) {
			break
		}
		if s.waiters > 0 {
			over := a.memory + int64(a.maxStreams())*pieceSize
			for e := a.lru.Back(); e != nil && a.used+pieceSize > over; {
				prev := e.Prev()
				if t := e.Value.(*stream); t != s && t.refs == 0 && t.waiters == 0 {
					a.drop(t)
				}
				e = prev
			}
			break
		}
		room := a.room
		s.paused = true
		a.mu.Unlock()
		select {
		case <-room:
		case <-s.ctx.Done(): // the tree closed or drained: the request ends
			a.mu.Lock()
			s.paused = false
			return false
		}
		a.mu.Lock()
		s.paused = false
	}
	s.held += pieceSize
	a.used += pieceSize
	s.placeCur()
	if k := len(a.free); k > 0 {
		s.cur, a.free[k-1], a.free = a.free[k-1][:pieceSize], nil, a.free[:k-1]
		a.freeN -= pieceSize
		return true
	}
	s.cur = make([]byte, pieceSize)
	return true
}

// roomMade wakes the streams waiting for memory. Called with mu held.
func (a *aheads) roomMade() {
	close(a.room)
	a.room = make(chan struct{})
}

// drop forgets s: its request is canceled, its pieces given back.
func (a *aheads) drop(s *stream) {
	if s.elem == nil {
		return
	}
	s.cancel()
	a.lru.Remove(s.elem)
	s.elem = nil
	f := s.f
	for i, t := range f.streams {
		if t == s {
			f.streams = append(f.streams[:i], f.streams[i+1:]...)
			break
		}
	}
	for i := range s.pieces {
		a.giveBack(s, i)
	}
	s.broadcast()
}

// giveBack returns piece i of s; its buffer is reused once no reader
// copies from s (the piece being written is fetch's to give back).
func (a *aheads) giveBack(s *stream, i int) {
	if s.gone[i] {
		return
	}
	s.gone[i] = true
	if b := s.pieces[i]; b != nil {
		s.pieces[i] = nil
		if s.cur == nil || &b[0] != &s.cur[0] {
			s.held -= pieceSize
			a.used -= pieceSize
			s.retired = append(s.retired, b)
		}
	}
	if s.refs == 0 {
		a.recycle(s)
	}
	a.roomMade()
}

// recycle keeps the buffers s gave back, within memory.
func (a *aheads) recycle(s *stream) {
	for _, b := range s.retired {
		if a.used+a.freeN+int64(cap(b)) <= a.memory {
			a.free = append(a.free, b[:0])
			a.freeN += int64(cap(b))
		}
	}
	s.retired = nil
}

// readPast reports whether a stream of f starting at off was read from.
// Called with aheads.mu held.
func (f *file) readPast(off int64) bool {
	for _, t := range f.streams {
		if t.start == off {
			return t.taken[0] > 0
		}
	}
	return false
}

func (s *stream) pieceEnd(i int) int64 { return min(s.end, s.start+int64(i+1)*pieceSize) }

func (s *stream) broadcast() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// copyFrom copies into p the bytes of s from off that are in, waiting for
// the first of them; it releases s.
func (a *aheads) copyFrom(s *stream, p []byte, off int64, large bool) (int, error) {
	a.mu.Lock()
	for s.arrived <= off && !s.done && s.elem != nil {
		if l := a.lendTo(s, p, off, large); l != nil {
			// The body must reach the lend whatever its pace, and goes
			// no further ahead of its readers (pace.go).
			s.need = max(s.need, l.off+int64(len(l.p)))
			readersAhead(s, l)
			if got := a.awaitLend(s, l); got > 0 {
				a.mu.Unlock()
				a.release(s, off, int64(got), large)
				return got, nil
			}
			continue // the body went past: its bytes are in a piece
		}
		wake := s.wake
		s.waiters++
		s.need = max(s.need, min(s.end, off+int64(len(p))))
		a.roomMade() // a stream waiting for memory may go over for this reader
		a.mu.Unlock()
		<-wake
		a.mu.Lock()
		s.waiters--
	}
	if s.arrived <= off || s.elem == nil {
		err := s.err
		a.mu.Unlock()
		a.release(s, off, 0, false)
		if err == nil {
			err = errGone
		}
		return 0, err
	}
	var parts [][]byte
	end := min(off+int64(len(p)), s.arrived)
	for at := off; at < end; {
		i := int((at - s.start) / pieceSize)
		in, next := s.lent(at)
		if s.gone[i] || in {
			break
		}
		from := at - (s.start + int64(i)*pieceSize)
		to := min(end, s.pieceEnd(i), next) - (s.start + int64(i)*pieceSize)
		parts = append(parts, s.pieces[i][from:to])
		at += to - from
	}
	// A read that goes past what a failed stream delivered fails with it
	// for failMemory: the store just failed that range, and asking again
	// would make the read wait for a second request's failure too. Later
	// reads ask again.
	var failed error
	if s.done && end == s.arrived && end < off+int64(len(p)) && end < s.end && time.Since(s.failedAt) < failMemory {
		failed = s.err
	}
	a.mu.Unlock()
	n := 0
	for _, part := range parts {
		n += copy(p[n:], part)
	}
	a.copiedBytes.Add(int64(n))
	a.release(s, off, int64(n), large)
	switch {
	case n == 0:
		return 0, errGone
	case failed != nil && n == int(end-off):
		return n, failed
	}
	return n, nil
}

// release ends a reader's copy of n bytes at off from s: a large read's
// bytes count towards giving pieces back (see aheads), and a read past the
// middle of s starts the stream after it.
func (a *aheads) release(s *stream, off, n int64, large bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s.refs--
	if n > 0 && s.elem != nil {
		first, last := int((off-s.start)/pieceSize), int((off+n-1-s.start)/pieceSize)
		for i := first; i <= last; i++ {
			lo, hi := max(off, s.start+int64(i)*pieceSize), min(off+n, s.pieceEnd(i))
			s.taken[i] += hi - lo
		}
		a.tookFrom(s, off, n)
		if large {
			s.f.delivered(off, off+n)
		}
		// A piece read but for a window's worth (bytes no reader asks for:
		// a zip entry's padding, files of a record the view does not read)
		// is given back once reads went on past it, to the next piece or
		// the stream after this one.
		for i := range s.pieces {
			if s.gone[i] || s.pieceEnd(i) > s.arrived || s.taken[i]+windowSize < s.pieceEnd(i)-(s.start+int64(i)*pieceSize) {
				continue
			}
			if i+1 < len(s.pieces) && s.taken[i+1] > 0 || i+1 == len(s.pieces) && s.f.readPast(s.end) {
				a.giveBack(s, i)
			}
		}
		if s.done && !slices.Contains(s.gone, false) {
			a.drop(s)
		}
	}
	if s.refs == 0 {
		a.recycle(s)
	}
}

// fetch sends the request of s and reads its body into pieces (ReadFrom).
func (a *aheads) fetch(ctx context.Context, s *stream) {
	_, err := s.f.readTo(ctx, s, s.start, s.end-s.start)
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.cur != nil { // a piece begun: kept if handed over, else fetch's to give back
		a.dropCur(s)
	}
	s.finishLends()
	s.done = true
	s.cancel()
	if s.elem != nil {
		// Bytes never to arrive are given back.
		for i := range s.pieces {
			if s.start+int64(i)*pieceSize >= s.arrived {
				a.giveBack(s, i)
			}
		}
		if s.expired { // no failure: the next stream starts where its bytes end
			if s.f.next == s.end {
				s.f.next = s.arrived
			}
		} else if err != nil {
			s.err, s.failedAt = err, time.Now()
			if s.f.next >= s.arrived {
				s.f.next = afterFailure
			}
		}
	}
	s.broadcast()
}

// ReadFrom reads a response body into pieces, handing each over as it is
// filled (or as far as it got when the body ends early): called by
// Store.Read through CopyBody, once per attempt, in fetch's goroutine.
func (s *stream) ReadFrom(r io.Reader) (int64, error) {
	a := s.a
	var total int64
	for s.arrived < s.end { // arrived: written only in this goroutine
		if l := a.lendAt(s); l != nil {
			k, err := a.readLent(s, l, r)
			total += k
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return total, nil // CopyBody tells a short body
			}
			if err != nil {
				return total, err
			}
			continue
		}
		// Paced first, then a piece: a stream waiting for its readers
		// holds no piece buffer, and a lend that comes meanwhile needs
		// none.
		if !a.mayRead(s) {
			return total, context.Canceled
		}
		if s.cur == nil && !a.buffer(s) {
			return total, context.Canceled
		}
		if s.cur == nil {
			continue // a lend at the frontier: no piece
		}
		want := int(min(s.end, s.curAt+pieceSize) - s.curAt)
		k, err := io.ReadFull(r, s.cur[s.curN:a.pieceLimit(s, want)])
		s.curN += k
		total += int64(k)
		if k > 0 {
			a.mu.Lock()
			if s.elem == nil {
				a.mu.Unlock()
				return total, context.Canceled
			}
			s.publish()
			if s.curN == want {
				s.cur, s.curAt = nil, s.curAt+int64(want)
			}
			a.mu.Unlock()
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return total, nil // CopyBody tells a short body
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// limit is how far the current piece of s is read before the body waits:
// for a tentative stream, its first window and what waiting readers asked
// for; else want.
func (a *aheads) limit(s *stream, want int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(min(int64(want), max(int64(s.curN), s.reach()-s.curAt)))
}

// reach is where s may read its body to: a tentative stream, its first
// window and what waiting readers ask for; else see pace.go. Called with
// mu held.
func (s *stream) reach() int64 {
	if s.tentative {
		return max(s.need, s.start+windowSize)
	}
	return s.paceReach()
}

// mayRead waits while s has read all it may (reach; false once
// it expires or is dropped: an expired stream's request is canceled, not
// failed). Called in fetch's goroutine, whose the current piece is.
func (a *aheads) mayRead(s *stream) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if s.arrived < s.reach() {
			return true
		}
		if s.elem == nil || s.ctx.Err() != nil {
			return false
		}
		var expire <-chan time.Time
		var timer *time.Timer
		if s.tentative {
			left := time.Until(s.expires)
			if left <= 0 {
				s.expired = true
				s.cancel()
				return false
			}
			timer = time.NewTimer(left)
			expire = timer.C
		}
		room := a.room
		s.paused = true
		a.mu.Unlock()
		select {
		case <-room: // promoted, a reader waiting or back, or memory given back: look again
		case <-s.ctx.Done():
		case <-expire:
		}
		if timer != nil {
			timer.Stop()
		}
		a.mu.Lock()
		s.paused = false
	}
}

// Write is ReadFrom for a store that writes.
func (s *stream) Write(b []byte) (int, error) {
	n, err := s.ReadFrom(&onceReader{b: b})
	return int(n), err
}

type onceReader struct{ b []byte }

func (r *onceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// publish hands the filled part of the current piece to readers. Called
// with aheads.mu held.
func (s *stream) publish() {
	s.pieces[(s.curAt-s.start)/pieceSize] = s.cur
	s.arrived = s.curAt + int64(s.curN)
	s.broadcast()
}
