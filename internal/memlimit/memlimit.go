// Package memlimit makes the Go memory limit a bound on more than the Go
// heap: a mount's bound (block cache, metadata budget, headroom) less the
// memory it maps outside the heap, what of it is held (a DCP .metadata
// being decoded: all of it, then the window behind which the decoder drops
// its pages), so that the collector keeps the whole within the bound;
// where live data alone passes that, the limit follows it (apply). A mount
// collects at that limit only (GOGC off), except while it opens a
// checkpoint (Opening). Until Set is called (inspect, tests) it leaves the
// limit and the collector alone.
package memlimit

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

var (
	mu       sync.Mutex
	bound    int64        // GUARDED_BY(mu); 0: none set
	outside  int64        // GUARDED_BY(mu)
	buffers  func() int64 // GUARDED_BY(mu); nil: none
	opening  int          // GUARDED_BY(mu): opens under way that turned GOGC on
	watching bool         // GUARDED_BY(mu): watchGC is armed
)

// openingGC is the collector's percent while a checkpoint is opened.
const openingGC = 100

// Set makes b the process's memory bound.
func Set(b int64) {
	mu.Lock()
	defer mu.Unlock()
	bound = b
	apply()
	if b > 0 && !watching {
		watching = true
		watchGC()
	}
}

// Outside counts n bytes mapped outside the Go heap until Release; Hold
// changes how many of them count, as pages are read and dropped.
func Outside(n int64) *Mapped {
	m := &Mapped{}
	m.Hold(n)
	return m
}

// Mapped is memory mapped outside the Go heap, of which the limit leaves
// room for what is held.
type Mapped struct {
	held int64 // GUARDED_BY(mu)
	done bool  // GUARDED_BY(mu)
}

// Hold says that n bytes of the mapping are held now (resident). After
// Release it does nothing. It sets the limit again only where n changes and
// a bound is set (a mount; inspect only counts): debug.SetMemoryLimit
// recomputes the collector's pacing under the heap lock and stops nothing.
func (m *Mapped) Hold(n int64) {
	mu.Lock()
	defer mu.Unlock()
	m.holdLocked(n)
}

// Release ends the count (the mapping is gone); later calls do nothing.
func (m *Mapped) Release() {
	mu.Lock()
	defer mu.Unlock()
	m.holdLocked(0)
	m.done = true
}

func (m *Mapped) holdLocked(n int64) {
	if m.done || n == m.held {
		return
	}
	outside += n - m.held
	m.held = n
	apply()
}

// Buffers says that held() bytes of the live heap are buffers without
// pointers, allocated once and reused (a block cache's blocks, as many as
// it holds at the time): the collector has nothing to mark in them, so the
// limit's margin over the live heap (apply) need not grow with them. nil:
// none. held must not call into this package.
func Buffers(held func() int64) {
	mu.Lock()
	defer mu.Unlock()
	buffers = held
	apply()
}

// apply sets the limit: the bound less what is mapped, never below half
// the bound, nor below the live heap and a quarter more of the live heap
// other than Buffers. Below either, the heap would have a limit it cannot
// keep (several large files mapped at once; a decode whose live data alone
// passes the limit, as a 786 MiB .metadata's does), and the collector would
// run without pause, at the half of the CPU the runtime caps it to: such an
// open took 2-3x its CPU. A mount's blocks are most of its live heap while
// it loads from an object store, and a quarter more of them put the limit
// above its bound (issue 36).
func apply() {
	if bound > 0 {
		live, fixed := liveHeap(), int64(0)
		if buffers != nil {
			fixed = min(buffers(), live)
		}
		debug.SetMemoryLimit(max(bound-outside, bound/2, live+(live-fixed)/4))
	}
}

// liveHeap is the heap the last collection found live.
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(min(s[0].Value.Uint64(), 1<<62))
}

// gcTick is an object made to be collected: its finalizer runs after the
// collection that found it unreachable. It holds a pointer so that it is
// not one of the tiny allocations that share a block, and whose finalizers
// wait for their neighbours.
type gcTick struct{ _ *int }

// watchGC applies the limit again after each collection, when the live
// heap it depends on is known, until the bound is unset.
func watchGC() {
	runtime.SetFinalizer(new(gcTick), func(*gcTick) {
		mu.Lock()
		defer mu.Unlock()
		if bound == 0 {
			watching = false
			return
		}
		apply()
		watchGC()
	})
}

// Opening makes the collector proportional (GOGC 100) until release is
// called (once; later calls do nothing), where the process otherwise
// collects only at its limit (a mount; not where $GOGC is set, nor before
// Set). Opening a checkpoint makes several times the garbage of what its
// view keeps (the decode of its metadata, the plan of its view); with
// collection at the limit alone each open's garbage stayed, and a mount's
// RSS rose to its limit after a few opens. Concurrent opens share it.
func Opening() (release func()) {
	mu.Lock()
	defer mu.Unlock()
	if bound == 0 {
		return func() {}
	}
	if opening == 0 {
		if prev := debug.SetGCPercent(openingGC); prev >= 0 {
			debug.SetGCPercent(prev) // the user's $GOGC
			return func() {}
		}
	}
	opening++
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			if opening--; opening == 0 {
				debug.SetGCPercent(-1)
			}
		})
	}
}
