package torchdcp

import (
	"container/list"
	"sync"
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// recordCache keeps the small zstd records (up to memRecordLimit,
// decompressed) that a checkpoint's chunks read last, within a bound the
// checkpoint counts from its open (recordSource.ResidentBytes): kept for
// every chunk located, as they were, they held the checkpoint's bytes
// themselves, counted nowhere. A record dropped is decompressed again on
// its chunk's next read (and its CRC32 checked again); one kept spares a
// chunk read in several pieces a decompression per piece (BENCHMARKS.md,
// run AD-resident).
type recordCache struct {
	mu    sync.Mutex
	bound int64 // the most the records kept hold
	used  int64
	lru   list.List // of *cachedRecord, the most recently read first
}

type cachedRecord struct {
	loc  *chunkBytes // whose elem is this record's, under mu
	data []byte
}

// recordBudget is a checkpoint's bound for its decompressed records: at
// least two of the largest kept in memory (memRecordLimit, in a buffer
// that may have grown to twice that). A variable for tests.
var recordBudget int64 = 4 << 20

func newRecordCache() *recordCache {
	return &recordCache{bound: recordBudget}
}

// resident is the cache, at its bound.
func (rc *recordCache) resident() int64 {
	return int64(unsafe.Sizeof(*rc)) + rc.bound
}

// recordHeap bounds what the allocator takes for a record's buffer of
// capacity n, and for its entry in the cache.
func recordHeap(n int64) int64 {
	const entry = 128 // its list element and cachedRecord
	return ckpt.HeapSize(n) + entry
}

// get is the record of the chunk located at loc, if kept.
func (rc *recordCache) get(loc *chunkBytes) []byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if loc.elem == nil {
		return nil
	}
	rc.lru.MoveToFront(loc.elem)
	return loc.elem.Value.(*cachedRecord).data
}

// put keeps the record of the chunk located at loc, dropping those read
// longest ago while the cache is past its bound.
func (rc *recordCache) put(loc *chunkBytes, data []byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if loc.elem != nil {
		return
	}
	loc.elem = rc.lru.PushFront(&cachedRecord{loc: loc, data: data})
	rc.used += recordHeap(int64(cap(data)))
	for rc.used > rc.bound && rc.lru.Len() > 1 {
		old := rc.lru.Remove(rc.lru.Back()).(*cachedRecord)
		old.loc.elem = nil
		rc.used -= recordHeap(int64(cap(old.data)))
	}
}
