package cache

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inFlightSource delays every ReadAt a little, so that readers pile up, and
// records the most bytes it was ever asked for at once.
type inFlightSource struct {
	*memSource
	now, peak atomic.Int64
}

func (s *inFlightSource) ReadAt(p []byte, off int64) (int, error) {
	n := s.now.Add(int64(len(p)))
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	defer s.now.Add(-int64(len(p)))
	time.Sleep(50 * time.Microsecond)
	return s.memSource.ReadAt(p, off)
}

// TestMemoryBoundWithManyReaders runs 64 random readers (and a sequential
// one, for read-ahead) against a cache of 16 blocks and checks, while they
// run, that the blocks the cache holds (cached, staged, being filled) never
// exceed its bound, and that the source is never asked for more blocks at
// once than the fill slots and read-ahead workers allow.
func TestMemoryBoundWithManyReaders(t *testing.T) {
	const size = 200 * testBS
	src := &inFlightSource{memSource: newMemSource(size, 21)}
	c := newTestCache(t, Options{Size: 16 * testBS, ReadAhead: 2, Workers: 2})
	o := c.Options()
	require.Equal(t, int64(16*testBS), c.Bound(), "options %+v leave room for ristretto", o)
	require.Equal(t, 4, o.MaxFills)
	require.Equal(t, 4, o.Staging)

	stop := make(chan struct{})
	var peakHeld atomic.Int64
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			s := c.Stats()
			held := s.CachedBytes + s.StagedBytes + s.FillingBytes + s.FreeBytes
			if held > peakHeld.Load() {
				peakHeld.Store(held)
			}
			select {
			case <-stop:
				return
			default:
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()

	var wg sync.WaitGroup
	for g := range 65 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := c.Open(1, src, size)
			defer h.Close()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			off := int64(0)
			for range 200 {
				if g != 0 {
					off = r.Int64N(size)
				}
				n := 1 + r.IntN(testBS)
				got := make([]byte, n)
				k, err := h.ReadAt(got, off)
				if err != nil && k < n && off+int64(k) != size {
					t.Errorf("reader %d: ReadAt(%d, %d): %d, %v", g, n, off, k, err)
					return
				}
				off = (off + int64(k)) % size
			}
		}()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()

	maxFilling := int64(o.MaxFills+o.Workers) * testBS
	assert.LessOrEqual(t, src.peak.Load(), maxFilling, "source bytes asked for at once")
	assert.Greater(t, src.peak.Load(), int64(testBS), "readers did pile up")
	assert.LessOrEqual(t, peakHeld.Load(), c.Bound(), "cached + staged + filling + free bytes")
	// Read-ahead fills may still be running after the last reader returns;
	// their bytes must be released once they finish.
	assert.Eventually(t, func() bool { return c.Stats().FillingBytes == 0 },
		5*time.Second, time.Millisecond, "filling bytes released")
	st := c.Stats()
	assert.Zero(t, st.FillErrors)
	t.Logf("peak held %d of bound %d; peak source bytes in flight %d of %d; %d fills",
		peakHeld.Load(), c.Bound(), src.peak.Load(), maxFilling, st.Fills)
}

func TestBoundOfTinyCache(t *testing.T) {
	// Staging and fill slots alone exceed Size: the bound says so, and
	// ristretto keeps nothing.
	c := newTestCache(t, Options{Size: testBS, Staging: 1, MaxFills: 2})
	assert.Equal(t, int64(3*testBS+1), c.Bound())
	for _, o := range []Options{{Size: 512 << 20, BlockSize: 4 << 20}, {Size: 64 << 20, BlockSize: 4 << 20, ReadAhead: 4, Workers: 2}} {
		c := newTestCache(t, o)
		assert.Equal(t, o.Size, c.Bound(), "%+v", c.Options())
	}
}
