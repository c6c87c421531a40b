package view

import (
	"cmp"
	"hash/crc32"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// A read of view bytes is planned before any byte moves.
//
//  1. Each tensor in the window adds the source ranges its bytes come from
//     (extents), each with its destinations in source order: a stored chunk
//     is one extent, a column block one extent scattered over its rows, a
//     permuted row one extent, a converted piece extents into scratch that
//     is converted once the reads are done.
//  2. Extents are sorted by where they lie (ckpt.Locator: file and offset)
//     and neighbours in a file are merged, across gaps of up to mergeGap
//     read into scratch, so a range of a file is one read whatever the
//     tensors, rows or runs it holds; a read fills its destinations with
//     preadv, with no copy.
//  3. Each file's reads go in file order and are checked for freshness once,
//     after the batch (ckpt.File.ReadRanges); different files are read
//     concurrently, at most readDepth at a time.
//
// An extent its source filled while locating it (ckpt.Filler: a small
// record's data, read with its headers) is not read again. Locating reads
// a file unchecked (ckpt.Location.Unchecked) before any read of the plan,
// so the file's check after its reads covers the locating too; a file the
// plan locates in and does not read is checked once after the reads.
//
// Sources that cannot say where they lie (compressed records, memory in
// tests) are read with their own ReadAt, merged only with their own
// neighbours.
type readPlan struct {
	extents []extent
	parts   [][]byte // extents' destinations
	after   []func() error
	bufs    []*[]byte

	// Filled by run.
	keys   []any  // distinct extent keys
	read   []bool // by key: a file the plan reads (ReadRanges checks it)
	order  []int  // extents by key, then offset
	iovs   [][]byte
	reads  []planRead
	ranges []ckpt.Range
}

// extent is n bytes of src from off, landing in parts[p0:p1].
type extent struct {
	g      *geometry // the tensor and chunk, for messages
	c      *chunkGeometry
	off, n int64
	p0, p1 int
	whole  bool // all of the chunk's bytes

	// Set by locate.
	key       int // index in keys: the file, or the source when not located
	file      *ckpt.File
	at        int64 // where off lies in file (or in the source)
	check     ckpt.WholeChecker
	filled    bool // locating filled the parts (ckpt.Filler): no read
	unchecked bool // locating read file unchecked (ckpt.Location.Unchecked)
}

// planRead is one merged read: extents order[e0:e1] of one key, into
// iovs[i0:i1] (gaps included), up to end.
type planRead struct {
	key, e0, e1, i0, i1 int
	end                 int64
}

// mergeGap is the largest gap between two extents of a file that are read
// as one (the gap into scratch): a RoPE window inside a head skips every
// other row, records have headers between their data.
var mergeGap int64 = 64 << 10 // a variable for tests

// readDepth bounds the files one read reads at once.
const readDepth = 8

var plans = sync.Pool{New: func() any { return new(readPlan) }}

func newPlan() *readPlan { return plans.Get().(*readPlan) }

// release drops every reference to the caller's buffers and recycles the
// plan.
func (p *readPlan) release() {
	for _, bp := range p.bufs {
		putBuf(bp)
	}
	clear(p.parts)
	clear(p.iovs)
	clear(p.keys)
	clear(p.after)
	clear(p.extents)
	clear(p.ranges)
	p.extents, p.parts, p.after, p.bufs = p.extents[:0], p.parts[:0], p.after[:0], p.bufs[:0]
	p.keys, p.order, p.iovs, p.reads, p.ranges = p.keys[:0], p.order[:0], p.iovs[:0], p.reads[:0], p.ranges[:0]
	p.read = p.read[:0]
	plans.Put(p)
}

// begin starts an extent of chunk c of g's tensor at off; part adds its
// destinations, in source order.
func (p *readPlan) begin(g *geometry, c *chunkGeometry, off int64, whole bool) {
	p.extents = append(p.extents, extent{g: g, c: c, off: off, p0: len(p.parts), p1: len(p.parts), whole: whole})
}

func (p *readPlan) part(b []byte) {
	e := &p.extents[len(p.extents)-1]
	p.parts = append(p.parts, b)
	e.p1++
	e.n += int64(len(b))
}

// buf is scratch of n bytes that lives until the plan is released.
func (p *readPlan) buf(n int64) []byte {
	bp := getBuf(n)
	p.bufs = append(p.bufs, bp)
	return *bp
}

// then runs fn once every read is done.
func (p *readPlan) then(fn func() error) { p.after = append(p.after, fn) }

// run reads every extent, then checks and converts.
func (p *readPlan) run() error {
	for i := range p.extents {
		if err := p.locate(&p.extents[i]); err != nil {
			return err
		}
	}
	p.merge()
	if err := p.readAll(); err != nil {
		return err
	}
	if err := p.checkUnread(); err != nil {
		return err
	}
	for i := range p.extents {
		if e := &p.extents[i]; e.whole && e.check != nil {
			sum := uint32(0)
			for _, b := range p.parts[e.p0:e.p1] {
				sum = crc32.Update(sum, crc32.IEEETable, b)
			}
			if err := e.check.CheckWhole(sum); err != nil {
				return err
			}
		}
	}
	for _, fn := range p.after {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// locate sets where e lies.
func (p *readPlan) locate(e *extent) error {
	var key any = e.c.src
	e.at = e.off
	if l, ok := e.c.src.(ckpt.Locator); ok {
		var loc ckpt.Location
		var err error
		if f, isFiller := l.(ckpt.Filler); isFiller {
			loc, ok, e.filled, err = f.LocateFill(e.off, p.parts[e.p0:e.p1])
		} else {
			loc, ok, err = l.Locate()
		}
		if err != nil {
			return e.g.chunkError(e.c, err)
		}
		if ok {
			key, e.file, e.at, e.check, e.unchecked = loc.File, loc.File, loc.Offset+e.off, loc.Whole, loc.Unchecked
		}
	}
	e.key = slices.Index(p.keys, key)
	if e.key < 0 {
		e.key = len(p.keys)
		p.keys = append(p.keys, key)
		p.read = append(p.read, false)
	}
	return nil
}

// checkUnread checks, once each, the files that locating read unchecked
// and the plan did not read after (every extent there was filled): the
// bytes filled from them are valid only once it passes. A file the plan
// read was checked after its reads, after the locating.
func (p *readPlan) checkUnread() error {
	for i := range p.extents {
		e := &p.extents[i]
		if !e.unchecked || p.read[e.key] {
			continue
		}
		p.read[e.key] = true // checked now
		if err := e.file.Check(); err != nil {
			return e.g.chunkError(e.c, err)
		}
	}
	return nil
}

// merge orders the extents by key and offset and makes the reads: runs of
// extents of one key that follow each other, gaps under mergeGap between.
// Overlapping extents (two view tensors of the same bytes) go in separate
// reads.
func (p *readPlan) merge() {
	for i := range p.extents {
		if !p.extents[i].filled {
			p.order = append(p.order, i)
		}
	}
	slices.SortFunc(p.order, func(a, b int) int {
		ea, eb := &p.extents[a], &p.extents[b]
		return cmp.Or(cmp.Compare(ea.key, eb.key), cmp.Compare(ea.at, eb.at))
	})
	var gap []byte // the key's gaps all land here: its reads are sequential
	for i, k := range p.order {
		e := &p.extents[k]
		if n := len(p.reads); n > 0 {
			r := &p.reads[n-1]
			if d := e.at - r.end; r.key == e.key && d >= 0 && d <= mergeGap {
				if d > 0 {
					if gap == nil {
						gap = p.buf(mergeGap)
					}
					p.iovs = append(p.iovs, gap[:d])
				}
				p.iovs = append(p.iovs, p.parts[e.p0:e.p1]...)
				r.e1, r.i1, r.end = i+1, len(p.iovs), e.at+e.n
				continue
			}
			if r.key != e.key {
				gap = nil
			}
		}
		i0 := len(p.iovs)
		p.iovs = append(p.iovs, p.parts[e.p0:e.p1]...)
		p.reads = append(p.reads, planRead{key: e.key, e0: i, e1: i + 1, i0: i0, i1: len(p.iovs), end: e.at + e.n})
	}
	for _, r := range p.reads {
		p.ranges = append(p.ranges, ckpt.Range{Off: p.extents[p.order[r.e0]].at, Parts: p.iovs[r.i0:r.i1:r.i1]})
		p.read[r.key] = true
	}
}

// readAll does the reads, a file's in order, different files at once.
func (p *readPlan) readAll() error {
	// Reads of one key are consecutive: a group each.
	type group struct{ r0, r1 int }
	gs := make([]group, 0, readDepth)
	for i, r := range p.reads {
		if n := len(gs); n > 0 && p.reads[gs[n-1].r0].key == r.key {
			gs[n-1].r1 = i + 1
			continue
		}
		gs = append(gs, group{i, i + 1})
	}
	switch len(gs) {
	case 0:
		return nil
	case 1:
		return p.readGroup(gs[0].r0, gs[0].r1)
	}
	var eg errgroup.Group
	eg.SetLimit(readDepth)
	for _, g := range gs {
		eg.Go(func() error { return p.readGroup(g.r0, g.r1) })
	}
	return eg.Wait()
}

// readGroup does reads[r0:r1], all of one key. An error names the first
// tensor of the read that failed (of the group's last read when the
// freshness check after them failed: it names the file).
func (p *readPlan) readGroup(r0, r1 int) error {
	failed := func(i int, err error) error {
		e := &p.extents[p.order[p.reads[min(i, r1-1)].e0]]
		return e.g.chunkError(e.c, err)
	}
	if f := p.extents[p.order[p.reads[r0].e0]].file; f != nil {
		if i, err := f.ReadRanges(p.ranges[r0:r1]); err != nil {
			return failed(r0+i, err)
		}
		return nil
	}
	for i := r0; i < r1; i++ {
		if err := source.ReadParts(p.extents[p.order[p.reads[i].e0]].c.src, p.ranges[i].Parts, p.ranges[i].Off); err != nil {
			return failed(i, err)
		}
	}
	return nil
}
