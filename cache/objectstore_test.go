package cache

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestForObjectStore(t *testing.T) {
	for _, tc := range []struct {
		cache, given      int64
		block             int64
		prefetch, workers int
	}{
		{512 << 20, 0, 16 << 20, 8, 8},
		{4 << 30, 0, 16 << 20, 8, 8},
		{256 << 20, 0, 16 << 20, 4, 4},
		{128 << 20, 0, 16 << 20, 2, 2},
		{32 << 20, 0, 8 << 20, 1, 1},
		{256 << 20, 16 << 20, 16 << 20, 4, 4},
		{512 << 20, 1 << 20, 1 << 20, 8, 8},
	} {
		o := Options{Size: tc.cache, BlockSize: DefaultBlockSize, ReadAhead: DefaultReadAhead}
		if tc.given != 0 {
			o.BlockSize = tc.given
		}
		o = o.ForObjectStore(tc.given != 0, false)
		assert.Equal(t, []any{tc.block, tc.prefetch, tc.workers}, []any{o.BlockSize, o.ReadAhead, o.Workers}, "cache %d", tc.cache)
		// Staging, fills and read-ahead workers leave ristretto a quarter.
		quarter := int(tc.cache / o.BlockSize / 4)
		reserve := int64(min(2*(o.ReadAhead+o.Workers), quarter)+quarter+o.Workers) * o.BlockSize
		assert.LessOrEqual(t, reserve, tc.cache*3/4, "cache %d", tc.cache)
	}
	// A read-ahead the user gave is kept.
	o := Options{Size: 512 << 20, BlockSize: DefaultBlockSize, ReadAhead: 3}.ForObjectStore(false, true)
	assert.Equal(t, []any{int64(ObjectStoreBlockSize), 3, 8}, []any{o.BlockSize, o.ReadAhead, o.Workers})
}

// An object store's read-ahead asks for a block at least and keeps up to
// ObjectStoreAheadSpans of them, a quarter of the cache at most, none
// where that is under two; the cache gets the rest, fitted to it.
func TestForObjectStoreAhead(t *testing.T) {
	for _, tc := range []struct {
		cache, req, memory int64
		workers            int
	}{
		{512 << 20, 16 << 20, 128 << 20, 6},
		{4 << 30, 16 << 20, ObjectStoreAheadSpans * 16 << 20, 8},
		{256 << 20, 16 << 20, 64 << 20, 3},
		{128 << 20, 16 << 20, 32 << 20, 1},
		{64 << 20, 8 << 20, 16 << 20, 1},
		{32 << 20, 0, 0, 1},
	} {
		o := Options{Size: tc.cache, BlockSize: DefaultBlockSize, ReadAhead: DefaultReadAhead}
		c, req, memory := o.ForObjectStoreAhead(false, false)
		assert.Equal(t, []int64{tc.req, tc.memory}, []int64{req, memory}, "cache %d", tc.cache)
		assert.Equal(t, tc.cache, c.Size+memory, "within the size given")
		assert.Equal(t, tc.workers, c.Workers, "cache %d", tc.cache)
		assert.Equal(t, o.ForObjectStore(false, false).BlockSize, c.BlockSize)
	}
}
