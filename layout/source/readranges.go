package source

import (
	"math"
	"slices"
	"sort"
	"sync"
)

// readRanges remembers which bytes of a file have been read, so that the
// pages dropped after a read are only those holding bytes already read.
//
// The kernel caches a file in folios of up to 2 MiB and drops only those
// wholly inside a FADV_DONTNEED range, so a drop of just the bytes read
// leaves the folios that straddle its ends cached. Widening every drop down
// to the folio boundary below assumed fills come in file order; they do
// not for an HF-sharded view (laid out in save order over shard files that
// safetensors sorts by name), nor quite for parallel read-ahead fills. A
// drop is widened, down and up, to a folio boundary only over bytes already
// read, whatever the order they were read in. Gaps under maxGap between
// reads count as read: they are the record headers and trailers around
// tensor data, and would otherwise keep a folio cached at every record.
type readRanges struct {
	mu   sync.Mutex
	runs []span // GUARDED_BY(mu); sorted, at least maxGap apart
}

type span struct{ start, end int64 }

// maxGap is the largest gap between two reads that counts as read.
const maxGap = 64 << 10

// maxRuns bounds the memory of a file read in a scattered order: past it,
// a drop is the bytes read (the straddling folios stay cached).
const maxRuns = 4096

// add records [start, end) of a file of size bytes as read and returns the
// range to drop: the bytes read, widened to the folio boundary below and
// above where every byte in between has been read (or lies outside the
// file).
func (r *readRanges) add(start, end, size, folio int64) (int64, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil { // what lies before and after the file counts as read
		r.runs = []span{{math.MinInt64 / 2, 0}, {size, math.MaxInt64 / 2}}
	}
	if !r.insert(start, end) {
		return start, end
	}
	lo, hi := start, end
	if f := start / folio * folio; r.covers(f, start) {
		lo = f
	}
	if c := (end + folio - 1) / folio * folio; r.covers(end, c) {
		hi = c
	}
	return lo, hi
}

// insert merges [start, end) into runs, with the gaps under maxGap that
// separate it from its neighbours; false when runs is full.
func (r *readRanges) insert(start, end int64) bool {
	// i: the first run that ends less than maxGap before start.
	i := sort.Search(len(r.runs), func(i int) bool { return r.runs[i].end+maxGap > start })
	j := i
	for j < len(r.runs) && r.runs[j].start < end+maxGap {
		start, end = min(start, r.runs[j].start), max(end, r.runs[j].end)
		j++
	}
	if i == j && len(r.runs) >= maxRuns {
		return false
	}
	r.runs = slices.Replace(r.runs, i, j, span{start, end})
	return true
}

// covers reports whether every byte of [start, end) has been read.
func (r *readRanges) covers(start, end int64) bool {
	if start >= end {
		return true
	}
	i := sort.Search(len(r.runs), func(i int) bool { return r.runs[i].end > start })
	return i < len(r.runs) && r.runs[i].start <= start && r.runs[i].end >= end
}

// pendingDrops batches the page-cache drops of a file. A FADV_DONTNEED is
// not cheap where it matters: when pages read by another CPU are still in
// that CPU's LRU batch, the kernel drains every CPU's batch
// (lru_add_drain_all, one system-wide mutex), so one drop per 1 MiB read
// serialises parallel readers on a many-core host. Touching drop ranges are
// merged and dropped once they span dropBatch bytes; a few runs are kept
// apart for readers at different places of one file.
type pendingDrops struct {
	mu   sync.Mutex
	runs []span // GUARDED_BY(mu); disjoint, at most maxPending, oldest first
}

// dropBatch is the size at which merged drop ranges are dropped.
const dropBatch = 16 << 20

// maxPending bounds the separate ranges waiting to be dropped.
const maxPending = 8

// add queues [start, end) and returns the ranges to drop now.
func (p *pendingDrops) add(start, end int64) []span {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.runs); i++ {
		r := p.runs[i]
		if r.end < start || end < r.start { // neither overlapping nor touching
			continue
		}
		start, end = min(start, r.start), max(end, r.end)
		p.runs = slices.Delete(p.runs, i, i+1)
		i--
	}
	if end-start >= dropBatch {
		return []span{{start, end}}
	}
	p.runs = append(p.runs, span{start, end})
	if len(p.runs) > maxPending {
		oldest := p.runs[0]
		p.runs = slices.Delete(p.runs, 0, 1)
		return []span{oldest}
	}
	return nil
}

// flush returns every range still waiting.
func (p *pendingDrops) flush() []span {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.runs
	p.runs = nil
	return out
}
