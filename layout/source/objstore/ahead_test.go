package objstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// memStore is one object in memory, its reads counted; fail, when set,
// answers the next read at failAt (and is cleared).
type memStore struct {
	data  []byte
	delay time.Duration
	count *Counters

	mu     sync.Mutex
	fail   error
	failAt int64
}

func (m *memStore) obj() Object { return Object{Key: "p/o", Size: int64(len(m.data)), Version: "v1"} }

func (m *memStore) Head(_ context.Context, key string) (Object, error) {
	if key != "p/o" {
		return Object{}, ErrNotFound
	}
	return m.obj(), nil
}

func (m *memStore) List(_ context.Context, prefix string, _ bool, _ int, _ string) (Page, error) {
	if prefix == "p/" {
		return Page{Objects: []Object{m.obj()}}, nil
	}
	return Page{}, nil
}

func (m *memStore) Read(_ context.Context, _ Object, p []byte, off int64) (int, error) {
	m.count.Requests.Add(1)
	m.mu.Lock()
	var err error
	if off == m.failAt {
		err, m.fail = m.fail, nil
	}
	m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	time.Sleep(m.delay)
	return copy(p, m.data[off:]), nil
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
// directories included, and each byte is fetched about once; without
// read-ahead each record is two requests (its directory, its data).
func TestAheadReadsRecordsInFewRequests(t *testing.T) {
	const size, record, req = 8 << 20, 256 << 10, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	n := records(t, m, f, record)
	checkHeld(t, tree.ahead)
	assert.LessOrEqual(t, n, int64(size/req+3), "requests")
	assert.LessOrEqual(t, float64(m.count.Bytes.Load()), 1.05*size, "bytes fetched")

	_, m, f = aheadTree(t, size, 0, 0)
	assert.Equal(t, int64(2*size/record), records(t, m, f, record), "requests without read-ahead")
}

// Blocks of an object read at once and out of order, as the block cache's
// read-ahead workers read them, get their own bytes; each byte is fetched
// about once and the spans held stay within AheadMemory.
func TestAheadConcurrentOutOfOrder(t *testing.T) {
	const size, block, req, memory = 12 << 20, 512 << 10, 1 << 20, 3 << 20
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
	assert.LessOrEqual(t, maxHeld.Load(), int64(memory), "spans and kept buffers")
	// The shuffled order reads some blocks twice; each read once would
	// fetch the object once.
	assert.LessOrEqual(t, float64(m.count.Bytes.Load()), 1.6*size, "bytes fetched")
	assert.Less(t, m.count.Requests.Load(), int64(size/block), "fewer requests than blocks")
}

// Reads that jump about are plain requests: nothing is fetched that was
// not asked for.
func TestAheadLeavesScatteredReadsAlone(t *testing.T) {
	const size, req = 16 << 20, 1 << 20
	_, m, f := aheadTree(t, size, req, 4*req)
	p := make([]byte, 256<<10)
	for _, off := range []int64{10 << 20, 2 << 20, 14 << 20, 0, 6 << 20} {
		_, err := f.ReadAt(p, off)
		require.NoError(t, err)
		require.Equal(t, m.data[off:off+256<<10], p)
	}
	assert.Equal(t, int64(5), m.count.Requests.Load())
	assert.Equal(t, int64(5*256<<10), m.count.Bytes.Load())
}

// A span whose request fails fails the reads waiting on it with the
// store's error (a changed object stays ErrChanged); it is not kept, so a
// later read asks again and gets the bytes.
func TestAheadFailedSpan(t *testing.T) {
	const size, req = 8 << 20, 2 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	p := make([]byte, 1<<20)
	_, err := f.ReadAt(p, 0) // plain: sets the frontier
	require.NoError(t, err)
	m.mu.Lock()
	m.fail, m.failAt = &ChangedError{Cause: "its ETag is no longer \"v1\""}, 1<<20
	m.mu.Unlock()
	_, err = f.ReadAt(p, 1<<20)
	require.ErrorIs(t, err, source.ErrChanged)
	tree.ahead.mu.Lock()
	for _, s := range f.(*file).spans {
		assert.NotEqual(t, int64(1<<20), s.start, "a failed span is dropped")
	}
	tree.ahead.mu.Unlock()

	m.mu.Lock()
	m.fail, m.failAt = errors.New("connection reset"), 1<<20 // not an AttemptError: not resumed
	m.mu.Unlock()
	_, err = f.ReadAt(p, 1<<20)
	require.ErrorIs(t, err, ErrRequest)

	_, err = f.ReadAt(p, 1<<20)
	require.NoError(t, err)
	require.Equal(t, m.data[1<<20:2<<20], p)
}

// checkHeld checks, with no read under way, that the spans' buffers are
// all counted once: every span held has its own buffer, none of them kept
// for reuse too, and the bytes add up within AheadMemory.
func checkHeld(t *testing.T, a *aheads) {
	t.Helper()
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
	for e := a.lru.Front(); e != nil; e = e.Next() {
		s := e.Value.(*span)
		assert.Zero(t, s.refs)
		own(s.buf)
	}
	var free int64
	for _, b := range a.free {
		own(b)
		free += int64(cap(b))
	}
	assert.Equal(t, int64(a.lru.Len())*a.minRequest, a.used, "bytes of the spans held")
	assert.Equal(t, free, a.freeN, "bytes of the buffers kept")
	assert.LessOrEqual(t, a.used+a.freeN, a.memory)
}
