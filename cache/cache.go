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
// Invariants (each one is checked in cache_test.go):
//   - Partial data is never visible: a fill that fails caches nothing and
//     returns its error to every reader waiting on it; a later read retries.
//   - The cache is never the source of truth: ristretto may drop or reject any
//     Set, and a key collision is detected (a block carries its own id and
//     index), so a read after a lost Set just fills again.
//   - Memory is bounded by Size (see Bound): ristretto gets what is left of
//     it after the Staging ring and the blocks being filled, which are
//     capped: at most MaxFills foreground fills at once (more readers wait
//     for a slot, and readers of one block share its fill) plus one per
//     read-ahead worker. Buffers kept for reuse count against the fills'
//     share.
//   - A block's bytes never change while anyone can read them: its buffer
//     is reused only after every holder let go (see block), so an evicted
//     block still being copied or replied with stays valid.
//   - A foreground read never waits for a prefetch it did not ask for, except
//     to join a fill of the very block it needs.
//
// Lock order: Cache.mu (read-locked for the whole of a foreground read) before
// Handle.mu before staging.mu; Cache.pmu is a leaf. No lock is held while
// calling a Source except Cache.mu in read mode (a foreground read may wait
// for a fill slot holding it).
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
	// Staging is how many of the most recently filled blocks are kept
	// regardless of ristretto's admission decision, so that the reads that
	// immediately follow a fill (the rest of a sequential stream's block, the
	// blocks just prefetched) do not refill a block ristretto rejected
	// (default 2 × (ReadAhead + Workers), at most a quarter of Size, at
	// least 1).
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

// reserve is the bytes of the blocks held outside ristretto: the staging ring
// and the fills in flight (foreground and read-ahead).
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
	CachedBytes      int64 `json:"cached_bytes"`       // bytes held by ristretto now (cost added − cost evicted)
	StagedBytes      int64 `json:"staged_bytes"`       // bytes in the staging ring now (most are also in ristretto)
	FillingBytes     int64 `json:"filling_bytes"`      // bytes of the blocks being filled now
	FreeBytes        int64 `json:"free_bytes"`         // bytes of block buffers kept for the next fills
	BuffersReused    int64 `json:"buffers_reused"`     // fills into a kept buffer instead of a fresh one
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
	bufs      *buffers      // block buffers: reused, and the bytes being filled

	bytesServed, hits, stagingHits, misses, fills, fillErrors atomic.Int64
	raIssued, raHits, raDropped, openHandles                  atomic.Int64
}

// New returns a Cache and starts its read-ahead workers (none when ReadAhead
// is 0). Close it to stop them.
func New(opts Options) (*Cache, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	// Size bounds everything the cache holds: ristretto gets what the
	// staging ring and the fills in flight leave (nothing useful when they
	// take it all: then only staged blocks are kept).
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
		stg:       newStaging(o.Staging),
		keyFn:     blockKey,
		stop:      make(chan struct{}),
		fillSlots: make(chan struct{}, o.MaxFills),
		detached:  make(chan struct{}, maxDetached),
		bufs:      &buffers{size: o.BlockSize, limit: int64(o.MaxFills+o.readAheadWorkers()) * o.BlockSize},
	}
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
	// Filling and free bytes are read at one instant: together they stay
	// within the fills' share of Size, which reading them apart could
	// overstate while a buffer moves from one to the other.
	filling, free := c.bufs.gauges()
	s := Stats{
		FillingBytes:     filling,
		FreeBytes:        free,
		StagedBytes:      c.stg.bytes(),
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
		s.CachedBytes = int64(m.CostAdded()) - int64(m.CostEvicted())
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
// acquire one, and the block may be dead by then.
func (c *Cache) fill(f *file, idx int64, prefetch bool) (b *block, led bool, err error) {
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
		buf, recycle := c.bufs.get(n)
		start := time.Now()
		got, err := f.src.ReadAt(buf, off)
		c.bufs.filled(n) // from here the buffer counts as staged (and cached), or is dropped
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
		b := &block{id: f.id, idx: idx, data: buf}
		if recycle {
			b.bufs = c.bufs
		}
		b.refs.Store(1) // the leader's
		b.prefetched.Store(prefetch)
		c.stg.put(b)
		b.enterRC()
		if !c.rc.Set(c.keyFn(f.id, idx), b, n) { // dropped; a rejection comes later, through OnExit
			b.leaveRC()
		}
		return b, nil
	})
	if err != nil {
		return nil, false, err
	}
	return v.(*block), led, nil
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
		b, led, err := c.fill(f, idx, false)
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

// used counts the first foreground use of a prefetched block.
func (c *Cache) used(b *block) *block {
	if b.prefetched.Load() && b.prefetched.CompareAndSwap(true, false) {
		c.raHits.Add(1)
	}
	return b
}

// enqueue offers prefetch of blocks [from, to] of h's file. It never blocks:
// when the foreground is busy or the queue is full the rest is dropped.
func (c *Cache) enqueue(h *Handle, from, to int64) {
	for i := from; i <= to; i++ {
		if c.fgFills.Load() >= int64(c.opts.BusyFills) {
			c.raDropped.Add(to - i + 1)
			return
		}
		if _, _, ok := c.lookup(&h.f, i); ok {
			continue
		}
		c.jobAdd()
		select {
		case c.queue <- job{h: h, idx: i}:
			c.raIssued.Add(1)
		default:
			c.jobDone()
			c.raDropped.Add(to - i + 1)
			return
		}
	}
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

func (c *Cache) prefetch(j job) {
	select {
	case <-c.stop:
		c.raDropped.Add(1)
		return
	default:
	}
	if j.h.closed.Load() || c.fgFills.Load() >= int64(c.opts.BusyFills) {
		c.raDropped.Add(1)
		return
	}
	if _, _, ok := c.lookup(&j.h.f, j.idx); ok {
		return
	}
	// An error is counted in FillErrors; a foreground read will retry.
	if b, led, err := c.fill(&j.h.f, j.idx, true); err == nil && led {
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

// staging is a FIFO ring of the most recently filled blocks. It holds
// references, not copies: a block usually sits in ristretto too. Each block
// in the ring holds one of its refs.
type staging struct {
	mu    sync.Mutex
	slots []*block              // GUARDED_BY(mu)
	next  int                   // GUARDED_BY(mu)
	index map[stagingKey]*block // GUARDED_BY(mu)
	size  atomic.Int64          // bytes in slots; written under mu
}

type stagingKey struct {
	id  uint64
	idx int64
}

func newStaging(n int) staging {
	return staging{slots: make([]*block, n), index: make(map[stagingKey]*block, n)}
}

func (s *staging) get(id uint64, idx int64) *block {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index[stagingKey{id, idx}]
}

func (s *staging) put(b *block) {
	k := stagingKey{b.id, b.idx}
	s.mu.Lock()
	defer s.mu.Unlock()
	b.retain()
	if old, ok := s.index[k]; ok {
		s.index[k] = b // already in a slot; keep the newer fill
		for i, o := range s.slots {
			if o == old {
				s.slots[i] = b
			}
		}
		old.release()
		return
	}
	if old := s.slots[s.next]; old != nil {
		delete(s.index, stagingKey{old.id, old.idx})
		s.size.Add(-int64(len(old.data)))
		old.release()
	}
	s.slots[s.next] = b
	s.index[k] = b
	s.size.Add(int64(len(b.data)))
	s.next = (s.next + 1) % len(s.slots)
}

func (s *staging) bytes() int64 { return s.size.Load() }

func (s *staging) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.slots {
		if b != nil {
			b.release()
		}
	}
	clear(s.slots)
	clear(s.index)
	s.size.Store(0)
}
