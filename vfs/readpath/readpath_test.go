package readpath

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/cache"
)

// newCache returns a cache of small blocks, so that reads span several.
func newCache(t *testing.T) *cache.Cache {
	t.Helper()
	c, err := cache.New(cache.Options{Size: 1 << 20, BlockSize: 16 << 10, ReadAhead: 2})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func newPath(t *testing.T, opts Options) *Path {
	t.Helper()
	p := New(opts)
	t.Cleanup(p.Close)
	return p
}

// replied returns the bytes of a reply and lets go of it, as go-fuse does
// once it has written the reply.
func replied(t *testing.T, res fuse.ReadResult) []byte {
	t.Helper()
	b, st := res.Bytes(make([]byte, 0, res.Size()))
	require.Equal(t, fuse.OK, st)
	require.Len(t, b, res.Size())
	out := bytes.Clone(b)
	res.Done()
	return out
}

func testData(n int) []byte {
	data := make([]byte, n)
	rand.New(rand.NewSource(1)).Read(data)
	return data
}

// Both modes reply with the file's bytes at any offset and length, the
// bytes up to the end at a read past it, and nothing beyond the end.
func TestModesReplyTheSameBytes(t *testing.T) {
	data := testData(100<<10 + 123)
	size := int64(len(data))
	for _, direct := range []bool{true, false} {
		c := newCache(t)
		p := newPath(t, Options{Cache: c, Local: true, DirectReads: direct})
		require.Equal(t, direct, p.Direct())
		r := p.Open(File{Name: "f", ID: 1, Src: bytes.NewReader(data), Size: size})
		rng := rand.New(rand.NewSource(2))
		for i := 0; i < 300; i++ {
			off := rng.Int63n(size + 64<<10)
			dest := make([]byte, 1+rng.Intn(64<<10))
			res, err := r.Read(context.Background(), dest, off)
			require.NoError(t, err, "direct=%v [%d, +%d)", direct, off, len(dest))
			want := data[min(off, size):min(off+int64(len(dest)), size)]
			require.True(t, bytes.Equal(want, replied(t, res)), "direct=%v [%d, +%d)", direct, off, len(dest))
		}
		r.Close()
		if direct {
			require.Zero(t, c.Stats().Fills, "direct reads leave the cache alone")
		} else {
			require.Positive(t, c.Stats().Fills)
		}
		require.Zero(t, c.Stats().OpenHandles, "Close ends the open")
	}
}

// Only a local source is read directly, and only with DirectReads.
func TestModeFollowsTheSource(t *testing.T) {
	for _, tc := range []struct{ local, directReads, direct bool }{
		{true, true, true}, {true, false, false}, {false, true, false}, {false, false, false},
	} {
		c := newCache(t)
		p := newPath(t, Options{Cache: c, Local: tc.local, DirectReads: tc.directReads})
		require.Equal(t, tc.direct, p.Direct(), "%+v", tc)
		r := p.Open(File{ID: 1, Src: bytes.NewReader(testData(4096)), Size: 4096})
		res, err := r.Read(context.Background(), make([]byte, 4096), 0)
		require.NoError(t, err)
		_, pinned := res.(pinnedReply)
		require.Equal(t, !tc.direct, pinned, "%+v: a reply from the cache's blocks", tc)
		res.Done()
		r.Close()
		require.Equal(t, !tc.direct, c.Stats().Fills > 0, "%+v", tc)
	}
}

// An open counts as an open handle of the cache in both modes (the
// open_handles of .ckptfs and the metrics: the open view files).
func TestOpenCountsAsAnOpenHandle(t *testing.T) {
	for _, direct := range []bool{true, false} {
		c := newCache(t)
		r := newPath(t, Options{Cache: c, Local: true, DirectReads: direct}).Open(File{ID: 1, Src: bytes.NewReader(nil)})
		require.EqualValues(t, 1, c.Stats().OpenHandles, "direct=%v", direct)
		r.Close()
		require.Zero(t, c.Stats().OpenHandles, "direct=%v", direct)
	}
}

// errReader fails every read.
type errReader struct{ err error }

func (r errReader) ReadAt([]byte, int64) (int, error) { return 0, r.err }

// A source's error is the read's, in both modes.
func TestSourceErrorIsTheReads(t *testing.T) {
	bad := errors.New("shard changed")
	for _, direct := range []bool{true, false} {
		r := newPath(t, Options{Cache: newCache(t), Local: true, DirectReads: direct}).Open(File{ID: 1, Src: errReader{bad}, Size: 1 << 20})
		res, err := r.Read(context.Background(), make([]byte, 4096), 0)
		require.ErrorIs(t, err, bad, "direct=%v", direct)
		require.Nil(t, res)
		r.Close()
	}
}

// stuck is a source that answers no read until released, or fails it after
// a while (so that a read that does not stop waiting fails its test rather
// than hangs).
type stuck struct{ release chan struct{} }

var errGaveUp = errors.New("stuck source gave up")

func (s stuck) ReadAt(p []byte, off int64) (int, error) {
	select {
	case <-s.release:
	case <-time.After(5 * time.Second):
	}
	return 0, errGaveUp
}

func newStuck(t *testing.T) stuck {
	s := stuck{make(chan struct{})}
	t.Cleanup(func() { close(s.release) }) // before the cache's Close, which waits for it
	return s
}

// A cached read whose block never fills ends at its deadline, with
// ErrReadDeadline, while the fill goes on.
func TestCachedReadEndsAtItsDeadline(t *testing.T) {
	c := newCache(t)
	const d = 200 * time.Millisecond
	r := newPath(t, Options{Cache: c, ReadDeadline: d}).Open(File{ID: 1, Src: newStuck(t), Size: 1 << 20})
	defer r.Close()
	start := time.Now()
	res, err := r.Read(context.Background(), make([]byte, 4096), 0)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrReadDeadline)
	require.Nil(t, res)
	require.GreaterOrEqual(t, took, d)
	require.Less(t, took, d+2*time.Second)
}

// A cached read ends when its request is interrupted (the context go-fuse
// cancels at a FUSE INTERRUPT).
func TestCachedReadEndsAtAnInterrupt(t *testing.T) {
	r := newPath(t, Options{Cache: newCache(t)}).Open(File{ID: 1, Src: newStuck(t), Size: 1 << 20})
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := r.Read(ctx, make([]byte, 4096), 0)
	require.ErrorIs(t, err, context.Canceled)
}

// pageCache records what prefill stores.
type pageCache struct {
	mu   sync.Mutex
	data []byte
}

func (c *pageCache) WriteCache(off int64, data []byte) syscall.Errno {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(len(c.data)) != off {
		return syscall.EINVAL // prefill stores front to back
	}
	c.data = append(c.data, data...)
	return 0
}

func (c *pageCache) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.data)
}

// hold counts the holds of a file's source that are not released.
type hold struct{ n atomic.Int64 }

func (h *hold) hold() (func(), bool) {
	h.n.Add(1)
	return func() { h.n.Add(-1) }, true
}

// A read past the header offers the file to prefill, which stores all of
// it in the page cache, once, holding the source until done.
func TestPrefillStoresTheFileOnceALoaderReachesTheTensors(t *testing.T) {
	data := testData(3<<20 + 5)
	plenty := func() (int64, bool) { return 1 << 40, true }
	p := newPath(t, Options{Cache: newCache(t), Local: true, DirectReads: true, Prefill: true, MemAvailable: plenty})
	var pc pageCache
	var h hold
	f := File{Name: "f", ID: 1, Src: bytes.NewReader(data), Size: int64(len(data)), DataOffset: 2 << 20, Page: &pc, Hold: h.hold}
	r := p.Open(f)
	_, err := r.Read(context.Background(), make([]byte, 4096), 0)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, p.Prefilled(), "a read of the header offers nothing")

	_, err = r.Read(context.Background(), make([]byte, 4096), 2<<20)
	require.NoError(t, err)
	r.Close() // the prefill outlives the open
	require.Eventually(t, func() bool { return p.Prefilled() == f.Size }, 10*time.Second, 10*time.Millisecond)
	require.True(t, bytes.Equal(data, pc.bytes()))
	require.Eventually(t, func() bool { return h.n.Load() == 0 }, 10*time.Second, 10*time.Millisecond, "the hold is released")

	r = p.Open(f)
	_, err = r.Read(context.Background(), make([]byte, 4096), 2<<20)
	require.NoError(t, err)
	r.Close()
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, f.Size, p.Prefilled(), "a file is prefilled once per mount")
}

// Prefill leaves a file alone where memory is short, or where its source
// can no longer be held.
func TestPrefillSkips(t *testing.T) {
	data := testData(2 << 20)
	for _, tc := range []struct {
		name string
		mem  func() (int64, bool)
		hold func() (func(), bool)
	}{
		{"memory short", func() (int64, bool) { return minAvailable + int64(len(data)), true }, nil},
		{"memory unknown", func() (int64, bool) { return 0, false }, nil},
		{"source closed", func() (int64, bool) { return 1 << 40, true }, func() (func(), bool) { return nil, false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPath(t, Options{Cache: newCache(t), Local: true, DirectReads: true, Prefill: true, MemAvailable: tc.mem})
			var pc pageCache
			r := p.Open(File{ID: 1, Src: bytes.NewReader(data), Size: int64(len(data)), Page: &pc, Hold: tc.hold})
			_, err := r.Read(context.Background(), make([]byte, 4096), 1<<20)
			require.NoError(t, err)
			r.Close()
			time.Sleep(200 * time.Millisecond)
			require.Zero(t, p.Prefilled())
			require.Empty(t, pc.bytes())
		})
	}
}

// A read that races the unmount offers its file to a closed prefill: it is
// ignored, not a send on the closed queue.
func TestPrefillOfferAfterClose(t *testing.T) {
	data := testData(3 << 20)
	p := New(Options{Cache: newCache(t), Local: true, DirectReads: true, Prefill: true, MemAvailable: func() (int64, bool) { return 1 << 40, true }})
	r := p.Open(File{Name: "f", ID: 1, Src: bytes.NewReader(data), Size: int64(len(data)), Page: &pageCache{}})
	defer r.Close()
	p.Close()
	_, err := r.Read(context.Background(), make([]byte, 4096), 2<<20)
	require.NoError(t, err)
	p.Close() // twice is fine too
	require.Zero(t, p.Prefilled())
}
