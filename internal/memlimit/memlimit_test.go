package memlimit

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func limit() int64 { return debug.SetMemoryLimit(-1) }

func TestOutsideLowersTheLimitWhileHeld(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	before := limit()
	release := Outside(100 << 20)
	assert.Equal(t, before, limit(), "no bound set: the limit is left alone")
	release.Release()

	Set(1 << 30)
	defer Set(0)
	assert.Equal(t, int64(1<<30), limit())
	a := Outside(100 << 20)
	assert.Equal(t, int64(1<<30-100<<20), limit())
	b := Outside(800 << 20)
	assert.Equal(t, int64(1<<29), limit(), "never below half the bound")
	b.Release()
	b.Release() // once
	assert.Equal(t, int64(1<<30-100<<20), limit())
	a.Release()
	assert.Equal(t, int64(1<<30), limit())
}

// TestOutsideFollowsWhatIsHeld: a mapping whose pages are dropped as they
// are read (a .metadata behind its decoder) lowers the limit by what it
// holds, not by its size; nothing after its release.
func TestOutsideFollowsWhatIsHeld(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	Set(1 << 30)
	defer Set(0)
	m := Outside(300 << 20)
	assert.Equal(t, int64(1<<30-300<<20), limit())
	m.Hold(48 << 20)
	assert.Equal(t, int64(1<<30-48<<20), limit())
	other := Outside(100 << 20)
	assert.Equal(t, int64(1<<30-148<<20), limit())
	m.Hold(600 << 20)
	assert.Equal(t, int64(1<<29), limit(), "never below half the bound")
	m.Release()
	m.Hold(48 << 20) // released: no longer counts
	assert.Equal(t, int64(1<<30-100<<20), limit())
	other.Release()
	assert.Equal(t, int64(1<<30), limit())
}

func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

func TestOpeningCollectsWhileHeld(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	release := Opening()
	assert.Equal(t, -1, gcPercent(), "no bound set: the collector is left alone")
	release()

	Set(1 << 30)
	defer Set(0)
	a := Opening()
	assert.Equal(t, openingGC, gcPercent())
	b := Opening()
	a()
	a() // once
	assert.Equal(t, openingGC, gcPercent(), "another open is under way")
	b()
	assert.Equal(t, -1, gcPercent(), "back to collecting at the limit")

	debug.SetGCPercent(50) // $GOGC set
	c := Opening()
	assert.Equal(t, 50, gcPercent())
	c()
	assert.Equal(t, 50, gcPercent())
}

// A live heap above the bound raises the limit to it and a quarter more
// after the next collection, instead of the collector running without
// pause; once the heap is freed, the limit is the bound again.
func TestLimitFollowsALiveHeapAboveTheBound(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const bound = 16 << 20
	Set(bound)
	defer Set(0)
	keep := make([]byte, 64<<20)
	for i := range keep {
		keep[i] = 1
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return limit() >= 80<<20
	}, 10*time.Second, 10*time.Millisecond, "limit %d with 64 MiB live", limit())
	runtime.KeepAlive(keep)
	keep = nil
	require.Eventually(t, func() bool {
		runtime.GC()
		return limit() == bound
	}, 10*time.Second, 10*time.Millisecond, "limit %d with the heap freed", limit())
}

// Buffers of the live heap are not scaled: with 64 MiB live, all of it
// buffers, the limit is the live heap and a quarter of the rest only
// (the test's own heap), not 80 MiB.
func TestBuffersAreNotScaled(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const bound = 16 << 20
	Set(bound)
	defer Set(0)
	Buffers(func() int64 { return 64 << 20 })
	defer Buffers(nil)
	keep := make([]byte, 64<<20)
	for i := range keep {
		keep[i] = 1
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return limit() >= 64<<20
	}, 10*time.Second, 10*time.Millisecond, "limit %d with 64 MiB live", limit())
	assert.Less(t, limit(), int64(72<<20), "live %d: the buffers scaled", liveHeap())
	runtime.KeepAlive(keep)
}
