package readpath

import (
	"time"

	"github.com/ckptfs/ckptfs/cache"
)

// Source describes what a mount reads, as its flags give it, for For.
type Source struct {
	// Remote is an object store (s3://, gs://, az://); else a local
	// directory.
	Remote bool
	// Cache is the block cache the flags ask for (Size, BlockSize,
	// ReadAhead, ...); BlockSizeGiven and ReadAheadGiven say the user set
	// those, and an object store keeps them.
	Cache                          cache.Options
	BlockSizeGiven, ReadAheadGiven bool
	// FetchAhead fetches each object read in order ahead, in requests of
	// a block (remote only; cache.Options.ForObjectStoreAhead).
	FetchAhead bool
	// Budget is the longest a request for n bytes to the store takes to
	// fail, its retries included (open.Limits.Budget); remote only.
	Budget func(n int64) time.Duration
	// AsyncDIO is --async-dio when given; nil: For picks.
	AsyncDIO *bool
}

// Policy is how a mount moves a view's bytes, picked in one place from its
// Source: the block cache, what an object store's reads fetch ahead, each
// read's deadline, and the process's memory limit (MemoryLimit).
type Policy struct {
	Cache cache.Options
	// MinRequest and AheadMemory are the read-ahead of each object read
	// in order (objstore.Limits), taken out of the cache's size; 0: none.
	MinRequest, AheadMemory int64
	// ReadDeadline bounds each read served through the cache; 0: none.
	ReadDeadline time.Duration
	// AsyncDIO sends an O_DIRECT read's FUSE requests at once
	// (vfs.MountOptions.AsyncDIO): unless given, for a local source only.
	// The kernel then waits for them without interruption, and a store's
	// stalled read must end at the reader's interrupt; local reads do not
	// stall so.
	AsyncDIO bool
}

// For picks the policy of a mount of s. A local source keeps the cache the
// flags give (read straight from the shards with Options.DirectReads). An
// object store's cache has larger blocks, more of them in flight, and the
// read-ahead per object when FetchAhead; a read waits for one block's
// request, its retries included, at most. O_DIRECT reads are async for a
// local source (AsyncDIO).
func For(s Source) Policy {
	p := Policy{Cache: s.Cache, AsyncDIO: !s.Remote}
	if s.AsyncDIO != nil {
		p.AsyncDIO = *s.AsyncDIO
	}
	if !s.Remote {
		return p
	}
	if s.FetchAhead {
		p.Cache, p.MinRequest, p.AheadMemory = s.Cache.ForObjectStoreAhead(s.BlockSizeGiven, s.ReadAheadGiven)
	} else {
		p.Cache = s.Cache.ForObjectStore(s.BlockSizeGiven, s.ReadAheadGiven)
	}
	if s.Budget != nil {
		p.ReadDeadline = s.Budget(p.Cache.BlockSize)
	}
	return p
}

// MemoryHeadroom is what a mount process may use beyond its block cache,
// its read-ahead and its metadata: blocks in flight, FUSE buffers.
const MemoryHeadroom = 48 << 20

// MemoryLimit is the Go memory limit of a mount whose cache is bounded by
// cacheBound (cache.Cache.Bound): the cache, the objects' read-ahead, the
// open views' metadata (the LRU closes views beyond metadataBudget; the
// newest, being decoded, may pass it by its own size), and the headroom.
// Below the metadata a decode of a large .metadata ran the collector
// without pause (BENCHMARKS.md, run V).
func (p Policy) MemoryLimit(cacheBound, metadataBudget int64) int64 {
	return cacheBound + p.AheadMemory + metadataBudget + MemoryHeadroom
}
