package readpath

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ckptfs/ckptfs/cache"
)

// One place picks the byte path from the source: a local source keeps the
// cache it was given; an object store's is fitted, with or without the
// read-ahead per object (taken out of the cache's size), and its reads
// wait for one block's request at most.
func TestFor(t *testing.T) {
	given := cache.Options{Size: 512 << 20, BlockSize: cache.DefaultBlockSize, ReadAhead: cache.DefaultReadAhead}
	budget := func(n int64) time.Duration { return time.Duration(n) * time.Nanosecond }

	p := For(Source{Cache: given, FetchAhead: true, Budget: budget})
	assert.Equal(t, Policy{Cache: given, AsyncDIO: true}, p, "local")

	p = For(Source{Remote: true, Cache: given, FetchAhead: true, Budget: budget})
	want, req, memory := given.ForObjectStoreAhead(false, false)
	assert.Equal(t, Policy{Cache: want, MinRequest: req, AheadMemory: memory, ReadDeadline: budget(want.BlockSize)}, p)
	assert.Positive(t, p.AheadMemory)
	assert.Equal(t, given.Size, p.Cache.Size+p.AheadMemory, "within the cache size given")

	p = For(Source{Remote: true, Cache: given, Budget: budget})
	assert.Equal(t, Policy{Cache: given.ForObjectStore(false, false), ReadDeadline: budget(cache.ObjectStoreBlockSize)}, p, "no fetch-ahead")

	kept := given
	kept.BlockSize, kept.ReadAhead = 1<<20, 3
	p = For(Source{Remote: true, Cache: kept, BlockSizeGiven: true, ReadAheadGiven: true})
	assert.Equal(t, []any{int64(1 << 20), 3, time.Duration(0)}, []any{p.Cache.BlockSize, p.Cache.ReadAhead, p.ReadDeadline}, "what the user gave is kept")
}

// O_DIRECT reads are async for a local source, not for an object store
// (whose stalled read must end at an interrupt), unless the user says.
func TestForAsyncDIO(t *testing.T) {
	on, off := true, false
	assert.True(t, For(Source{}).AsyncDIO, "local")
	assert.False(t, For(Source{Remote: true}).AsyncDIO, "object store")
	assert.False(t, For(Source{AsyncDIO: &off}).AsyncDIO, "local, --async-dio=false")
	assert.True(t, For(Source{Remote: true, AsyncDIO: &on}).AsyncDIO, "object store, --async-dio")
}

// The memory limit covers the cache, the read-ahead, the metadata budget
// and the headroom: below the metadata, decoding a large .metadata ran the
// collector without pause.
func TestMemoryLimit(t *testing.T) {
	p := Policy{AheadMemory: 128 << 20}
	assert.Equal(t, int64(384<<20+128<<20+1<<30+MemoryHeadroom), p.MemoryLimit(384<<20, 1<<30))
}
