package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testBS = 1024

// memSource is a deterministic in-memory Source that counts ReadAt calls per
// block (of testBS bytes) and can hold or fail chosen blocks.
type memSource struct {
	data  []byte
	bs    int64
	calls []atomic.Int64

	mu    sync.Mutex
	gate  map[int64]chan struct{} // GUARDED_BY(mu); ReadAt of a block in gate waits for close
	fail  map[int64]error         // GUARDED_BY(mu)
	enter chan int64              // block index on each ReadAt entry (non-blocking send)
}

func newMemSource(size int64, seed uint64) *memSource {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return &memSource{
		data:  data,
		bs:    testBS,
		calls: make([]atomic.Int64, size/testBS+1),
		gate:  map[int64]chan struct{}{},
		fail:  map[int64]error{},
		enter: make(chan int64, 1024),
	}
}

// fetchedTwice lists the blocks read from s more than once.
func (s *memSource) fetchedTwice() []int {
	var twice []int
	for b := range s.calls {
		if s.calls[b].Load() > 1 {
			twice = append(twice, b)
		}
	}
	return twice
}

func (s *memSource) ReadAt(p []byte, off int64) (int, error) {
	idx := off / s.bs
	s.calls[idx].Add(1)
	select {
	case s.enter <- idx:
	default:
	}
	s.mu.Lock()
	g, err := s.gate[idx], s.fail[idx]
	s.mu.Unlock()
	if g != nil {
		<-g
	}
	if err != nil {
		return 0, err
	}
	return bytes.NewReader(s.data).ReadAt(p, off)
}

// waitEnter waits until a ReadAt of block idx has started.
func (s *memSource) waitEnter(idx int64) {
	for b := <-s.enter; b != idx; b = <-s.enter {
	}
}

// hold makes reads of the blocks wait until the returned release is called.
func (s *memSource) hold(idx ...int64) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	for _, i := range idx {
		s.gate[i] = ch
	}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			for _, i := range idx {
				delete(s.gate, i)
			}
			s.mu.Unlock()
			close(ch)
		})
	}
}

func (s *memSource) setFail(idx int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.fail, idx)
	} else {
		s.fail[idx] = err
	}
}

// want is what os.File.ReadAt would return on the source bytes.
func want(data []byte, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if off >= int64(len(data)) {
		return 0, io.EOF
	}
	n := copy(p, data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func newTestCache(t testing.TB, o Options) *Cache {
	t.Helper()
	if o.BlockSize == 0 {
		o.BlockSize = testBS
	}
	if o.Size == 0 {
		o.Size = 64 * o.BlockSize // keeps ristretto's counters small
	}
	c, err := New(o)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// checkRead reads [off, off+n) through h and compares with the source.
func checkRead(t testing.TB, h *Handle, data []byte, off int64, n int) {
	t.Helper()
	got := make([]byte, n)
	wantBuf := make([]byte, n)
	gn, gerr := h.ReadAt(got, off)
	wn, werr := want(data, wantBuf, off)
	require.Equal(t, wn, gn, "n at off=%d len=%d", off, n)
	require.Equal(t, werr, gerr, "err at off=%d len=%d", off, n)
	require.True(t, bytes.Equal(wantBuf[:wn], got[:gn]), "bytes at off=%d len=%d", off, n)
}

func TestReadAtMatchesSource(t *testing.T) {
	const size = 10*testBS + 123 // short tail block
	src := newMemSource(size, 1)
	for _, ra := range []int{0, 3} {
		c := newTestCache(t, Options{Size: 4 * testBS, ReadAhead: ra, Staging: 2})
		h := c.Open(1, src, size)
		// Edges: tail block, exact end, past end, empty reads, whole file.
		edges := []struct {
			off int64
			n   int
		}{
			{0, 0}, {0, 1}, {0, testBS}, {testBS - 1, 2}, {size - 123, 123}, {size - 1, 1},
			{size - 1, 10}, {size - 123, 5 * testBS}, {size, 1}, {size, 0}, {size + 5, 10},
			{0, size}, {0, size + 100}, {3*testBS + 5, 4 * testBS},
		}
		for _, e := range edges {
			checkRead(t, h, src.data, e.off, e.n)
		}
		r := rand.New(rand.NewPCG(2, 2))
		for range 500 {
			off := r.Int64N(size + 2*testBS)
			n := r.IntN(3*testBS + 1)
			checkRead(t, h, src.data, off, n)
		}
		n, err := h.ReadAt(make([]byte, 4), -1)
		assert.Zero(t, n)
		assert.Error(t, err)
		h.Close()
	}
}

// TestSlicesMatchReadAt: the zero-copy reads hand out the same bytes and
// errors as ReadAt, at block edges, the tail and past the end.
func TestSlicesMatchReadAt(t *testing.T) {
	const size = 10*testBS + 123
	src := newMemSource(size, 3)
	c := newTestCache(t, Options{Size: 4 * testBS, ReadAhead: 2, Staging: 2})
	h := c.Open(1, src, size)
	defer h.Close()
	r := rand.New(rand.NewPCG(4, 4))
	cases := [][2]int64{{0, 0}, {0, testBS}, {testBS - 1, 2}, {size - 1, 10}, {size, 1}, {size + 5, 3}, {0, size + 100}}
	for range 300 {
		cases = append(cases, [2]int64{r.Int64N(size + testBS), r.Int64N(3*testBS + 1)})
	}
	for _, tc := range cases {
		off, n := tc[0], int(tc[1])
		buf := make([]byte, n)
		wn, werr := want(src.data, buf, off)
		pinned, err := h.Slices(context.Background(), off, n)
		require.Equal(t, werr, err, "err at off=%d len=%d", off, n)
		require.True(t, bytes.Equal(buf[:wn], bytes.Join(pinned.Parts, nil)), "bytes at off=%d len=%d", off, n)
		require.Equal(t, wn, pinned.Len())
		if wn > 0 {
			require.Len(t, pinned.Parts, int((off+int64(wn)-1)/testBS-off/testBS+1), "one slice per block touched")
		}
		pinned.Release()
		pinned.Release() // idempotent
	}
	_, err := h.Slices(context.Background(), -1, 4)
	assert.Error(t, err)
}

func init() {
	// A read through a block after its last release sees 0xA5 bytes, which
	// every byte comparison in these tests catches.
	poisonFreed = true
}

// TestPinnedBytesSurviveEviction: bytes handed out by Slices stay the
// block's bytes while pinned, however many fills reuse buffers meanwhile;
// once released, their buffers are reused.
func TestPinnedBytesSurviveEviction(t *testing.T) {
	const size = 64 * testBS
	src := newMemSource(size, 30)
	c := newTestCache(t, Options{Size: 4 * testBS, Staging: 1, MaxFills: 2})
	h := c.Open(1, src, size)
	defer h.Close()
	pinned, err := h.Slices(context.Background(), testBS/2, 2*testBS)
	require.NoError(t, err)
	for off := int64(3 * testBS); off < size; off += testBS {
		checkRead(t, h, src.data, off, testBS) // evicts and refills, reusing buffers
		c.Wait()                               // ristretto lets go of its blocks asynchronously
	}
	require.True(t, bytes.Equal(src.data[testBS/2:testBS/2+2*testBS], bytes.Join(pinned.Parts, nil)),
		"pinned bytes changed under eviction")
	reused := c.Stats().BuffersReused
	assert.Positive(t, reused, "fills reuse the buffers of evicted blocks")
	pinned.Release()
	for off := int64(0); off < size; off += testBS {
		checkRead(t, h, src.data, off, testBS)
		c.Wait()
	}
	assert.Greater(t, c.Stats().BuffersReused, reused)
}

// TestBlockRefsRefuseDead: a dead block is never handed out again, and an
// over-release stops the process instead of letting a buffer serve two
// blocks.
func TestBlockRefsRefuseDead(t *testing.T) {
	bufs := &buffers{size: 4, limit: 8}
	b := &block{data: []byte{1, 2, 3, 4}, bufs: bufs}
	b.refs.Store(1)
	require.True(t, b.acquire())
	b.release()
	b.release()
	assert.False(t, b.acquire(), "a dead block cannot be acquired")
	assert.Equal(t, []byte{0xA5, 0xA5, 0xA5, 0xA5}, b.data, "its buffer went back to the pool")
	assert.EqualValues(t, 4, bufs.freeBytes.Load())
	assert.Panics(t, b.release)
	assert.Panics(t, b.retain)
}

// TestBuffersKeepWithinLimit: buffers kept for reuse, bytes being filled,
// staged and cached together stay within the limit: a fresh buffer only
// while there is room (or when the reserve pays), a kept one always, and a
// short block takes a kept buffer.
func TestBuffersKeepWithinLimit(t *testing.T) {
	p := &buffers{size: 4, limit: 12}
	var got [][]byte
	for range 3 {
		buf, ok := p.get(4, false)
		require.True(t, ok)
		got = append(got, buf)
	}
	_, ok := p.get(3, false)
	assert.False(t, ok, "no room for a fourth buffer")
	forced, ok := p.get(3, true)
	require.True(t, ok, "the reserve pays")
	p.filled(forced)
	p.put(forced) // not a full block's: to the GC
	assert.EqualValues(t, 12, p.gauges().sum())
	p.add(&p.staged, 4) // got[0] filled and staged
	p.filled(got[0])
	p.add(&p.staged, -4)
	p.put(got[0]) // 2 filling + 1 free
	assert.EqualValues(t, 4, p.freeBytes.Load())
	p.add(&p.cached, 4) // got[1] filled and cached
	p.filled(got[1])
	p.add(&p.cached, -4)
	p.put(got[1])
	p.filled(got[2])
	p.put(got[2])
	assert.EqualValues(t, 12, p.freeBytes.Load())
	p.add(&p.cached, 4)
	p.put(make([]byte, 4)) // would pass the limit
	assert.EqualValues(t, 12, p.freeBytes.Load())
	p.add(&p.cached, -4)
	short, ok := p.get(3, false)
	require.True(t, ok)
	assert.Len(t, short, 3)
	assert.Equal(t, 4, cap(short), "a short block takes a kept buffer")
	assert.EqualValues(t, 1, p.reused.Load())
	assert.Equal(t, account{filling: 4, free: 8}, p.gauges())
}

// TestPinnedReadersUnderChurn: many readers, half of them holding what
// Slices gave them for a while before checking it, against a cache of a
// few blocks, so that blocks die and their buffers are reused all the time.
func TestPinnedReadersUnderChurn(t *testing.T) {
	const size = 48*testBS + 5
	srcs := []*memSource{newMemSource(size, 40), newMemSource(size, 41)}
	c := newTestCache(t, Options{Size: 6 * testBS, ReadAhead: 2, Workers: 2, Staging: 1, MaxFills: 2})
	readers(c, srcs, 32, 9, func(g int, s *memSource, h *Handle, r *rand.Rand) {
		for range 150 {
			off := r.Int64N(size)
			n := 1 + r.IntN(3*testBS)
			exp := make([]byte, n)
			wn, _ := want(s.data, exp, off)
			if g%2 == 0 {
				got := make([]byte, n)
				if k, _ := h.ReadAt(got, off); k != wn || !bytes.Equal(got[:k], exp[:wn]) {
					t.Errorf("reader %d: ReadAt(%d, %d) wrong", g, n, off)
					return
				}
				continue
			}
			pinned, err := h.Slices(context.Background(), off, n)
			if err != nil && !errors.Is(err, io.EOF) {
				t.Errorf("reader %d: Slices(%d, %d): %v", g, off, n, err)
				return
			}
			runtime.Gosched()
			if r.IntN(4) == 0 {
				time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
			}
			ok := bytes.Equal(bytes.Join(pinned.Parts, nil), exp[:wn])
			pinned.Release()
			if !ok {
				t.Errorf("reader %d: Slices(%d, %d) bytes changed while pinned", g, off, n)
				return
			}
		}
	})
	c.Wait()
	st := c.Stats()
	assert.Positive(t, st.BuffersReused)
	assert.Zero(t, st.FillErrors)
	t.Logf("%d fills, %d into reused buffers", st.Fills, st.BuffersReused)
}

// readers runs n concurrent readers, reader g with a handle on srcs[g %
// len(srcs)] (file id g % len(srcs)) and its own random source, and waits
// for them.
func readers(c *Cache, srcs []*memSource, n int, seed uint64, read func(g int, s *memSource, h *Handle, r *rand.Rand)) {
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			s := srcs[g%len(srcs)]
			h := c.Open(uint64(g%len(srcs)), s, int64(len(s.data)))
			defer h.Close()
			read(g, s, h, rand.New(rand.NewPCG(uint64(g), seed)))
		})
	}
	wg.Wait()
}

func TestConcurrentReaders(t *testing.T) {
	const size = 40*testBS + 77
	srcs := []*memSource{newMemSource(size, 10), newMemSource(size, 11)}
	// The cache holds a tenth of the data, so blocks are evicted and refilled
	// while others read them.
	c := newTestCache(t, Options{Size: 8 * testBS, ReadAhead: 2, Workers: 2, Staging: 4})
	readers(c, srcs, 64, 3, func(g int, s *memSource, h *Handle, r *rand.Rand) {
		off := r.Int64N(size)
		for range 100 {
			if r.IntN(2) == 0 { // half sequential, half random
				off = r.Int64N(size + testBS)
			}
			n := r.IntN(2*testBS + 1)
			got := make([]byte, n)
			exp := make([]byte, n)
			gn, gerr := h.ReadAt(got, off)
			wn, werr := want(s.data, exp, off)
			if gn != wn || gerr != werr || !bytes.Equal(got[:gn], exp[:wn]) {
				t.Errorf("reader %d: ReadAt(%d, %d) = %d, %v; want %d, %v (or bytes differ)", g, n, off, gn, gerr, wn, werr)
				return
			}
			off += int64(gn)
		}
	})
	c.Wait()
	st := c.Stats()
	assert.LessOrEqual(t, st.CachedBytes, int64(8*testBS), "ristretto holds at most Size bytes")
	assert.Zero(t, st.OpenHandles)
	assert.Zero(t, st.FillErrors)
}

func TestConcurrentMissesShareOneFill(t *testing.T) {
	const size = 4 * testBS
	src := newMemSource(size, 4)
	release := src.hold(1)
	defer release()
	c := newTestCache(t, Options{})
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := c.Open(9, src, size)
			defer h.Close()
			checkRead(t, h, src.data, testBS+10, 100)
		}()
	}
	src.waitEnter(1)
	// Let the other readers pile up behind the fill (if some come late,
	// they find the block in the cache, which is just as good).
	require.Eventually(t, func() bool { return c.Stats().Misses == n }, 5*time.Second, time.Millisecond)
	release()
	wg.Wait()
	assert.EqualValues(t, 1, src.calls[1].Load(), "one fill for %d concurrent misses", n)
	st := c.Stats()
	assert.EqualValues(t, 1, st.Fills)
	assert.EqualValues(t, n*100, st.BytesServed)
}

func TestFailedFillCachesNothing(t *testing.T) {
	defer func(d time.Duration) { failMemory = d }(failMemory)
	failMemory = 20 * time.Millisecond
	const size = 4*testBS + 5
	src := newMemSource(size, 5)
	boom := errors.New("boom")
	src.setFail(4, boom)
	release := src.hold(4)
	c := newTestCache(t, Options{})

	h := c.Open(2, src, size)
	checkRead(t, h, src.data, 3*testBS, 10) // block 3 cached: 1 miss

	// Every waiter of the failing fill gets the error, after the bytes of
	// block 3 that precede it.
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			h := c.Open(2, src, size)
			defer h.Close()
			got, err := h.ReadAt(make([]byte, 10), 4*testBS-5) // spans blocks 3 and 4
			if got != 5 {
				err = fmt.Errorf("read %d bytes before the failing block, want 5 (%w)", got, err)
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return c.Stats().Misses == 1+n }, 5*time.Second, time.Millisecond)
	time.Sleep(5 * time.Millisecond) // let the last ones get from Misses++ into the shared fill
	release()
	for range n {
		err := <-errs
		require.ErrorIs(t, err, boom)
		var fe *FillError
		require.ErrorAs(t, err, &fe)
		assert.EqualValues(t, 2, fe.ID)
		assert.EqualValues(t, 4, fe.Block)
		assert.EqualValues(t, 4*testBS, fe.Off)
		assert.EqualValues(t, 5, fe.Len)
	}
	c.Wait()
	// Normally 1; a reader that reached the fill after it failed retried it
	// (and failed too): what matters is that no failure was shared as data.
	assert.Equal(t, src.calls[4].Load(), c.Stats().FillErrors)
	assert.LessOrEqual(t, src.calls[4].Load(), int64(2))
	_, _, ok := c.lookup(&h.f, 4)
	assert.False(t, ok, "a failed fill caches nothing")

	// A later read (once the failure is no longer recent) retries and
	// succeeds.
	src.setFail(4, nil)
	time.Sleep(failMemory)
	before := src.calls[4].Load()
	checkRead(t, h, src.data, 4*testBS-5, 10)
	assert.Equal(t, before+1, src.calls[4].Load())
}

// The kernel reads a page again at once when the read-ahead that held it
// failed: that read fails without asking the Source again (a store that is
// down would otherwise take twice its retry budget to fail a read), and
// once the failure is failMemory old the Source is asked again. A failure
// of ckptfs's own read-ahead fails no foreground read.
func TestFailedFillFailsAgainBriefly(t *testing.T) {
	defer func(d time.Duration) { failMemory = d }(failMemory)
	failMemory = 200 * time.Millisecond
	const size = 4 * testBS
	src := newMemSource(size, 6)
	boom := errors.New("boom")
	src.setFail(1, boom)
	c := newTestCache(t, Options{})
	h := c.Open(3, src, size)

	_, err := h.ReadAt(make([]byte, 10), testBS)
	require.ErrorIs(t, err, boom)
	require.EqualValues(t, 1, src.calls[1].Load())
	src.setFail(1, nil) // the store is back, but the failure is recent
	_, err = h.ReadAt(make([]byte, 10), testBS)
	require.ErrorIs(t, err, boom)
	assert.EqualValues(t, 1, src.calls[1].Load(), "the recent failure is served, the Source not asked")
	other := c.Open(4, src, size) // another file's block 1 is not that block
	checkRead(t, other, src.data, testBS, 10)

	time.Sleep(failMemory)
	checkRead(t, h, src.data, testBS, 10)
	assert.EqualValues(t, 3, src.calls[1].Load())

	// A read-ahead fill that fails is not remembered.
	src.setFail(2, boom)
	require.True(t, c.stg.reserve())
	_, _, err = c.fill(&h.f, 2, h)
	require.ErrorIs(t, err, boom)
	src.setFail(2, nil)
	checkRead(t, h, src.data, 2*testBS, 10)
}

// shortSource returns fewer bytes than asked with a nil error.
type shortSource struct{}

func (shortSource) ReadAt(p []byte, off int64) (int, error) { return len(p) / 2, nil }

func TestShortFillIsError(t *testing.T) {
	c := newTestCache(t, Options{})
	h := c.Open(1, shortSource{}, 3*testBS)
	_, err := h.ReadAt(make([]byte, 10), 0)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, _, ok := c.lookup(&h.f, 0)
	assert.False(t, ok)
}

func TestReadAheadPrefetchesSequential(t *testing.T) {
	const size = 8 * testBS
	src := newMemSource(size, 6)
	c := newTestCache(t, Options{ReadAhead: 2, Workers: 1})
	h := c.Open(1, src, size)
	defer h.Close()

	checkRead(t, h, src.data, 0, 100)
	c.Wait()
	assert.Zero(t, c.Stats().ReadAheadIssued, "a first read is not sequential")
	checkRead(t, h, src.data, 100, testBS-100) // a run of one block: prefetch block 1 only
	c.Wait()
	st := c.Stats()
	assert.EqualValues(t, 1, st.ReadAheadIssued)
	assert.EqualValues(t, 1, src.calls[1].Load())
	assert.Zero(t, src.calls[2].Load())

	checkRead(t, h, src.data, testBS, testBS) // block 1: a hit; the run is 2 blocks long: window 2
	c.Wait()
	st = c.Stats()
	assert.EqualValues(t, 1, src.calls[1].Load(), "block 1 came from read-ahead")
	assert.EqualValues(t, 1, st.ReadAheadHits)
	assert.EqualValues(t, 3, st.ReadAheadIssued)
	assert.EqualValues(t, 1, src.calls[2].Load())
	assert.EqualValues(t, 1, src.calls[3].Load())

	checkRead(t, h, src.data, 2*testBS, 10) // block 2: a hit; block 4 comes into the window
	c.Wait()
	st = c.Stats()
	assert.EqualValues(t, 2, st.ReadAheadHits)
	assert.EqualValues(t, 4, st.ReadAheadIssued)
	assert.EqualValues(t, 1, src.calls[4].Load())

	checkRead(t, h, src.data, testBS+300, 10) // block 1 again: not a second read-ahead hit
	assert.EqualValues(t, 2, c.Stats().ReadAheadHits)
	for b := 5; b < 8; b++ {
		assert.Zero(t, src.calls[b].Load(), "block %d", b)
	}
}

func TestSequentialDetection(t *testing.T) {
	type read struct{ off, n int64 }
	for _, tc := range []struct {
		name  string
		reads []read
		want  []int64 // blocks filled by read-ahead
	}{
		{"first read", []read{{0, 10}}, nil},
		// A loader touching the first pages of a tensor long before it
		// reads the rest: nothing is read ahead for it.
		{"a run shorter than a block", []read{{0, 10}, {10, testBS / 2}}, nil},
		{"a run of a block", []read{{0, 10}, {10, testBS}}, []int64{2}},
		{"same block backwards", []read{{500, 10}, {100, testBS}}, []int64{2}},
		{"next block", []read{{500, 10}, {testBS + 700, testBS}}, []int64{3}},
		{"jump", []read{{0, 10}, {5 * testBS, testBS}}, nil},
		{"spanning read", []read{{0, 10}, {10, 2 * testBS}}, []int64{3, 4}},
		{"end of file", []read{{12 * testBS, 10}, {12*testBS + 10, 2 * testBS}}, []int64{15}},
		{"seek then stream", []read{{0, 10}, {10, testBS}, {5 * testBS, 10}, {5*testBS + 10, testBS}}, []int64{2, 7}},
		{"long run ramps up", []read{{0, 10}, {10, testBS}, {10 + testBS, testBS}}, []int64{3, 4}},
		// Two threads copying halves of one mapped tensor: each stream
		// keeps its own run.
		{"interleaved streams", []read{{0, 10}, {4 * testBS, 10}, {10, testBS}, {4*testBS + 10, testBS}}, []int64{2, 6}},
		{"four streams are kept", []read{{0, 10}, {4 * testBS, 10}, {8 * testBS, 10}, {12 * testBS, 10},
			{10, testBS}}, []int64{2}},
		{"a fifth stream replaces the oldest", []read{{0, 10}, {4 * testBS, 10}, {8 * testBS, 10}, {12 * testBS, 10},
			{14 * testBS, 10}, {10, testBS}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 16 * testBS
			src := newMemSource(size, 7)
			c := newTestCache(t, Options{ReadAhead: 2, Workers: 1})
			h := c.Open(1, src, size)
			for _, r := range tc.reads {
				checkRead(t, h, src.data, r.off, int(r.n))
				c.Wait()
			}
			read := map[int64]bool{}
			for _, r := range tc.reads {
				for b := r.off / testBS; b <= (r.off+r.n-1)/testBS; b++ {
					read[b] = true
				}
			}
			var got []int64
			for b := range int64(16) {
				if src.calls[b].Load() > 0 && !read[b] {
					got = append(got, b)
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReadAheadDroppedWhenQueueFull(t *testing.T) {
	const size = 16 * testBS
	src := newMemSource(size, 8)
	release := src.hold(5, 6, 7, 8)
	defer release()
	c := newTestCache(t, Options{ReadAhead: 4, Workers: 1, QueueSize: 1})
	h := c.Open(1, src, size)
	defer h.Close()

	// A run of 4 blocks opens the full window: blocks 5-8 are offered while
	// the worker is stuck on 5, so one is queued and two are dropped.
	// Foreground reads complete regardless.
	checkRead(t, h, src.data, 0, 100)
	checkRead(t, h, src.data, 100, 4*testBS)
	st := c.Stats()
	assert.EqualValues(t, 4, st.ReadAheadIssued+st.ReadAheadDropped)
	assert.GreaterOrEqual(t, st.ReadAheadDropped, int64(2), "worker busy, queue of 1")

	// The worker is filling block 5; a foreground read of it joins that fill.
	src.waitEnter(5)
	misses := c.Stats().Misses
	done := make(chan struct{})
	go func() {
		defer close(done)
		h2 := c.Open(1, src, size)
		defer h2.Close()
		checkRead(t, h2, src.data, 5*testBS, 10)
	}()
	require.Eventually(t, func() bool { return c.Stats().Misses == misses+1 }, 5*time.Second, time.Millisecond)
	release()
	<-done
	c.Wait()
	assert.EqualValues(t, 1, src.calls[5].Load(), "the foreground read joined the prefetch fill")
	assert.EqualValues(t, 1, c.Stats().ReadAheadHits)
}

func TestReadAheadDroppedWhenForegroundBusy(t *testing.T) {
	const size = 8 * testBS
	src := newMemSource(size, 9)
	c := newTestCache(t, Options{ReadAhead: 2, Workers: 1, BusyFills: 2})
	h := c.Open(1, src, size)
	defer h.Close()
	checkRead(t, h, src.data, 0, 10) // block 0 cached; first read, no prefetch

	release := src.hold(5, 6)
	defer release()
	var wg sync.WaitGroup
	for _, b := range []int64{5, 6} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := c.Open(1, src, size)
			defer h.Close()
			checkRead(t, h, src.data, b*testBS, 10)
		}()
	}
	require.Eventually(t, func() bool { return c.fgFills.Load() == 2 }, 5*time.Second, time.Millisecond)
	checkRead(t, h, src.data, 10, testBS-10) // a run of a block (window 1), but the foreground is busy
	st := c.Stats()
	assert.EqualValues(t, 1, st.ReadAheadDropped)
	assert.Zero(t, st.ReadAheadIssued)
	release()
	wg.Wait()
}

func TestRejectedSetRefills(t *testing.T) {
	const size = 4 * testBS
	src := newMemSource(size, 12)
	// Size below one block: ristretto admits nothing.
	c := newTestCache(t, Options{Size: testBS / 2, Staging: 1})
	h := c.Open(1, src, size)
	checkRead(t, h, src.data, 0, 10)
	checkRead(t, h, src.data, 20, 10) // still in the staging ring
	assert.EqualValues(t, 1, src.calls[0].Load())
	checkRead(t, h, src.data, testBS, 10) // pushes block 0 out of staging
	checkRead(t, h, src.data, 0, testBS)
	c.Wait()
	assert.EqualValues(t, 2, src.calls[0].Load(), "a read after a lost Set refills")
	st := c.Stats()
	assert.Zero(t, st.KeysAdded)
	assert.Zero(t, st.CachedBytes)
}

func TestKeyCollisionsAreMisses(t *testing.T) {
	const size = 6*testBS + 9
	srcs := []*memSource{newMemSource(size, 13), newMemSource(size, 14)}
	c := newTestCache(t, Options{Staging: 1})
	c.keyFn = func(uint64, int64) uint64 { return 42 } // every block on one key
	r := rand.New(rand.NewPCG(5, 5))
	for range 300 {
		i := r.IntN(2)
		h := c.Open(uint64(i), srcs[i], size)
		checkRead(t, h, srcs[i].data, r.Int64N(size), r.IntN(2*testBS))
		h.Close()
		if r.IntN(10) == 0 {
			c.Wait()
		}
	}
}

func TestCloseStopsGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	c, err := New(Options{BlockSize: testBS, Size: 64 * testBS, ReadAhead: 4, Workers: 4})
	require.NoError(t, err)
	const size = 16 * testBS
	src := newMemSource(size, 15)
	h := c.Open(1, src, size)
	for off := int64(0); off < size; off += 300 {
		checkRead(t, h, src.data, off, 300)
	}
	assert.Greater(t, runtime.NumGoroutine(), base)
	c.Close()
	c.Close() // idempotent
	// Poll by hand: assert.Eventually runs its condition on a goroutine.
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > base; {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d before New, %d after Close\n%s", base, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}

	_, err = h.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, ErrClosed)
	c.Wait() // returns after Close
	assert.EqualValues(t, size, c.Stats().BytesServed)
}

func TestCloseWaitsForStuckPrefetch(t *testing.T) {
	const size = 8 * testBS
	src := newMemSource(size, 16)
	release := src.hold(1)
	c, err := New(Options{BlockSize: testBS, Size: 64 * testBS, ReadAhead: 2, Workers: 1, QueueSize: 4})
	require.NoError(t, err)
	h := c.Open(1, src, size)
	checkRead(t, h, src.data, 0, 10)
	checkRead(t, h, src.data, 10, testBS-10) // a run of a block: read-ahead of block 1
	src.waitEnter(1)                         // the worker is filling block 1
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a worker was filling")
	case <-time.After(20 * time.Millisecond):
	}
	release()
	<-closed
}

func TestHandleClose(t *testing.T) {
	c := newTestCache(t, Options{})
	src := newMemSource(testBS, 17)
	h := c.Open(1, src, testBS)
	assert.EqualValues(t, 1, c.Stats().OpenHandles)
	h.Close()
	h.Close()
	assert.Zero(t, c.Stats().OpenHandles)
	_, err := h.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestOptions(t *testing.T) {
	c, err := New(Options{})
	require.NoError(t, err)
	defer c.Close()
	o := c.Options()
	assert.EqualValues(t, DefaultSize, o.Size)
	assert.EqualValues(t, DefaultBlockSize, o.BlockSize)
	assert.Zero(t, o.ReadAhead, "zero ReadAhead disables read-ahead")
	assert.Equal(t, DefaultWorkers, o.Workers)
	d := defaultOptions()
	assert.EqualValues(t, DefaultBlockSize, d.BlockSize)
	assert.Equal(t, DefaultReadAhead, d.ReadAhead)
	_, err = New(Options{Size: -1})
	assert.Error(t, err)
}

func TestStatsJSON(t *testing.T) {
	c := newTestCache(t, Options{})
	src := newMemSource(3*testBS, 18)
	h := c.Open(1, src, 3*testBS)
	checkRead(t, h, src.data, 0, 2*testBS)
	c.Wait()
	b, err := json.Marshal(c.Stats())
	require.NoError(t, err)
	var m map[string]int64
	require.NoError(t, json.Unmarshal(b, &m))
	assert.EqualValues(t, 2*testBS, m["bytes_served"])
	assert.EqualValues(t, 2, m["misses"])
	// Both blocks are in the staging ring, not yet given up to ristretto.
	assert.EqualValues(t, 2*testBS, m["staged_bytes"])
	assert.Zero(t, m["cached_bytes"])
}

func benchData(size int) *memSource {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return &memSource{data: data, bs: DefaultBlockSize, calls: make([]atomic.Int64, size/DefaultBlockSize+1), enter: make(chan int64, 1)}
}

// BenchmarkSequentialRead streams a 64 MiB file in 128 KiB reads (the kernel's
// request size): "cached" fits in the cache, "streaming" does not.
func BenchmarkSequentialRead(b *testing.B) {
	const size, req = 64 << 20, 128 << 10
	src := benchData(size)
	for _, bc := range []struct {
		name string
		size int64
	}{{"cached", 128 << 20}, {"streaming", 16 << 20}} {
		b.Run(bc.name, func(b *testing.B) {
			o := defaultOptions()
			o.Size = bc.size
			c := newTestCache(b, o)
			buf := make([]byte, req)
			b.SetBytes(size)
			b.ResetTimer()
			for i := range b.N {
				id := uint64(0)
				if bc.size < size {
					id = uint64(i) // a new id each pass: never a hit
				}
				h := c.Open(id, src, size)
				for off := int64(0); off < size; off += req {
					if _, err := h.ReadAt(buf, off); err != nil && err != io.EOF {
						b.Fatal(err)
					}
				}
				h.Close()
			}
			b.StopTimer()
			st := c.Stats()
			b.ReportMetric(float64(st.Fills)/float64(b.N), "fills/op")
		})
	}
}

// BenchmarkRandomRead does 128 KiB reads at random offsets of a 64 MiB file
// from parallel goroutines, with the file fully cached.
func BenchmarkRandomRead(b *testing.B) {
	const size, req = 64 << 20, 128 << 10
	src := benchData(size)
	o := defaultOptions()
	c := newTestCache(b, o)
	b.SetBytes(req)
	var seed atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s := seed.Add(1)
		r := rand.New(rand.NewPCG(s, s))
		h := c.Open(0, src, size)
		defer h.Close()
		buf := make([]byte, req)
		for pb.Next() {
			if _, err := h.ReadAt(buf, r.Int64N(size-req)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A read stops waiting for a fill once its context is done (a FUSE
// INTERRUPT, its deadline) and returns the context's cause; the fill goes on
// and serves the next reader, and Close still waits for it.
func TestSlicesStopWaitingWhenContextDone(t *testing.T) {
	const size = 4 * testBS
	src := newMemSource(size, 7)
	release := src.hold(1)
	c := newTestCache(t, Options{})
	h := c.Open(5, src, size)

	late := errors.New("the read's deadline")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 50*time.Millisecond, late)
	defer cancel()
	start := time.Now()
	_, err := h.Slices(ctx, testBS, 10)
	require.ErrorIs(t, err, late)
	assert.Less(t, time.Since(start), 5*time.Second)

	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := h.Slices(ctx, testBS, 10)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // waiting on the fill the first read left running
	cancel()                          // an INTERRUPT
	require.ErrorIs(t, <-done, context.Canceled)

	release()
	pinned, err := h.Slices(context.Background(), testBS, 10)
	require.NoError(t, err)
	assert.Equal(t, src.data[testBS:testBS+10], pinned.Parts[0])
	pinned.Release()
	assert.EqualValues(t, 1, src.calls[1].Load(), "the abandoned fill served the next reader")
}

// defaultOptions are the documented defaults, read-ahead included.
func defaultOptions() Options {
	return Options{Size: DefaultSize, BlockSize: DefaultBlockSize, ReadAhead: DefaultReadAhead, Workers: DefaultWorkers}
}

// No more than maxDetached waits run on after their readers left: past
// that, a reader waits for its fill whatever its context says.
func TestDetachedWaitsAreBounded(t *testing.T) {
	const size = 4 * testBS
	src := newMemSource(size, 8)
	release := src.hold(1)
	c := newTestCache(t, Options{})
	t.Cleanup(release) // before the cache's Close (cleanups run last first), which waits for the fills
	h := c.Open(6, src, size)
	soon := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	// A read whose deadline passed before it got to wait leaves nothing
	// behind (a loaded machine can take a millisecond to get there): read
	// until maxDetached waits run on.
	for i := 0; len(c.detached) < maxDetached; i++ {
		require.Less(t, i, 100*maxDetached, "waits detached: %d", len(c.detached))
		_, err := h.Slices(soon(), testBS, 10)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	done := make(chan error, 1)
	go func() {
		p, err := h.Slices(soon(), testBS, 10)
		if err == nil {
			p.Release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("returned before the fill: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	require.NoError(t, <-done, "with maxDetached waits running on, the reader waited for its fill")
	require.Eventually(t, func() bool { return len(c.detached) == 0 }, 5*time.Second, time.Millisecond)
}
