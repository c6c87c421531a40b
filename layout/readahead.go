package layout

import (
	"cmp"
	"slices"
	"sync"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Fetching ahead. A FUSE client has a few reads of a view in flight at a
// time (the kernel's read-ahead of the view), and each is served by a
// pread of a shard: on a disk, that is a queue far too shallow to read at
// the disk's speed. A reader that goes on where its last read ended asks,
// through ReadAhead, for the source bytes of the next stretch of the view
// to be fetched in the background (into the page cache of local shards),
// so that its reads are copies from memory while the disk works ahead.

// Prefetch starts fetching the source bytes of the view's [off, off+n) and
// returns without waiting: a hint, which fetches nothing where the source
// cannot (an object store) and reports no error (the read will). Ranges of
// one shard file that lie close together are fetched as one.
func (f *File) Prefetch(off, n int64) {
	end := min(off+n, f.Size)
	if off < 0 || off >= end {
		return
	}
	switch f.Kind {
	case KindPassthrough:
		f.src.Prefetch(off, end-off)
	case KindSafetensors:
		var exts []extent
		add := func(file *ckpt.File, at, n int64) { exts = append(exts, extent{file, at, at + n}) }
		_ = f.tensorsIn(off, end, func(pl *Placement, lo, hi int64) error {
			pl.content.hint(lo, hi, add)
			return nil
		})
		for _, e := range coalesce(exts) {
			e.file.Prefetch(e.start, e.end-e.start)
		}
	}
}

// extent is a byte range [start, end) of a checkpoint file.
type extent struct {
	file       *ckpt.File
	start, end int64
}

// mergeGap is the largest gap between two ranges of one file fetched as
// one: the record headers between a shard's chunks, and small tensors.
const mergeGap = 256 << 10

// coalesce sorts extents by file and offset and merges those that overlap
// or lie less than mergeGap apart.
func coalesce(exts []extent) []extent {
	slices.SortFunc(exts, func(a, b extent) int {
		return cmp.Or(cmp.Compare(a.file.Path, b.file.Path), cmp.Compare(a.start, b.start))
	})
	var out []extent
	for _, e := range exts {
		if n := len(out); n > 0 && out[n-1].file == e.file && e.start <= out[n-1].end+mergeGap {
			out[n-1].end = max(out[n-1].end, e.end)
			continue
		}
		out = append(out, e)
	}
	return out
}

// ReadAhead follows the readers of one open view file and fetches ahead
// of each that reads on from where it was: the source bytes of the next
// Depth bytes of the view, asked for half a depth at a time. A read that
// continues no stream starts one (a lone read fetches nothing ahead); a
// few streams are followed at once, for readers of one handle at different
// places (threads of one process, mmap faults).
type ReadAhead struct {
	file  Prefetcher
	size  int64 // the file's
	depth int64

	mu      sync.Mutex
	streams [maxStreams]stream // GUARDED_BY(mu)
	clock   uint64             // GUARDED_BY(mu)
}

// stream is one sequential reader: where its reads have got to, and how
// far ahead of that its bytes have been asked for.
type stream struct {
	next, ahead int64
	used        uint64 // clock of its last read; 0: unused
}

const (
	maxStreams = 4
	// streamSlack is how far past a stream's end a read may start and
	// still continue it: the kernel sends a reader's read-ahead as several
	// requests at once, which arrive in any order.
	streamSlack = 4 << 20
)

// fetching bounds the hints being issued at once, process-wide: a hint
// that would wait for a slot is dropped (the next read asks again).
var fetching = make(chan struct{}, 16)

// Prefetcher fetches ahead: a File, or what wraps one.
type Prefetcher interface {
	Prefetch(off, n int64)
}

// NewReadAhead follows the readers of f, of size bytes, fetching depth
// bytes ahead.
func NewReadAhead(f Prefetcher, size, depth int64) *ReadAhead {
	return &ReadAhead{file: f, size: size, depth: depth}
}

// Reading is told of a read of [off, off+n) as it starts.
func (r *ReadAhead) Reading(off, n int64) {
	from, to, ok := r.advance(off, off+n)
	if !ok {
		return
	}
	select {
	case fetching <- struct{}{}:
	default:
		r.retract(from)
		return
	}
	go func() {
		defer func() { <-fetching }()
		r.file.Prefetch(from, to-from)
	}()
}

// advance moves the stream the read [off, end) continues, or starts one,
// and returns the view range to fetch now, if any.
func (r *ReadAhead) advance(off, end int64) (from, to int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock++
	s := r.continued(off)
	if s == nil {
		s = &r.streams[0]
		for i := range r.streams {
			if r.streams[i].used < s.used {
				s = &r.streams[i]
			}
		}
		*s = stream{next: end, ahead: end, used: r.clock}
		return 0, 0, false
	}
	s.used = r.clock
	s.next = max(s.next, end)
	if s.ahead-s.next >= r.depth/2 || s.next >= r.size {
		return 0, 0, false
	}
	from, to = max(s.ahead, s.next), min(s.next+r.depth, r.size)
	s.ahead = to
	return from, to, true
}

// continued is the stream a read at off continues, if any.
func (r *ReadAhead) continued(off int64) *stream {
	for i := range r.streams {
		if s := &r.streams[i]; s.used != 0 && off >= s.next-r.depth && off <= s.next+streamSlack {
			return s
		}
	}
	return nil
}

// retract forgets a fetch that was not issued, so the next read asks again.
func (r *ReadAhead) retract(from int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.streams {
		if s := &r.streams[i]; s.used != 0 && s.ahead > from && s.next <= from {
			s.ahead = from
		}
	}
}
