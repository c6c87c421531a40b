package readpath

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/ckptfs/ckptfs/cache"
)

// One place picks the byte path from the source: a local source keeps the
// cache it was given; an object store's is fitted, with or without the
// streams per object (taken out of the cache's size), and its reads wait
// for one request at most.
func TestFor(t *testing.T) {
	given := cache.Options{Size: 512 << 20, BlockSize: cache.DefaultBlockSize, ReadAhead: cache.DefaultReadAhead}
	budget := func(n int64) time.Duration { return time.Duration(n) * time.Nanosecond }
	host := Source{Cores: 2, Memory: 8 << 30}

	local := host
	local.Cache, local.FetchAhead, local.Budget = given, true, budget
	assert.Equal(t, Policy{Cache: given, AsyncDIO: true}, For(local), "local")

	remote := local
	remote.Remote = true
	p := For(remote)
	assert.Equal(t, []int64{64 << 20, 128 << 20}, []int64{p.MinRequest, p.AheadMemory}, "streams")
	assert.Equal(t, given.Size, p.Cache.Size+p.AheadMemory+p.Replies, "blocks, streams and replies within the cache size given")
	assert.Equal(t, int64(80<<20), p.Replies)
	assert.Equal(t, []any{int64(ObjectStoreBlockSize), 4, 4}, []any{p.Cache.BlockSize, p.Cache.ReadAhead, p.Cache.Workers})
	assert.Equal(t, budget(64<<20), p.ReadDeadline, "a read waits for one stream's request")

	remote.FetchAhead = false
	p = For(remote)
	blocks := given
	blocks.Size -= 80 << 20
	assert.Equal(t, Policy{Cache: fitObjectStore(blocks, false, false, 2), Replies: 80 << 20, ReadDeadline: budget(ObjectStoreBlockSize)}, p, "no fetch-ahead")

	kept := given
	kept.BlockSize, kept.ReadAhead = 1<<20, 3
	p = For(Source{Remote: true, Cache: kept, BlockSizeGiven: true, ReadAheadGiven: true, Cores: 2})
	assert.Equal(t, []any{int64(1 << 20), 3, time.Duration(0)}, []any{p.Cache.BlockSize, p.Cache.ReadAhead, p.ReadDeadline}, "what the user gave is kept")
}

// Request size and concurrency follow the cache and the host: the blocks
// get what the streams and the replies (80 MiB, at most a quarter) leave of
// the cache; larger
// requests in a larger cache (an eighth of it, up to 64 MiB), more memory
// for streams on more cores (half a request for two streams a core, within
// a quarter of the cache and a sixteenth of the host's memory), more blocks
// in flight on more cores; no streams in a cache too small for them.
func TestForSizesByCacheAndCores(t *testing.T) {
	for _, c := range []struct {
		cache, memory     int64
		cores             int
		req, ahead        int64
		workers, prefetch int
	}{
		{512 << 20, 8 << 30, 2, 64 << 20, 128 << 20, 4, 4},
		{512 << 20, 8 << 30, 16, 64 << 20, 128 << 20, 4, 4},
		{2 << 30, 64 << 30, 2, 64 << 20, 128 << 20, 8, 8},
		{2 << 30, 64 << 30, 8, 64 << 20, 512 << 20, 22, 8},
		{2 << 30, 64 << 30, 16, 64 << 20, 512 << 20, 22, 8},
		{2 << 30, 2 << 30, 16, 64 << 20, 128 << 20, 28, 8}, // a sixteenth of the host
		{128 << 20, 8 << 30, 2, 16 << 20, 32 << 20, 2, 2},
		{32 << 20, 8 << 30, 2, 8 << 20, 8 << 20, 1, 1},
		{8 << 20, 8 << 30, 2, 0, 0, 1, 1},
	} {
		p := For(Source{Remote: true, FetchAhead: true, Cores: c.cores, Memory: c.memory,
			Cache: cache.Options{Size: c.cache, BlockSize: cache.DefaultBlockSize, ReadAhead: cache.DefaultReadAhead}})
		assert.Equal(t, []any{c.req, c.ahead, c.workers, c.prefetch}, []any{p.MinRequest, p.AheadMemory, p.Cache.Workers, p.Cache.ReadAhead}, "%+v", c)
		assert.Equal(t, c.cache, p.Cache.Size+p.AheadMemory+p.Replies, "%+v", c)
		assert.Equal(t, min(80<<20, c.cache/4), p.Replies, "%+v", c)
		assert.LessOrEqual(t, p.AheadMemory, c.cache/4)
	}
}

// inspect and export take their blocks and workers from the policy too:
// a local source's 8 MiB on 4 workers, an object store's blocks on workers
// by cores, the workers given kept; an object store's streams as a
// mount's.
func TestForExport(t *testing.T) {
	p := For(Source{Export: true, Cores: 2, Memory: 8 << 30})
	assert.Equal(t, []any{int64(8 << 20), 4, int64(0)}, []any{p.Cache.BlockSize, p.Cache.Workers, p.MinRequest}, "local")
	p = For(Source{Export: true, Remote: true, FetchAhead: true, Cores: 2, Memory: 8 << 30})
	assert.Equal(t, []any{int64(ObjectStoreBlockSize), 6, int64(64 << 20)}, []any{p.Cache.BlockSize, p.Cache.Workers, p.MinRequest}, "object store")
	p = For(Source{Export: true, Remote: true, Cores: 8, Memory: 8 << 30})
	assert.Equal(t, 8, p.Cache.Workers, "object store, no streams, 8 cores")
	p = For(Source{Export: true, Remote: true, Cores: 2, Cache: cache.Options{Workers: 3}, WorkersGiven: true})
	assert.Equal(t, 3, p.Cache.Workers, "--workers")
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

// A local mount's memory limit covers the cache, the metadata budget and
// the headroom: below the metadata, decoding a large .metadata ran the
// collector without pause. A remote mount's is its cache size given
// (blocks, streams, replies) and the slack, whatever the metadata budget:
// peak RSS within the cache + 64 MiB (a large view's live heap raises it:
// internal/memlimit).
func TestMemoryLimit(t *testing.T) {
	p := Policy{}
	assert.Equal(t, int64(512<<20+1<<30+MemoryHeadroom), p.MemoryLimit(512<<20, 1<<30))
	p = For(Source{Remote: true, FetchAhead: true, Cores: 2, Memory: 8 << 30, Cache: cache.Options{Size: 512 << 20}})
	assert.Equal(t, int64(512<<20+40<<20), p.MemoryLimit(p.Cache.Size, 1<<30))
	assert.LessOrEqual(t, p.MemoryLimit(p.Cache.Size, 1<<30)+24<<20, int64(512<<20+64<<20), "with the binary's pages")
}
