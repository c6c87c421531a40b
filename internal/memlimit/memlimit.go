// Package memlimit makes the Go memory limit a bound on more than the Go
// heap: a mount's bound (block cache, metadata budget, headroom) less the
// memory it maps outside the heap while that is mapped (a DCP .metadata
// being decoded), so that the collector keeps the whole within the bound.
// A mount collects at that limit only (GOGC off), except while it opens a
// checkpoint (Opening). Until Set is called (inspect, tests) it leaves the
// limit and the collector alone.
package memlimit

import (
	"runtime/debug"
	"sync"
)

var (
	mu      sync.Mutex
	bound   int64 // GUARDED_BY(mu); 0: none set
	outside int64 // GUARDED_BY(mu)
	opening int   // GUARDED_BY(mu): opens under way that turned GOGC on
)

// openingGC is the collector's percent while a checkpoint is opened.
const openingGC = 100

// Set makes b the process's memory bound.
func Set(b int64) {
	mu.Lock()
	defer mu.Unlock()
	bound = b
	apply()
}

// Outside counts n bytes mapped outside the Go heap until release is
// called (once; later calls do nothing).
func Outside(n int64) (release func()) {
	mu.Lock()
	outside += n
	apply()
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			outside -= n
			apply()
			mu.Unlock()
		})
	}
}

// apply sets the limit, never below half the bound: several large files
// mapped at once would otherwise leave the heap a limit it cannot keep,
// and the collector would run without pause.
func apply() {
	if bound > 0 {
		debug.SetMemoryLimit(max(bound-outside, bound/2))
	}
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
