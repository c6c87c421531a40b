// Package memlimit makes the Go memory limit a bound on more than the Go
// heap: a mount's bound (block cache, metadata budget, headroom) less the
// memory it maps outside the heap while that is mapped (a DCP .metadata
// being decoded), so that the collector keeps the whole within the bound.
// Until Set is called (inspect, tests) it leaves the limit alone.
package memlimit

import (
	"runtime/debug"
	"sync"
)

var (
	mu      sync.Mutex
	bound   int64 // GUARDED_BY(mu); 0: none set
	outside int64 // GUARDED_BY(mu)
)

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
