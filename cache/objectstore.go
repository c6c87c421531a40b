package cache

// Defaults for a source whose every block is a request with tens of
// milliseconds of latency (an object store): larger blocks, more of them
// in flight. Export reads such a source in blocks of ObjectStoreBlockSize
// on ObjectStoreWorkers workers as well, and its disk cache keeps blocks of
// that size.
const (
	ObjectStoreBlockSize = 16 << 20 // faster than 8 MiB against a boto3 download (BENCHMARKS.md, s3://)
	ObjectStorePrefetch  = 8
	ObjectStoreWorkers   = 8
)

// ForObjectStore fits o, whose Size is set, to an object store source.
// The cache keeps a quarter of its blocks as the staging ring and a
// quarter for fills; read-ahead workers leave ristretto at least another
// quarter. The staging ring keeps each block read ahead until it is read,
// and read-ahead runs only as far ahead as the ring can keep (BENCHMARKS.md,
// s3://, and the package doc). Fewer blocks in flight cost less than
// smaller blocks (more requests): only a cache under 8 blocks gets 8 MiB
// ones. The BlockSize and ReadAhead the user gave (keepBlock,
// keepReadAhead) are kept; Workers is set.
func (o Options) ForObjectStore(keepBlock, keepReadAhead bool) Options {
	if !keepBlock || o.BlockSize <= 0 {
		o.BlockSize = ObjectStoreBlockSize
		if o.Size < 8*ObjectStoreBlockSize {
			o.BlockSize = ObjectStoreBlockSize / 2
		}
	}
	n := int(o.Size / o.BlockSize)
	o.Workers = max(1, min(ObjectStoreWorkers, n/4))
	if !keepReadAhead {
		o.ReadAhead = min(ObjectStorePrefetch, o.Workers)
	}
	return o
}

// ObjectStoreAheadSpans bounds what an object store's reads fetch ahead,
// in requests of one block (ForObjectStoreAhead).
const ObjectStoreAheadSpans = 8

// ForObjectStoreAhead is ForObjectStore with room taken out of Size for
// what each object's reads fetch ahead (objstore.Limits): a read that
// follows its object's last one asks for at least a block (minRequest), so
// that a block's extents in one object, the record headers between them,
// and the next blocks' are one request, and what it fetched beyond the
// read is kept, within memory: up to ObjectStoreAheadSpans blocks, a quarter
// of Size at most, none where that is under two. The cache gets the rest,
// fitted again, so the two together keep within Size (BENCHMARKS.md,
// run X-objectstore).
func (o Options) ForObjectStoreAhead(keepBlock, keepReadAhead bool) (c Options, minRequest, memory int64) {
	o = o.ForObjectStore(keepBlock, keepReadAhead)
	n := min(ObjectStoreAheadSpans, o.Size/4/o.BlockSize)
	if n < 2 {
		return o, 0, 0
	}
	memory = n * o.BlockSize
	o.Size -= memory
	return o.ForObjectStore(true, keepReadAhead), o.BlockSize, memory
}
