// Package cost measures what a piece of code costs, for tests that bound the
// time and memory hostile input may take. CPU time rather than wall time is
// what such a bound should check: on a busy machine the wall clock measures
// the neighbours.
package cost

import (
	"runtime"
	"syscall"
	"time"
)

// Cost is what one call took.
type Cost struct {
	// CPU is the user+system time of the whole process during the call, so
	// the call should be the only work under way (no parallel tests).
	CPU time.Duration
	// Wall is the elapsed time.
	Wall time.Duration
	// Alloc is the bytes allocated on the Go heap during the call.
	Alloc uint64
}

// Of runs f and returns its cost.
func Of(f func()) Cost {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime()
	start := time.Now()
	f()
	wall := time.Since(start)
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&after)
	return Cost{CPU: cpu, Wall: wall, Alloc: after.TotalAlloc - before.TotalAlloc}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic("cost: getrusage: " + err.Error())
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
