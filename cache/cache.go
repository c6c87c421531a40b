// Package cache is the block cache between the FUSE layer and the virtual
// files of a view.
//
// A virtual file is cut into whole aligned blocks of Options.BlockSize bytes
// (the last one shorter). A block is filled with one ReadAt on the file's
// Source, kept in a ristretto cache keyed by (file id, block index) with a cost
// of its length in bytes, and serves the many small kernel reads that fall in
// it. Concurrent misses on one block share one fill (singleflight). A handle
// whose reads are sequential prefetches the next blocks on a small worker pool;
// prefetch is dropped, never waited for, when the pool or the foreground is
// busy.
//
// Two tiers hold the blocks, each block in one of them: every fill goes to
// the staging ring (recency: the blocks filled or used last), and a block
// the ring gives up goes to ristretto (frequency: its admission keeps it
// only if it was asked for more often than what it would evict). The ring
// holds at least Options.Staging blocks and grows into whatever of Size the
// fills in flight and ristretto leave idle; a fill that finds no room makes
// the ring give up a block: one read in full first (every byte of it read,
// whatever the order and however often: block.consumed; not offered to
// ristretto), else its least recently used one (issue 36: a loader that
// faults tensors in state-dict order touches a block at moments far apart,
// and a ring of fixed size beside a fixed reserve for fills that are rarely
// all in flight fetched 1.5x the view). A fill of a file larger than the
// cache first makes the ring give up a block of that file read in full,
// while the ring holds more than its minimum, and takes its buffer: a
// stream through such a file cycles through the ring's minimum instead of
// taking the whole cache in fresh buffers (their first touch is a page
// fault per 4 KiB: BENCHMARKS.md run AB-faults), and the blocks of the
// files that fit stay. A prefetched block stays in the
// ring until its reader has used it, and read-ahead goes only as far as the
// ring's minimum can keep: a sequential read fetches each block once.
//
// Invariants (each one is checked in the tests):
//   - Partial data is never visible: a fill that fails caches nothing and
//     returns its error to every reader waiting on it; a later read retries.
//   - The cache is never the source of truth: ristretto may drop or reject any
//     Set, and a key collision is detected (a block carries its own id and
//     index), so a read after a lost Set just fills again.
//   - Memory is bounded by Size (see Bound), in one account (buffers): the
//     blocks being filled, staged, cached and the buffers kept for reuse.
//     ristretto gets what is left of Size after the ring's minimum and the
//     blocks being filled, which are capped: at most MaxFills foreground
//     fills at once (more readers wait for a slot, and readers of one block
//     share its fill) plus one per read-ahead worker. The ring takes more
//     only while the account has room, and gives it back to the next fill.
//   - A block's bytes never change while anyone can read them: its buffer
//     is reused only after every holder let go (see block), so an evicted
//     block still being copied or replied with stays valid.
//   - A foreground read never waits for a prefetch it did not ask for, except
//     to join a fill of the very block it needs.
//
// Lock order: Cache.mu (read-locked for the whole of a foreground read) before
// Handle.mu before staging.mu before buffers.mu; Cache.pmu and a block's
// servedSet.mu are leaves. No lock is held while calling a Source except
// Cache.mu in read mode (a foreground read may wait for a fill slot holding
// it).
package cache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"golang.org/x/sync/singleflight"
)

// Defaults for zero fields of Options.
const (
	DefaultSize      = 512 << 20
	DefaultBlockSize = 4 << 20
	DefaultReadAhead = 4
	DefaultWorkers   = 2
)

// Limits of Options beyond which New refuses, rather than sizing itself for
// memory it cannot have: ristretto's counters grow with Size/BlockSize, the
// read-ahead queue with ReadAhead.
const (
	MaxBlocks    = 1 << 22 // Size / BlockSize: 10 counters each, ~200 MiB of them at most
	MaxReadAhead = 256
)

// ErrClosed is returned by reads on a closed Handle or a closed Cache.
var ErrClosed = errors.New("cache: closed")

// Options configure a Cache. Zero fields take defaults, except ReadAhead:
// 0 disables read-ahead (use DefaultOptions for the default of 4).
type Options struct {
	// Size bounds the bytes of every block the cache holds: cached, staged
	// and being filled (default 512 MiB). See Cache.Bound for caches too
	// small for their reserve.
	Size      int64
	BlockSize int64 // bytes per block (default 4 MiB)
	ReadAhead int   // blocks to prefetch ahead on sequential access (0 disables; DefaultOptions has 4)
	Workers   int   // read-ahead worker pool size (default 2)

	// QueueSize is the capacity of the read-ahead queue in blocks; a prefetch
	// that does not fit is dropped (default 2 × Workers × ReadAhead).
	QueueSize int
	// BusyFills: when this many foreground fills are in flight, prefetch is
	// dropped instead of competing with them (default 2 × Workers).
	BusyFills int
	// Staging is how many recently filled blocks the staging ring keeps at
	// least, whatever ristretto holds, so that the reads that follow a fill
	// (the rest of a sequential stream's block, the blocks just prefetched)
	// do not refill it (default 2 × (ReadAhead + Workers), at most a
	// quarter of Size, at least 1); it keeps more while Size has room.
	// Blocks prefetched and not yet used stay until used (see staging);
	// read-ahead runs at most Staging − 2 blocks ahead of the blocks being
	// read.
	Staging int
	// FillObserver, when set, is called after every fill (foreground or
	// prefetch, failed or not) with the time its Source read took: the
	// fill-latency histogram of the metrics endpoint.
	FillObserver func(took time.Duration, err error)
	// MaxFills bounds the foreground fills in flight: a read that misses
	// while MaxFills other blocks are being filled waits for one to finish
	// (default a quarter of Size in blocks, 2 to 16). Read-ahead adds at
	// most one fill per worker.
	MaxFills int
}

func (o Options) withDefaults() (Options, error) {
	if o.Size < 0 || o.BlockSize < 0 || o.ReadAhead < 0 || o.Workers < 0 ||
		o.QueueSize < 0 || o.BusyFills < 0 || o.Staging < 0 || o.MaxFills < 0 {
		return o, fmt.Errorf("cache: negative option in %+v", o)
	}
	if o.ReadAhead > MaxReadAhead {
		return o, fmt.Errorf("cache: read-ahead of %d blocks is over %d", o.ReadAhead, MaxReadAhead)
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.QueueSize == 0 {
		o.QueueSize = max(1, 2*o.Workers*o.ReadAhead)
	}
	if o.BusyFills == 0 {
		o.BusyFills = 2 * o.Workers
	}
	if n := o.Size / o.BlockSize; n > MaxBlocks {
		return o, fmt.Errorf("cache: %d blocks (size %d, block size %d) is over %d", n, o.Size, o.BlockSize, MaxBlocks)
	}
	quarter := int(min(o.Size/o.BlockSize/4, 1<<20))
	if o.Staging == 0 {
		o.Staging = max(1, min(2*(o.ReadAhead+o.Workers), quarter))
	}
	if o.MaxFills == 0 {
		o.MaxFills = max(2, min(16, quarter))
	}
	return o, nil
}

// reserve is the bytes of the blocks held outside ristretto at most when
// the account is full: the staging ring's minimum and the fills in flight
// (foreground and read-ahead).
func (o Options) reserve() int64 {
	return int64(o.Staging+o.MaxFills+o.readAheadWorkers()) * o.BlockSize
}

func (o Options) readAheadWorkers() int {
	if o.ReadAhead <= 0 {
		return 0
	}
	return o.Workers
}

// Stats are cumulative counters since New. Block-level counters count blocks,
// not reads: a read spanning two blocks is two lookups.
type Stats struct {
	BytesServed      int64 `json:"bytes_served"`       // bytes returned by Handle.ReadAt
	Hits             int64 `json:"hits"`               // foreground block lookups found cached (ristretto or staging)
	StagingHits      int64 `json:"staging_hits"`       // of Hits, found only in the staging ring
	Misses           int64 `json:"misses"`             // foreground block lookups that filled or joined a fill
	Fills            int64 `json:"fills"`              // Source reads of a block (foreground and prefetch)
	FillErrors       int64 `json:"fill_errors"`        // fills that failed (nothing cached)
	ReadAheadIssued  int64 `json:"read_ahead_issued"`  // prefetch jobs accepted onto the queue
	ReadAheadHits    int64 `json:"read_ahead_hits"`    // prefetched blocks later used by a foreground read (once per fill)
	ReadAheadDropped int64 `json:"read_ahead_dropped"` // prefetches dropped: queue full, foreground busy, handle closed
	CachedBytes      int64 `json:"cached_bytes"`       // bytes held by ristretto now (and offered to it, not yet refused)
	StagedBytes      int64 `json:"staged_bytes"`       // bytes in the staging ring now (none also in ristretto)
	FillingBytes     int64 `json:"filling_bytes"`      // bytes of the blocks being filled now
	FreeBytes        int64 `json:"free_bytes"`         // bytes of block buffers kept for the next fills
	BuffersReused    int64 `json:"buffers_reused"`     // fills into a kept buffer instead of a fresh one
	StagingSpilled   int64 `json:"staging_spilled"`    // blocks the ring gave up to make room for a fill (offered to ristretto unless read in full)
	KeysAdded        int64 `json:"keys_added"`         // ristretto admissions
	KeysEvicted      int64 `json:"keys_evicted"`       // ristretto evictions
	SetsRejected     int64 `json:"sets_rejected"`      // ristretto Sets refused by the admission policy
	SetsDropped      int64 `json:"sets_dropped"`       // ristretto Sets dropped because its buffer was full
	OpenHandles      int64 `json:"open_handles"`       // handles opened and not yet closed
}

// Source is an immutable virtual file: ReadAt must return exactly the bytes;
// it may return io.EOF together with a full read that ends at the file's end.
type Source interface {
	io.ReaderAt
}

// file is what a Handle knows about its virtual file.
type file struct {
	id      uint64
	src     Source
	size    int64
	nblocks int64
}

type job struct {
	h   *Handle
	idx int64
}

// Cache is a block cache shared by all handles of all files of a mount.
type Cache struct {
	opts Options
	rc   *ristretto.Cache[uint64, *block]
	sf   singleflight.Group
	stg  staging
	// keyFn maps (id, block) to the ristretto key. Collisions are harmless
	// (see block); tests replace it to force them.
	keyFn func(id uint64, idx int64) uint64

	// mu is read-locked by every foreground read and write-locked by Close,
	// so that ristretto is never used after (or while) it is closed.
	mu     sync.RWMutex
	closed bool // GUARDED_BY(mu)

	queue     chan job
	stop      chan struct{}
	workers   sync.WaitGroup
	closeOnce sync.Once

	// pending counts read-ahead jobs queued or running (for Wait).
	pmu     sync.Mutex
	pcond   *sync.Cond
	pending int // GUARDED_BY(pmu)

	// failed remembers the blocks whose foreground fill failed lately.
	failed failures
	// detached holds a token per wait for a fill that runs on after its
	// reader stopped waiting (getBlockCtx).
	detached chan struct{}

	fgFills   atomic.Int64  // foreground-led fills in flight
	fillSlots chan struct{} // one token per foreground fill in flight (MaxFills)
	bufs      *buffers      // the account of every block's bytes, and the buffers kept

	bytesServed, hits, stagingHits, misses, fills, fillErrors atomic.Int64
	raIssued, raHits, raDropped, openHandles, spilled         atomic.Int64
}

// New returns a Cache and starts its read-ahead workers (none when ReadAhead
// is 0). Close it to stop them.
func New(opts Options) (*Cache, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	// Size bounds everything the cache holds: ristretto gets what the
	// staging ring's minimum and the fills in flight leave (nothing useful
	// when they take it all: then only staged blocks are kept).
	maxCost := max(1, o.Size-o.reserve())
	nblocks := max(1, maxCost/o.BlockSize)
	rc, err := ristretto.NewCache(&ristretto.Config[uint64, *block]{
		NumCounters:        max(100, 10*nblocks),
		MaxCost:            maxCost,
		BufferItems:        64,
		Metrics:            true,
		IgnoreInternalCost: true,
		OnExit:             (*block).leaveRC,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	c := &Cache{
		opts:      o,
		rc:        rc,
		keyFn:     blockKey,
		stop:      make(chan struct{}),
		fillSlots: make(chan struct{}, o.MaxFills),
		detached:  make(chan struct{}, maxDetached),
		bufs:      &buffers{size: o.BlockSize, limit: max(o.Size, o.reserve()+1)},
	}
	c.stg = newStaging(o.Staging)
	c.stg.acct = c.bufs
	c.stg.limit = max(o.Staging, int(min(o.Size/o.BlockSize, maxStaged)))
	c.pcond = sync.NewCond(&c.pmu)
	if o.ReadAhead > 0 {
		c.queue = make(chan job, o.QueueSize)
		for range o.Workers {
			c.workers.Add(1)
			go c.worker()
		}
	}
	return c, nil
}

// Held is the bytes of the blocks the cache holds now (cached, staged,
// being filled, kept for reuse): at most Bound.
func (c *Cache) Held() int64 { return c.bufs.gauges().sum() }

// Options returns the options in effect, defaults filled in.
func (c *Cache) Options() Options { return c.opts }

// Bound is the most bytes of blocks the cache holds at once, counting
// ristretto, the staging ring and the fills in flight: Size, unless Size is
// smaller than the staging ring and fills alone. Blocks that were evicted or
// rejected but are still being copied by a reader, or not yet collected by
// the GC, are not held and not counted.
func (c *Cache) Bound() int64 {
	return max(c.opts.Size, c.opts.reserve()+1)
}

// Close stops the read-ahead workers (waiting for fills they are running),
// waits for foreground reads in progress, and releases the cache. Reads after
// Close return ErrClosed. Close is idempotent. It waits for every Source call
// in flight, so a Source must return, and must not read through this Cache.
func (c *Cache) Close() {
	c.closeOnce.Do(func() {
		close(c.stop)
		c.workers.Wait()
		c.mu.Lock()
		c.closed = true
		// Drop what is still queued: no worker will take it, and with mu
		// held no foreground read can add more.
		for drained := false; !drained && c.queue != nil; {
			select {
			case <-c.queue:
				c.stg.unreserve()
				c.raDropped.Add(1)
				c.jobDone()
			default:
				drained = true
			}
		}
		c.rc.Close()
		c.stg.clear()
		c.bufs.drop()
		c.mu.Unlock()
	})
}

// Wait blocks until queued read-ahead has run and ristretto has applied the
// Sets buffered so far. It is for tests and benchmarks: a block filled before
// Wait is then visible to Get if ristretto admitted it.
func (c *Cache) Wait() {
	c.pmu.Lock()
	for c.pending > 0 {
		c.pcond.Wait()
	}
	c.pmu.Unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.closed {
		c.rc.Wait()
	}
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	// The account is read at one instant: its parts stay within Size
	// together, which reading them apart could overstate while a block
	// moves from one to another.
	a := c.bufs.gauges()
	s := Stats{
		FillingBytes:     a.filling,
		FreeBytes:        a.free,
		StagedBytes:      a.staged,
		CachedBytes:      a.cached,
		StagingSpilled:   c.spilled.Load(),
		BytesServed:      c.bytesServed.Load(),
		Hits:             c.hits.Load(),
		StagingHits:      c.stagingHits.Load(),
		BuffersReused:    c.bufs.reused.Load(),
		Misses:           c.misses.Load(),
		Fills:            c.fills.Load(),
		FillErrors:       c.fillErrors.Load(),
		ReadAheadIssued:  c.raIssued.Load(),
		ReadAheadHits:    c.raHits.Load(),
		ReadAheadDropped: c.raDropped.Load(),
		OpenHandles:      c.openHandles.Load(),
	}
	if m := c.rc.Metrics; m != nil {
		s.KeysAdded = int64(m.KeysAdded())
		s.KeysEvicted = int64(m.KeysEvicted())
		s.SetsRejected = int64(m.SetsRejected())
		s.SetsDropped = int64(m.SetsDropped())
	}
	return s
}

// blockKey mixes (id, idx) into a ristretto key (splitmix64 finalizer).
func blockKey(id uint64, idx int64) uint64 {
	return mix64(mix64(id+0x9e3779b97f4a7c15) ^ uint64(idx))
}

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (f *file) blockLen(idx int64, bs int64) int64 {
	return min(bs, f.size-idx*bs)
}

// lookup returns the block if ristretto or the staging ring holds it. The
// block's identity and length are checked, so a key collision is a miss.
// The block is not acquired: it may be dead by the time the caller looks.
func (c *Cache) lookup(f *file, idx int64) (b *block, staged, ok bool) {
	want := f.blockLen(idx, c.opts.BlockSize)
	if b, ok := c.rc.Get(c.keyFn(f.id, idx)); ok && b.id == f.id && b.idx == idx && int64(len(b.data)) == want {
		return b, false, true
	}
	if b := c.stg.get(f.id, idx); b != nil && int64(len(b.data)) == want {
		return b, true, true
	}
	return nil, false, false
}

// FillError is returned when a block cannot be filled from its Source.
type FillError struct {
	ID    uint64 // file id
	Block int64  // block index
	Off   int64  // byte offset of the block in the file
	Len   int64  // block length
	Err   error  // what the Source returned
}

func (e *FillError) Error() string {
	return fmt.Sprintf("cache: fill block %d [%d, %d) of file %d: %v", e.Block, e.Off, e.Off+e.Len, e.ID, e.Err)
}

func (e *FillError) Unwrap() error { return e.Err }

// fill reads block idx of f from its Source, once however many callers ask
// at the same time, and offers it to ristretto and the staging ring. A failed
// fill caches nothing; every caller sharing it gets the error. The caller
// that led the fill (led) holds a reference to the block; the others must
// acquire one, and the block may be dead by then. A prefetch names the
// handle it reads ahead for (owner) and holds a staging reservation, which
// fill gives back.
func (c *Cache) fill(f *file, idx int64, owner *Handle) (b *block, led bool, err error) {
	prefetch := owner != nil
	var ownerClosed *atomic.Bool
	staged := false // the reservation went to the staging ring with the block
	if prefetch {
		ownerClosed = owner.closed
		defer func() {
			if !staged {
				c.stg.unreserve()
			}
		}()
	}
	var k [16]byte
	binary.LittleEndian.PutUint64(k[:8], f.id)
	binary.LittleEndian.PutUint64(k[8:], uint64(idx))
	v, err, _ := c.sf.Do(string(k[:]), func() (any, error) {
		led = true // fn runs on the goroutine of the caller that leads
		// A fill that finished between the caller's lookup and Do is
		// in the staging ring (synchronously), so this catches it.
		if b, _, ok := c.lookup(f, idx); ok && b.acquire() {
			return b, nil
		}
		if !prefetch {
			c.fgFills.Add(1)
			defer c.fgFills.Add(-1)
			c.fillSlots <- struct{}{} // read-ahead workers have their own budget
			defer func() { <-c.fillSlots }()
		}
		c.fills.Add(1)
		off := idx * c.opts.BlockSize
		n := f.blockLen(idx, c.opts.BlockSize)
		c.reuseRead(f)
		buf := c.buffer(n)
		start := time.Now()
		got, err := f.src.ReadAt(buf, off)
		switch {
		case int64(got) == n:
			err = nil
		case err == nil || errors.Is(err, io.EOF):
			err = io.ErrUnexpectedEOF
		}
		if observe := c.opts.FillObserver; observe != nil {
			observe(time.Since(start), err)
		}
		if err != nil {
			// The buffer is left to the GC, not reused: a failed fill is
			// rare, and nothing then has to trust that a failing Source
			// stopped writing into it.
			c.bufs.filled(buf)
			c.fillErrors.Add(1)
			ferr := &FillError{ID: f.id, Block: idx, Off: off, Len: n, Err: err}
			if !prefetch {
				c.failed.add(c.keyFn(f.id, idx), ferr)
			}
			return nil, ferr
		}
		if !prefetch {
			c.failed.forget(c.keyFn(f.id, idx))
		}
		b := &block{id: f.id, idx: idx, data: buf, bufs: c.bufs}
		b.refs.Store(1) // the leader's
		b.prefetched.Store(prefetch)
		c.demote(c.stg.put(b, ownerClosed)) // its bytes from filling to staged
		staged = prefetch
		return b, nil
	})
	if err != nil {
		return nil, false, err
	}
	return v.(*block), led, nil
}

// buffer returns a buffer for a fill of n bytes, counted as filling: a kept
// one, or a fresh one while the account has room; else the staging ring
// gives up its least recently used block beyond its minimum (to ristretto,
// whose admission decides) until there is room. With the ring at its
// minimum the fills' reserve pays: ristretto's share leaves room for every
// fill in flight (MaxFills and the read-ahead workers).
func (c *Cache) buffer(n int64) []byte {
	for {
		if buf, ok := c.bufs.get(n, false); ok {
			return buf
		}
		b := c.stg.spill()
		if b == nil {
			buf, _ := c.bufs.get(n, true)
			return buf
		}
		c.spilled.Add(1)
		c.demote(b)
	}
}

// reuseRead lets the least recently used block of f read in full go, so
// that its buffer serves the fill of f about to take one, when f is larger
// than the ring can keep and the ring holds more than its minimum. A fresh
// buffer's first touch is a page fault for each 4 KiB page (BENCHMARKS.md
// run AB-faults): a
// reader streaming a file the cache cannot keep whole would otherwise fill
// the whole cache with fresh buffers for blocks that are read once, then
// let go first (evictLocked), whereas a file that fits stays cached for a
// re-read.
func (c *Cache) reuseRead(f *file) {
	if f.nblocks <= int64(c.stg.limit) {
		return
	}
	if b := c.stg.spillRead(f.id); b != nil {
		c.spilled.Add(1)
		c.demote(b)
	}
}

// demote offers b, which the staging ring gave up (with its reference and
// its bytes still counted as staged), unless it was read in full, to
// ristretto, and waits until ristretto took or refused it, so that the
// account is current for the next fill. nil is nothing.
func (c *Cache) demote(b *block) {
	if b == nil {
		return
	}
	if b.consumed() {
		// Read in full: not worth ristretto's room, which its frequency
		// (every read of it counted) would win against blocks read in
		// part, which are the ones read again.
		b.bufs.add(&b.bufs.staged, -b.cost())
		b.release()
		return
	}
	// Its bytes move from staged to cached. A Set dropped (ristretto's
	// buffer full) lets go at once; a rejection comes through OnExit.
	b.enterRC()
	if !c.rc.Set(c.keyFn(b.id, b.idx), b, b.cost()) {
		b.leaveRC()
	} else {
		c.rc.Wait()
	}
	b.release()
}

// getBlock serves one block to a foreground read and returns it acquired.
// Caller holds c.mu.RLock.
func (c *Cache) getBlock(f *file, idx int64) (*block, error) {
	for {
		if b, ok := c.hit(f, idx); ok {
			return b, nil
		}
		c.misses.Add(1)
		if err := c.failed.recent(c.keyFn(f.id, idx), f.id, idx); err != nil {
			return nil, err
		}
		b, led, err := c.fill(f, idx, nil)
		if err != nil {
			return nil, err
		}
		if led || b.acquire() {
			return c.used(b), nil
		}
		// Filled by another reader and dropped by every holder before
		// this one could take it: look again.
	}
}

// hit returns the block, acquired, if the cache holds it.
func (c *Cache) hit(f *file, idx int64) (*block, bool) {
	b, staged, ok := c.lookup(f, idx)
	if !ok || !b.acquire() {
		return nil, false
	}
	c.hits.Add(1)
	if staged {
		c.stagingHits.Add(1)
	}
	return c.used(b), true
}

// maxDetached bounds the waits for fills that run on after their reader
// left (getBlockCtx).
const maxDetached = 64

// getBlockCtx is getBlock for a reader that stops waiting once ctx is done,
// returning context.Cause(ctx). A miss is then waited for on a goroutine
// of its own, which holds its own read lock, so that Close still waits for
// the fill; the block it gets once abandoned is released.
func (c *Cache) getBlockCtx(ctx context.Context, f *file, idx int64) (*block, error) {
	if ctx.Done() == nil {
		return c.getBlock(f, idx)
	}
	if b, ok := c.hit(f, idx); ok {
		return b, nil
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	// At most maxDetached waits run on after their reader left (interrupted
	// reads repeated at a store that does not answer would add one each);
	// past that a reader waits for its fill. Not RLock: a second read lock
	// waits behind a Close that is waiting for the first; then Close is
	// under way: wait for the fill here.
	select {
	case c.detached <- struct{}{}:
	default:
		return c.getBlock(f, idx)
	}
	if !c.mu.TryRLock() {
		<-c.detached
		return c.getBlock(f, idx)
	}
	type got struct {
		b   *block
		err error
	}
	ch := make(chan got, 1)
	go func() {
		defer func() { <-c.detached }()
		defer c.mu.RUnlock()
		b, err := c.getBlock(f, idx)
		ch <- got{b, err}
	}()
	select {
	case r := <-ch:
		return r.b, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.b != nil {
				r.b.release()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// used counts the first foreground use of a prefetched block, and records
// the use for the staging ring.
func (c *Cache) used(b *block) *block {
	c.stg.touch(b)
	if b.prefetched.Load() && b.prefetched.CompareAndSwap(true, false) {
		c.raHits.Add(1)
	}
	return b
}

// enqueue offers prefetch of blocks [from, to] of h's file, each with a
// staging slot reserved to keep it until read, and returns the first block
// it did not offer for want of a slot (to+1 when none): those are offered
// again by the reads that follow. It never blocks: when the foreground is
// busy or the queue is full the rest is dropped. Blocks the handle already
// read in full are skipped (see markReadFull). Caller holds h.mu.
func (c *Cache) enqueue(h *Handle, from, to int64) (next int64) {
	for i := from; i <= to; i++ {
		if h.wasReadFullLocked(i) {
			continue
		}
		if c.fgFills.Load() >= int64(c.opts.BusyFills) {
			c.raDropped.Add(to - i + 1)
			return to + 1
		}
		if _, _, ok := c.lookup(&h.f, i); ok {
			continue
		}
		if !c.stg.reserve() {
			return i
		}
		c.jobAdd()
		select {
		case c.queue <- job{h: h, idx: i}:
			c.raIssued.Add(1)
		default:
			c.stg.unreserve()
			c.jobDone()
			c.raDropped.Add(to - i + 1)
			return to + 1
		}
	}
	return to + 1
}

func (c *Cache) worker() {
	defer c.workers.Done()
	for {
		select {
		case <-c.stop:
			return
		case j := <-c.queue:
			c.prefetch(j)
			c.jobDone()
		}
	}
}

// prefetch runs a job; the job's staging reservation goes to the block
// filled, or back.
func (c *Cache) prefetch(j job) {
	select {
	case <-c.stop:
		c.stg.unreserve()
		c.raDropped.Add(1)
		return
	default:
	}
	if j.h.closed.Load() || c.fgFills.Load() >= int64(c.opts.BusyFills) {
		c.stg.unreserve()
		c.raDropped.Add(1)
		return
	}
	if _, _, ok := c.lookup(&j.h.f, j.idx); ok || j.h.wasReadFull(j.idx) {
		// Cached, or its reader took it all while the job waited (a
		// foreground fill came first), and the cache let it go since.
		c.stg.unreserve()
		return
	}
	// An error is counted in FillErrors; a foreground read will retry.
	if b, led, err := c.fill(&j.h.f, j.idx, j.h); err == nil && led {
		b.release()
	}
}

func (c *Cache) jobAdd() {
	c.pmu.Lock()
	c.pending++
	c.pmu.Unlock()
}

func (c *Cache) jobDone() {
	c.pmu.Lock()
	c.pending--
	if c.pending == 0 {
		c.pcond.Broadcast()
	}
	c.pmu.Unlock()
}

// staging holds the most recently filled blocks, at least capacity of them
// and up to limit while the account (acct) has room; the cache takes back
// that room when a fill needs it (spill). Each block staged holds one of its
// refs, and its bytes are counted as staged in acct. A block leaves for
// ristretto (Cache.demote), or, in tests of the ring alone (acct nil), is
// released.
//
// A block read ahead for a handle that is still open and has not used it yet
// is protected: it leaves only when nothing else can (or once it is stale,
// protectFor fills later), since its reader is on its way and would fetch it
// again (issue 36: ristretto's admission rejects fresh blocks against the
// ones a sequential reader hit many times, and a FIFO ring as long as the
// read-ahead window dropped them before use). Read-ahead takes a slot
// (reserve) before it fetches, and fetches only while protected blocks and
// reservations leave keepRead slots for the blocks being read, which leave
// least recently used first.
type staging struct {
	mu       sync.Mutex
	capacity int
	limit    int                    // the most blocks kept, room or not
	acct     *buffers               // nil: the ring alone, capacity blocks
	list     []*staged              // GUARDED_BY(mu); at most limit
	index    map[stagingKey]*staged // GUARDED_BY(mu)
	reserved int                    // GUARDED_BY(mu); read-ahead fills that will be put
	seq      atomic.Uint64          // puts so far: a read-ahead block's age
	clock    atomic.Uint64          // puts and foreground uses: what lastUse says
}

type staged struct {
	b     *block
	put   uint64       // seq at put
	order uint64       // clock at put
	owner *atomic.Bool // closed of the handle that read it ahead; nil for a foreground fill
}

type stagingKey struct {
	id  uint64
	idx int64
}

func newStaging(n int) staging {
	return staging{capacity: n, limit: n, list: make([]*staged, 0, n), index: make(map[stagingKey]*staged, n)}
}

// maxStaged bounds the blocks the ring keeps in a cache of many small
// blocks, so that its scans (evictLocked, roomLocked) stay short.
const maxStaged = 1024

// keepRead is how many slots read-ahead leaves to the blocks being read: a
// sequential reader's block, and the one before it that reads still in
// flight may finish.
func (s *staging) keepRead() int { return min(2, s.capacity-1) }

// protectFor is how many fills a block read ahead stays protected.
func (s *staging) protectFor() uint64 { return uint64(4 * s.capacity) }

// protected says whether e was read ahead for a reader still expected. Caller
// holds mu.
func (s *staging) protected(e *staged) bool {
	return e.owner != nil && e.b.prefetched.Load() && !e.owner.Load() &&
		s.seq.Load()-e.put < s.protectFor()
}

// roomLocked is how many more blocks read-ahead may reserve now. Caller
// holds mu.
func (s *staging) roomLocked() int {
	n := s.reserved
	for _, e := range s.list {
		if s.protected(e) {
			n++
		}
	}
	return max(0, s.capacity-s.keepRead()-n)
}

// reserve takes a slot for a block read-ahead is about to fetch; put or
// unreserve gives it back.
func (s *staging) reserve() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.roomLocked() == 0 {
		return false
	}
	s.reserved++
	return true
}

func (s *staging) unreserve() {
	s.mu.Lock()
	s.reserved--
	s.mu.Unlock()
}

// touch records a foreground use of b.
func (s *staging) touch(b *block) { b.lastUse.Store(s.clock.Add(1)) }

func (s *staging) get(id uint64, idx int64) *block {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.index[stagingKey{id, idx}]; e != nil {
		return e.b
	}
	return nil
}

// put stages b, just filled, ahead for a handle (owner is its closed; nil:
// by a foreground read), giving back the handle's reservation, and moves
// its bytes from filling to staged. It returns the block that left to make room, if any, with its
// reference, its bytes still counted as staged (Cache.demote); the ring
// alone releases it.
func (s *staging) put(b *block, owner *atomic.Bool) (gone *block) {
	k := stagingKey{b.id, b.idx}
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner != nil {
		s.reserved--
	}
	b.retain()
	if s.acct != nil {
		s.acct.move(&s.acct.filling, &s.acct.staged, b.cost())
	}
	now, order := s.seq.Add(1), s.clock.Add(1)
	b.lastUse.Store(order)
	e := &staged{b: b, put: now, order: order, owner: owner}
	if old, ok := s.index[k]; ok {
		// Already staged; keep the newer fill.
		s.uncount(old.b)
		old.b.release()
		*old = *e
		return nil
	}
	if len(s.list) >= s.limit {
		gone = s.evictLocked()
	}
	s.list = append(s.list, e)
	s.index[k] = e
	return s.let(gone)
}

// uncount takes b's bytes out of staged: b is released, not demoted.
func (s *staging) uncount(b *block) {
	if s.acct != nil {
		s.acct.add(&s.acct.staged, -b.cost())
	}
}

// let hands a block that left the ring to the cache; the ring alone
// releases it. Caller holds mu.
func (s *staging) let(b *block) *block {
	if b == nil || s.acct != nil {
		return b
	}
	b.release()
	return nil
}

// spill gives up the block that evictLocked picks when the ring holds more
// than its minimum (nil when it does not): see put for what is returned.
func (s *staging) spill() *block {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) <= s.capacity {
		return nil
	}
	return s.let(s.evictLocked())
}

// spillRead gives up the least recently used block of file id read in
// full when the ring holds more than its minimum (nil when there is none):
// see put for what is returned.
func (s *staging) spillRead(id uint64) *block {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) <= s.capacity {
		return nil
	}
	victim, vAge := -1, uint64(0)
	for i, e := range s.list {
		if e.b.id != id || !e.b.consumed() {
			continue
		}
		if age := max(e.order, e.b.lastUse.Load()); victim < 0 || age < vAge {
			victim, vAge = i, age
		}
	}
	if victim < 0 {
		return nil
	}
	return s.let(s.removeLocked(victim))
}

// evictLocked takes one block out of the ring and returns it: the least
// recently used one whose every byte was read, else the least recently
// used one not protected, else the oldest protected one. A loader that
// faults tensors in its state dict's order reads a block in parts, at
// moments far apart, and each byte once: a block read in full is the one
// least likely read again, and recency alone kept those (run Z-cache). Above the
// ring's minimum there is always one not protected (read-ahead's
// reservations and protected blocks leave keepRead of the minimum). Caller
// holds mu.
func (s *staging) evictLocked() *block {
	// rank orders the blocks to give up: read in full first, then the
	// others not protected, then the protected ones.
	rank := func(e *staged) int {
		switch {
		case s.protected(e):
			return 2
		case e.b.consumed():
			return 0
		}
		return 1
	}
	victim, vRank, vAge := -1, 0, uint64(0)
	for i, e := range s.list {
		r := rank(e)
		age := e.order
		if r < 2 {
			age = max(age, e.b.lastUse.Load())
		}
		if victim < 0 || r < vRank || (r == vRank && age < vAge) {
			victim, vRank, vAge = i, r, age
		}
	}
	return s.removeLocked(victim)
}

// removeLocked takes the i-th block out of the ring and returns it. Caller
// holds mu.
func (s *staging) removeLocked(victim int) *block {
	old := s.list[victim]
	last := len(s.list) - 1
	s.list[victim] = s.list[last]
	s.list[last] = nil
	s.list = s.list[:last]
	delete(s.index, stagingKey{old.b.id, old.b.idx})
	return old.b
}

func (s *staging) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.list {
		s.uncount(e.b)
		e.b.release()
	}
	clear(s.list)
	s.list = s.list[:0]
	clear(s.index)
}
