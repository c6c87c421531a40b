package ckpt

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

var sink []*byte

// TestHeapSizeBoundsTheAllocator: HeapSize is at least what the runtime
// takes for an object of each size (MemStats.TotalAlloc counts the size
// class, or the pages, of each allocation).
func TestHeapSizeBoundsTheAllocator(t *testing.T) {
	var ms runtime.MemStats
	for n := int64(8); n <= 80<<10; n += max(8, n/64&^7) {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		sink = make([]*byte, n/8)
		runtime.ReadMemStats(&ms)
		require.LessOrEqual(t, int64(ms.TotalAlloc-before), HeapSize(n), "an object of %d bytes", n)
	}
	sink = nil
}
