package readpath

import (
	"runtime"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ckptfs/ckptfs/cache"
)

// Source describes what a mount (or an inspect or export) reads, as its
// flags and the host give it, for For.
type Source struct {
	// Remote is an object store (s3://, gs://, az://); else a local
	// directory.
	Remote bool
	// Export is the policy of inspect and export, which read a view once,
	// in order, with no block cache: Policy.Cache.BlockSize and Workers are
	// then the blocks export reads and how many at once (Workers given:
	// WorkersGiven).
	Export       bool
	WorkersGiven bool
	// Cache is the block cache the flags ask for (Size, BlockSize,
	// ReadAhead, ...); BlockSizeGiven and ReadAheadGiven say the user set
	// those, and an object store keeps them.
	Cache                          cache.Options
	BlockSizeGiven, ReadAheadGiven bool
	// FetchAhead streams each object read in order (remote only): see
	// Policy.MinRequest.
	FetchAhead bool
	// Budget is the longest a request for n bytes to the store takes to
	// fail, its retries included (open.Limits.Budget); remote only.
	Budget func(n int64) time.Duration
	// AsyncDIO is --async-dio when given; nil: For picks.
	AsyncDIO *bool
	// Cores and Memory are the host's: its CPUs (0: runtime.NumCPU) and
	// its memory in bytes (0: the kernel's MemTotal; < 0: not known).
	Cores  int
	Memory int64
}

// Policy is how a mount moves a view's bytes, picked in one place from its
// Source: the block cache, what an object store's reads fetch ahead, each
// read's deadline, and the process's memory limit (MemoryLimit).
type Policy struct {
	Cache cache.Options
	// MinRequest and AheadMemory are the streams of each object read in
	// order (objstore.Limits): a read at an object's frontier is one
	// request of MinRequest bytes, its body kept for the reads that follow,
	// within AheadMemory across the mount, taken out of the cache's size;
	// 0: every read is its own request.
	MinRequest, AheadMemory int64
	// Replies is what a remote mount keeps of the cache size for the
	// rest of its heap (see remoteReplies), taken out of the block cache's
	// Size; 0 for a local source.
	Replies int64
	// ReadDeadline bounds each read served through the cache; 0: none.
	ReadDeadline time.Duration
	// AsyncDIO sends an O_DIRECT read's FUSE requests at once
	// (vfs.MountOptions.AsyncDIO): unless given, for a local source only.
	// The kernel then waits for them without interruption, and a store's
	// stalled read must end at the reader's interrupt; local reads do not
	// stall so.
	AsyncDIO bool
}

// Defaults for a source whose every block is a request with tens of
// milliseconds of latency (an object store): larger blocks, more of them
// in flight, and few, large requests.
const (
	ObjectStoreBlockSize = 16 << 20 // faster than 8 MiB against a boto3 download (BENCHMARKS.md, s3://)
	ObjectStorePrefetch  = 8
	// Blocks in flight: workersPerCore a core (requests mostly wait on
	// the store), within [minWorkers, maxWorkers].
	workersPerCore, minWorkers, maxWorkers = 4, 8, 32
	// A stream's request: an eighth of the cache, within
	// [ObjectStoreBlockSize/2, maxRequest]; the memory its bodies are read
	// into as they arrive: half a request for each of two streams a core,
	// at least minStreams (one per shard object of a 4-rank checkpoint),
	// within a quarter of the cache (BENCHMARKS.md, run Y-objectstore).
	maxRequest = 64 << 20
	minStreams = 4
	maxStreams = 16
	// remoteReplies is what an object-store mount's heap holds besides its
	// blocks and streams while it loads: go-fuse's request buffers (42 MiB
	// in from_pretrained through s3://), the scratch of multi-part reads,
	// the runtime's own, and the collector's margin over them; at most a
	// quarter of the cache. Taken out of the block cache, so that blocks,
	// streams and replies together are the cache size given (BENCHMARKS.md,
	// run Z-cache).
	remoteReplies = 80 << 20
	// remoteSlack is the Go limit of a remote mount over its cache size:
	// the cache + 64 MiB its peak RSS keeps within, less the binary's own
	// pages (about 24 MiB), which the limit does not count.
	remoteSlack = 40 << 20
	// exportBlockSize is the unit export reads a local source in.
	exportBlockSize = 8 << 20
	exportWorkers   = 4
)

// For picks the policy of a mount of s (or of an inspect or export:
// Source.Export). A local source keeps the cache the flags give (read
// straight from the shards with Options.DirectReads). An object store's
// cache has larger blocks, more of them in flight (by cores), and, with
// FetchAhead, streams per object read in order (by cache size and cores);
// a read waits for one request, its retries included, at most. Its blocks,
// streams and Replies together are the cache size given, and MemoryLimit
// keeps the process near it. O_DIRECT
// reads are async for a local source (AsyncDIO).
func For(s Source) Policy {
	cores := s.Cores
	if cores <= 0 {
		cores = runtime.NumCPU()
	}
	if s.Memory == 0 {
		s.Memory = memTotal()
	}
	p := Policy{Cache: s.Cache, AsyncDIO: !s.Remote}
	if s.AsyncDIO != nil {
		p.AsyncDIO = *s.AsyncDIO
	}
	if s.Export {
		p.AsyncDIO = false
		if !s.BlockSizeGiven || p.Cache.BlockSize <= 0 {
			p.Cache.BlockSize = exportBlockSize
		}
		if !s.WorkersGiven || p.Cache.Workers <= 0 {
			p.Cache.Workers = exportWorkers
		}
	}
	if !s.Remote {
		return p
	}
	c := s.Cache
	if c.Size <= 0 {
		c.Size = cache.DefaultSize
	}
	if !s.Export {
		p.Replies = min(remoteReplies, c.Size/4)
	}
	given := c.Size
	if s.FetchAhead {
		p.MinRequest = min(maxRequest, max(ObjectStoreBlockSize/2, c.Size/8))
		streams := int64(min(maxStreams, max(minStreams, 2*cores)))
		memory := min(streams*p.MinRequest/2, c.Size/4)
		if s.Memory > 0 {
			memory = min(memory, s.Memory/16)
		}
		if memory < p.MinRequest {
			p.MinRequest = memory
		}
		if p.MinRequest >= 4<<20 {
			p.AheadMemory = memory
		} else {
			p.MinRequest = 0
		}
	}
	c.Size = given - p.AheadMemory - p.Replies
	p.Cache = fitObjectStore(c, s.BlockSizeGiven, s.ReadAheadGiven, cores)
	if s.Export {
		p.Cache.Size = s.Cache.Size
		if s.WorkersGiven && s.Cache.Workers > 0 {
			p.Cache.Workers = s.Cache.Workers
		}
	}
	if s.Budget != nil {
		p.ReadDeadline = s.Budget(max(p.Cache.BlockSize, p.MinRequest))
	}
	return p
}

// fitObjectStore fits o, whose Size is set, to an object store source.
// The cache keeps a quarter of its blocks as the staging ring and a
// quarter for fills; read-ahead workers leave ristretto at least another
// quarter. The staging ring keeps each block read ahead until it is read,
// and read-ahead runs only as far ahead as the ring can keep (BENCHMARKS.md,
// s3://, and package cache's doc). Fewer blocks in flight cost less than
// smaller blocks (more requests): only a cache under 8 blocks gets 8 MiB
// ones. The BlockSize and ReadAhead the user gave (keepBlock,
// keepReadAhead) are kept; Workers is set by cores.
func fitObjectStore(o cache.Options, keepBlock, keepReadAhead bool, cores int) cache.Options {
	if !keepBlock || o.BlockSize <= 0 {
		o.BlockSize = ObjectStoreBlockSize
		if o.Size < 8*ObjectStoreBlockSize {
			o.BlockSize = ObjectStoreBlockSize / 2
		}
	}
	n := int(o.Size / o.BlockSize)
	o.Workers = max(1, min(maxWorkers, max(minWorkers, workersPerCore*cores), n/4))
	if !keepReadAhead {
		o.ReadAhead = min(ObjectStorePrefetch, o.Workers)
	}
	return o
}

// memTotal is the kernel's MemTotal in bytes, -1 if not known.
func memTotal() int64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return -1
	}
	mi, err := fs.Meminfo()
	if err != nil || mi.MemTotalBytes == nil {
		return -1
	}
	return int64(*mi.MemTotalBytes)
}

// MemoryHeadroom is what a mount process may use beyond its block cache,
// its read-ahead and its metadata: blocks in flight, FUSE buffers.
const MemoryHeadroom = 48 << 20

// MemoryLimit is the Go memory limit of a mount whose cache is bounded by
// cacheBound (cache.Cache.Bound). A local source's: the cache, the open
// views' metadata (the LRU closes views beyond metadataBudget; the newest,
// being decoded, may pass it by its own size), and the headroom; below the
// metadata a decode of a large .metadata ran the collector without pause
// (BENCHMARKS.md, run V). A remote source's: the cache size given (blocks,
// streams and Replies) and remoteSlack, so that the garbage of a load is
// collected before the process passes the cache + 64 MiB; a view whose
// metadata passes that raises the limit with its live heap
// (internal/memlimit), as it would a local source's.
func (p Policy) MemoryLimit(cacheBound, metadataBudget int64) int64 {
	if p.Replies > 0 {
		return cacheBound + p.AheadMemory + p.Replies + remoteSlack
	}
	return cacheBound + p.AheadMemory + metadataBudget + MemoryHeadroom
}
