package objstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// memStore is one object in memory, its reads counted. fail, when set,
// answers the next read at failAt (and is cleared); cutAt cuts a body at
// that offset once (an attempt that ended early); stall holds every read
// until its context ends. version is the object's now: a read of another
// is a *ChangedError.
type memStore struct {
	data  []byte
	delay time.Duration
	count *Counters
	heads atomic.Int64

	mu      sync.Mutex
	fail    error
	failAt  int64
	cutAt   int64
	stall   bool
	version string
	// replaceAtCut, when set, replaces the data (as version v2) as the
	// body is cut at cutAt.
	replaceAtCut []byte
	// gate, when set, holds each body's bytes until it opens past them.
	gate *gate
}

func (m *memStore) obj() Object {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.objLocked()
}

func (m *memStore) objLocked() Object {
	v := m.version
	if v == "" {
		v = "v1"
	}
	return Object{Key: "p/o", Size: int64(len(m.data)), Version: v}
}

func (m *memStore) Head(_ context.Context, key string) (Object, error) {
	m.heads.Add(1)
	m.count.Requests.Add(1)
	if key != "p/o" {
		return Object{}, ErrNotFound
	}
	return m.obj(), nil
}

func (m *memStore) List(_ context.Context, prefix string, _ bool, _ int, _ string) (Page, error) {
	m.count.Requests.Add(1)
	if prefix == "p/" {
		return Page{Objects: []Object{m.obj()}}, nil
	}
	return Page{}, nil
}

func (m *memStore) Read(ctx context.Context, obj Object, w io.Writer, off, n int64) (int64, error) {
	m.count.Requests.Add(1)
	if now := m.obj().Version; obj.Version != now {
		return 0, &ChangedError{Cause: "its ETag is no longer " + obj.Version}
	}
	m.mu.Lock()
	var err error
	if off == m.failAt {
		err, m.fail = m.fail, nil
	}
	end, cut := off+n, false
	if m.cutAt > off && m.cutAt < end {
		end, cut, m.cutAt = m.cutAt, true, 0
	}
	data, stall := m.data, m.stall
	if cut && m.replaceAtCut != nil { // the object is replaced as its body is cut
		m.data, m.version = m.replaceAtCut, "v2"
	}
	m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if stall {
		<-ctx.Done()
		return 0, &AttemptError{Cause: "no response"}
	}
	time.Sleep(m.delay)
	var body io.Reader = bytes.NewReader(data[off:end])
	if m.gate != nil {
		body = &gatedBody{ctx: ctx, g: m.gate, data: data, at: off, end: end}
	}
	got, err := CopyBody(w, body, end-off)
	if cut {
		return got, &AttemptError{Cause: "response body cut"}
	}
	return got, err
}

func aheadTree(t *testing.T, size int, minRequest, memory int64) (*Tree, *memStore, source.File) {
	t.Helper()
	m := &memStore{data: make([]byte, size), count: new(Counters)}
	for i := range m.data {
		m.data[i] = byte(i*7 + i>>13)
	}
	tree, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "p"}, m,
		Limits{MinRequest: minRequest, AheadMemory: memory}, m.count)
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	f, err := tree.Open("o")
	require.NoError(t, err)
	m.count.Requests.Store(0)
	return tree, m, f
}

// records reads an object as a view reads torch.save records stored one
// after the other: each record's directory at its end (small reads), then
// its data, in record order; it returns the requests the reads made.
func records(t *testing.T, m *memStore, f source.File, record int) int64 {
	t.Helper()
	before := m.count.Requests.Load()
	for start := 0; start+record <= len(m.data); start += record {
		dir := make([]byte, 512)
		_, err := f.ReadAt(dir, int64(start+record-1024))
		require.NoError(t, err)
		require.Equal(t, m.data[start+record-1024:start+record-512], dir)
		data := make([]byte, record-2048)
		_, err = f.ReadAt(data, int64(start+1024))
		require.NoError(t, err)
		require.Equal(t, m.data[start+1024:start+record-1024], data, "record at %d", start)
	}
	return m.count.Requests.Load() - before
}

// Records read in order cost a request per MinRequest bytes, their
// directories included (but the first record's directory and data, read
// before a read says where the reader is), and
// each byte is fetched about once; without read-ahead each record is two
// requests (its directory, its data).
func TestAheadReadsRecordsInFewRequests(t *testing.T) {
	const size, record, req = 8 << 20, 256 << 10, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	n := records(t, m, f, record)
	checkHeld(t, tree.ahead)
	assert.LessOrEqual(t, n, int64(size/req+2), "requests")
	assert.LessOrEqual(t, float64(m.count.Bytes.Load()), 1.05*size, "bytes fetched")

	_, m, f = aheadTree(t, size, 0, 0)
	assert.Equal(t, int64(2*size/record), records(t, m, f, record), "requests without read-ahead")
}

// A sequential read of N blocks costs at most ceil(N/k)+1 requests, k the
// blocks in one request, whatever the block size against the request's;
// each byte is fetched once and what the streams hold is all given back.
func TestAheadSequentialBlocksCoalesce(t *testing.T) {
	for _, c := range []struct{ size, block, req int }{
		{16 << 20, 1 << 20, 4 << 20},
		{16<<20 + 12345, 1 << 20, 4 << 20},
		{16 << 20, 3 << 20, 4 << 20}, // blocks straddle requests
		{16 << 20, 128 << 10, 8 << 20},
	} {
		tree, m, f := aheadTree(t, c.size, int64(c.req), int64(2*c.req))
		p := make([]byte, c.block)
		for off := 0; off < c.size; off += c.block {
			k, err := f.ReadAt(p, int64(off))
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
			}
			require.Equal(t, m.data[off:off+k], p[:k], "%+v at %d", c, off)
		}
		blocks := (c.size + c.block - 1) / c.block
		k := max(1, c.req/c.block)
		checkHeld(t, tree.ahead) // and every request ended: its bytes counted
		assert.LessOrEqual(t, m.count.Requests.Load(), int64((blocks+k-1)/k+1), "%+v: requests", c)
		assert.Equal(t, int64(c.size), m.count.Bytes.Load(), "%+v: bytes fetched", c)
	}
}

// Blocks of an object read at once and out of order, as the block cache's
// read-ahead workers read them, get their own bytes; each byte is fetched
// about once and the streams held stay within AheadMemory.
func TestAheadConcurrentOutOfOrder(t *testing.T) {
	const size, block, req, memory = 12 << 20, 512 << 10, 2 << 20, 6 << 20
	tree, m, f := aheadTree(t, size, req, memory)
	m.delay = time.Millisecond
	var wg sync.WaitGroup
	var maxHeld atomic.Int64
	sem := make(chan struct{}, 4) // 4 fills at once, each within a few blocks of the others
	for i := range size / block {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			if i > 0 && rand.N(2) == 0 { // now and then the next block first
				i--
			} else if i+1 < size/block && rand.N(3) == 0 {
				i++
			}
			p := make([]byte, block)
			_, err := f.ReadAt(p, int64(i*block))
			assert.NoError(t, err)
			assert.Equal(t, m.data[i*block:(i+1)*block], p, "block %d", i)
			a := tree.ahead
			a.mu.Lock()
			maxHeld.Store(max(maxHeld.Load(), a.used+a.freeN))
			a.mu.Unlock()
		}(i)
	}
	wg.Wait()
	checkHeld(t, tree.ahead)
	assert.LessOrEqual(t, maxHeld.Load(), int64(memory+tree.ahead.maxStreams()*pieceSize), "streams and kept buffers")
	// The shuffled order reads some blocks twice; each read once would
	// fetch the object once.
	assert.LessOrEqual(t, float64(m.count.Bytes.Load()), 1.6*size, "bytes fetched")
	assert.Less(t, m.count.Requests.Load(), int64(size/block), "fewer requests than blocks")
}

// Reads that jump about are plain requests: nothing is fetched that was
// not asked for.
func TestAheadLeavesScatteredReadsAlone(t *testing.T) {
	const size, req = 16 << 20, 1 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	p := make([]byte, 256<<10)
	for _, off := range []int64{10 << 20, 2 << 20, 14 << 20, 0, 6 << 20} {
		_, err := f.ReadAt(p, off)
		require.NoError(t, err)
		require.Equal(t, m.data[off:off+256<<10], p)
	}
	checkHeld(t, tree.ahead)
	assert.Equal(t, int64(5), m.count.Requests.Load())
	assert.Equal(t, int64(5*256<<10), m.count.Bytes.Load())
}

// A stream whose request fails fails the reads waiting past what it
// delivered with the store's error (a changed object stays ErrChanged); the
// frontier is forgotten, so a later read is a plain one and gets the
// bytes.
func TestAheadFailedStream(t *testing.T) {
	const size, req = 8 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	p := make([]byte, 1<<20)
	m.mu.Lock()
	m.fail, m.failAt = &ChangedError{Cause: "its ETag is no longer \"v1\""}, 0
	m.mu.Unlock()
	_, err := f.ReadAt(p, 0)
	require.ErrorIs(t, err, source.ErrChanged)
	checkHeld(t, tree.ahead)

	_, err = f.ReadAt(p, 1<<20) // plain (a stream failed): sets the frontier
	require.NoError(t, err)
	require.Equal(t, m.data[1<<20:2<<20], p)
	m.mu.Lock()
	m.fail, m.failAt = errors.New("connection reset"), 2<<20 // not an AttemptError: not resumed
	m.mu.Unlock()
	_, err = f.ReadAt(p, 2<<20)
	require.ErrorIs(t, err, ErrRequest)

	_, err = f.ReadAt(p, 2<<20)
	require.NoError(t, err)
	require.Equal(t, m.data[2<<20:3<<20], p)
	checkHeld(t, tree.ahead)
}

// An object replaced while a stream reads it: the bytes before the cut
// are the opened version's, the resumed request finds another version, and
// every read past the cut fails with ErrChanged; no read returns a byte of
// the new version.
func TestAheadChangedMidStream(t *testing.T) {
	const size, req = 8 << 20, 8 << 20
	tree, m, f := aheadTree(t, size, req, 2*req)
	cut := int64(3<<20 + 777)
	old := bytes.Clone(m.data)
	m.mu.Lock()
	m.cutAt = cut
	m.replaceAtCut = bytes.Clone(old)
	for i := range m.replaceAtCut {
		m.replaceAtCut[i] ^= 0xff
	}
	m.mu.Unlock()
	p := make([]byte, 1<<20)
	_, err := f.ReadAt(p, 0) // starts the stream; the body is cut at 3 MiB
	require.NoError(t, err)
	require.Equal(t, old[:1<<20], p)
	checkHeld(t, tree.ahead) // the stream failed
	before := m.count.Requests.Load()
	for off := int64(1 << 20); off < size; off += 1 << 20 {
		n, err := f.ReadAt(p, off)
		if off < cut && cut < off+int64(len(p)) {
			// Past what the failed stream delivered: its error, not a
			// second request.
			assert.Equal(t, before, m.count.Requests.Load(), "at %d", off)
			assert.Equal(t, int(cut-off), n, "at %d", off)
		}
		if off+int64(len(p)) <= cut {
			require.NoError(t, err, "at %d", off)
		} else {
			require.ErrorIs(t, err, source.ErrChanged, "at %d", off)
		}
		require.Equal(t, old[off:off+int64(n)], p[:n], "at %d: only bytes of the version opened", off)
	}
	checkHeld(t, tree.ahead)
}

// A store that stalls: each attempt of the stream ends at its deadline,
// the read fails after MaxAttempts (ErrRequest, not a hang), and closing
// the tree ends a reader waiting on a stalled stream at once.
func TestAheadStalledStreamIsBounded(t *testing.T) {
	const size, req = 4 << 20, 1 << 20
	m := &memStore{data: make([]byte, size), count: new(Counters), stall: true}
	tree, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "p"}, stallDeadline{m, 50 * time.Millisecond},
		Limits{MinRequest: req, AheadMemory: 4 * req, MaxAttempts: 2}, m.count)
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("o")
	require.NoError(t, err)
	start := time.Now()
	_, err = f.ReadAt(make([]byte, 64<<10), 0)
	require.ErrorIs(t, err, ErrRequest)
	assert.Less(t, time.Since(start), 30*time.Second, "two attempts of 50 ms and a backoff")

	tree2, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "p"}, m,
		Limits{MinRequest: req, AheadMemory: 4 * req}, m.count)
	require.NoError(t, err)
	f2, err := tree2.Open("o")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := f2.ReadAt(make([]byte, 64<<10), 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	tree2.Close()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("a reader of a stalled stream still waits after Close")
	}
}

// stallDeadline gives each attempt of a Store its deadline, as the stores'
// SDK clients do.
type stallDeadline struct {
	*memStore
	d time.Duration
}

func (s stallDeadline) Read(ctx context.Context, obj Object, w io.Writer, off, n int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.d)
	defer cancel()
	return s.memStore.Read(ctx, obj, w, off, n)
}

// Headers read at the open of an HF-sharded view (a large read at the
// start of each object, under firstRead bytes) start no stream: each costs
// its request and its bytes only.
func TestAheadHeadersStartNoStream(t *testing.T) {
	const size, req = 4 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	p := make([]byte, firstRead-1)
	_, err := f.ReadAt(p, 8)
	require.NoError(t, err)
	require.Equal(t, m.data[8:8+len(p)], p)
	checkHeld(t, tree.ahead)
	assert.Equal(t, int64(1), m.count.Requests.Load())
	assert.Equal(t, int64(len(p)), m.count.Bytes.Load())
}

// checkHeld checks, with no read under way and every stream's request
// ended or paused for memory, that the bytes reserved add up: each stream held counts what it
// has not given back, the kept buffers are counted once, and all within
// AheadMemory.
func checkHeld(t *testing.T, a *aheads) {
	t.Helper()
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for e := a.lru.Front(); e != nil; e = e.Next() {
			if s := e.Value.(*stream); !s.done && !s.paused {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "streams still being fetched")
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[*byte]bool{}
	own := func(b []byte) {
		if cap(b) == 0 {
			return
		}
		p := &b[:1][0]
		assert.False(t, seen[p], "a buffer held twice")
		seen[p] = true
	}
	var held int64
	for e := a.lru.Front(); e != nil; e = e.Next() {
		s := e.Value.(*stream)
		assert.Zero(t, s.refs)
		assert.Empty(t, s.retired)
		for i, b := range s.pieces {
			own(b)
			assert.False(t, b != nil && s.gone[i], "a piece given back and held")
		}
		held += s.held
	}
	var free int64
	for _, b := range a.free {
		own(b)
		free += int64(cap(b))
	}
	assert.Equal(t, held, a.used, "bytes of the streams held")
	assert.Equal(t, free, a.freeN, "bytes of the buffers kept")
	assert.LessOrEqual(t, a.used+a.freeN, a.memory+int64(a.maxStreams())*pieceSize, "over by a piece a stream at most")
}

// Lookups at open: the names of a directory that fits in a page are
// answered by one listing (no HEAD), a missing name too; a store that
// refuses to list is asked by HEAD; one that does not answer fails the
// Stat naming the name, not the directory.
func TestStatListsOnce(t *testing.T) {
	tree, m, _ := aheadTree(t, 1<<10, 0, 0)
	time.Sleep(DefaultListTTL + 100*time.Millisecond) // the listing of the open is stale
	m.count.Requests.Store(0)
	for range 3 {
		_, err := tree.Stat("o")
		require.NoError(t, err)
		_, err = tree.Stat("missing")
		require.ErrorIs(t, err, fs.ErrNotExist)
	}
	assert.Equal(t, int64(1), m.count.Requests.Load(), "one LIST")
	assert.Equal(t, int64(0), m.heads.Load())

	denied := &listingStore{memStore: m, err: Classified(errors.New("AccessDenied"), source.ErrDenied)}
	tree, err := Open(Location{Scheme: "s3://", Bucket: "b"}, denied, Limits{}, m.count)
	require.NoError(t, err)
	defer tree.Close()
	info, err := tree.Stat("p/o")
	require.NoError(t, err, "a HEAD where the listing is refused")
	assert.Equal(t, int64(1<<10), info.Size)
	assert.Equal(t, int64(1), m.heads.Load())

	denied.err = Classified(errors.New("no answer"), source.ErrUnavailable)
	_, err = tree.Stat("p/other")
	require.ErrorIs(t, err, ErrRequest)
	assert.Contains(t, err.Error(), "s3://b/p/other")
}

// listingStore refuses every listing but the first (Open's) with err.
type listingStore struct {
	*memStore
	err    error
	listed bool
}

func (s *listingStore) List(ctx context.Context, prefix string, delim bool, limit int, token string) (Page, error) {
	if s.listed {
		return Page{}, s.err
	}
	s.listed = true
	return Page{Prefixes: []string{"p/"}}, nil
}

// zipOpen reads an object's first record as torchzip opens a torch.save
// archive: its directory at the end (small reads), then its entries' local
// headers and data.pkl at the start.
func zipOpen(t *testing.T, m *memStore, f source.File, record int) {
	t.Helper()
	for _, r := range []struct{ off, n int }{{record - 1024, 1024}, {record - 1024, 1024}, {record - 600, 300}, {0, 30}, {30, 40}, {600, 30}, {64, 400}} {
		p := make([]byte, r.n)
		_, err := f.ReadAt(p, int64(r.off))
		require.NoError(t, err)
		require.Equal(t, m.data[r.off:r.off+r.n], p, "at %d", r.off)
	}
}

// An object's first record opened, then its data read in blocks: the
// headers at its start are the start of the stream that reads the data,
// not a request of their own: a request per MinRequest bytes and the
// directory's window, each byte fetched about once.
func TestAheadZipHeadersStartTheStream(t *testing.T) {
	defer func(d time.Duration) { tentativeFor = d }(tentativeFor)
	tentativeFor = time.Minute // a loaded machine: the data's read may come late
	const size, record, req, block = 8 << 20, 3<<20 + 5000, 2 << 20, 1 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	zipOpen(t, m, f, record)
	assert.Equal(t, int64(2), m.count.Requests.Load(), "the directory's window, the stream")
	p := make([]byte, block)
	for off := 1024; off < size; off += block {
		n, err := f.ReadAt(p, int64(off))
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
		}
		require.Equal(t, m.data[off:off+n], p[:n], "at %d", off)
	}
	checkHeld(t, tree.ahead)
	assert.LessOrEqual(t, m.count.Requests.Load(), int64(1+size/req), "requests")
	assert.LessOrEqual(t, m.count.Bytes.Load(), int64(size+windowSize), "bytes fetched")
}

// A torch.save file whose directory and headers are read at a view's open
// and whose data is not (an ls): the tentative stream reads a window's
// worth and ends after tentativeFor, its request canceled (not an error),
// fetching no more than a window's GET would; a later read there gets its
// bytes, and one at the end of the window starts the next stream there.
func TestAheadTentativeStreamEnds(t *testing.T) {
	defer func(d time.Duration) { tentativeFor = d }(tentativeFor)
	tentativeFor = 50 * time.Millisecond
	const size, record, req = 8 << 20, 3 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	zipOpen(t, m, f, record)
	require.Eventually(t, func() bool {
		tree.ahead.mu.Lock()
		defer tree.ahead.mu.Unlock()
		return len(f.(*file).streams) == 1 && f.(*file).streams[0].done
	}, 30*time.Second, time.Millisecond)
	checkHeld(t, tree.ahead)
	assert.Equal(t, int64(2), m.count.Requests.Load())
	assert.Equal(t, int64(2*windowSize), m.count.Bytes.Load(), "two windows' worth")
	assert.Zero(t, tree.Stats().Errors)

	p := make([]byte, 1<<20)
	_, err := f.ReadAt(p, 1024)
	require.NoError(t, err)
	require.Equal(t, m.data[1024:1024+len(p)], p)
	_, err = f.ReadAt(p, 1024+1<<20)
	require.NoError(t, err)
	require.Equal(t, m.data[1024+1<<20:1024+2<<20], p)
	checkHeld(t, tree.ahead)
	assert.Equal(t, int64(3), m.count.Requests.Load(), "one stream from the window's end")
	assert.LessOrEqual(t, m.count.Bytes.Load(), int64(windowSize+req+windowSize), "bytes fetched")
}

// A safetensors header (the object's first read is at its start, then the
// header after its length) is a window's GET: no stream.
func TestAheadSafetensorsHeaderStartsNoStream(t *testing.T) {
	const size, req = 4 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	for _, r := range []struct{ off, n int }{{0, 8}, {8, 12000}} {
		p := make([]byte, r.n)
		_, err := f.ReadAt(p, int64(r.off))
		require.NoError(t, err)
		require.Equal(t, m.data[r.off:r.off+r.n], p)
	}
	checkHeld(t, tree.ahead)
	assert.Empty(t, f.(*file).streams)
	assert.Equal(t, int64(1), m.count.Requests.Load())
	assert.Equal(t, int64(windowSize), m.count.Bytes.Load())
}

// The directories and headers of many torch.save files read at a view's
// open and none of their data (an ls of a checkpoint of many .bin files):
// the tentative streams stay within maxStreams and the streams' memory,
// every file's reads get their bytes, and every stream ends by
// tentativeFor (no connection left waiting).
func TestAheadManyTentativeStreamsBounded(t *testing.T) {
	defer func(d time.Duration) { tentativeFor = d }(tentativeFor)
	tentativeFor = 100 * time.Millisecond
	const size, record, req = 4 << 20, 3 << 20, 1 << 20
	tree, m, _ := aheadTree(t, size, req, 4*req)
	a := tree.ahead
	n := 3 * a.maxStreams()
	for range n {
		f, err := tree.Open("o")
		require.NoError(t, err)
		zipOpen(t, m, f, record)
		a.mu.Lock()
		assert.LessOrEqual(t, a.lru.Len(), a.maxStreams(), "streams")
		assert.LessOrEqual(t, a.used+a.freeN, a.memory+int64(a.maxStreams())*pieceSize, "memory")
		a.mu.Unlock()
	}
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for e := a.lru.Front(); e != nil; e = e.Next() {
			if !e.Value.(*stream).done {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "tentative streams still waiting")
	checkHeld(t, a)
	assert.LessOrEqual(t, m.count.Requests.Load(), int64(1+n), "a window at the end, then a stream or the window at 0 per file")
	assert.LessOrEqual(t, m.count.Bytes.Load(), int64((1+n)*windowSize), "bytes fetched")
	assert.Zero(t, tree.Stats().Errors)
}

// A large data.pkl (past the first window, under firstRead) read at a
// view's open: the tentative stream reads on only as far as it is asked,
// not a stream's worth, and ends by tentativeFor.
func TestAheadTentativeStreamReadsWhatIsAsked(t *testing.T) {
	defer func(d time.Duration) { tentativeFor = d }(tentativeFor)
	tentativeFor = 50 * time.Millisecond
	const size, record, req = 8 << 20, 3 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	zipOpen(t, m, f, record)
	p := make([]byte, 300<<10)
	_, err := f.ReadAt(p, 100)
	require.NoError(t, err)
	require.Equal(t, m.data[100:100+len(p)], p)
	require.Eventually(t, func() bool {
		tree.ahead.mu.Lock()
		defer tree.ahead.mu.Unlock()
		return len(f.(*file).streams) == 1 && f.(*file).streams[0].done
	}, 30*time.Second, time.Millisecond)
	checkHeld(t, tree.ahead)
	assert.Equal(t, int64(2), m.count.Requests.Load())
	assert.LessOrEqual(t, m.count.Bytes.Load(), int64(windowSize+100+len(p)), "bytes fetched")
	assert.Zero(t, tree.Stats().Errors)
}
