package main

import (
	"os"
	"runtime"
	"runtime/pprof"
)

// profile starts what $CKPTFS_CPUPROFILE and $CKPTFS_MEMPROFILE name (a
// hidden aid for measuring a mount's open of a large view; see
// BENCHMARKS.md) and returns what writes them out at exit.
func profile() (stop func()) {
	var stops []func()
	if p := os.Getenv("CKPTFS_CPUPROFILE"); p != "" {
		if f, err := os.Create(p); err == nil {
			if pprof.StartCPUProfile(f) != nil {
				f.Close()
			} else {
				stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
			}
		}
	}
	if p := os.Getenv("CKPTFS_MEMPROFILE"); p != "" {
		runtime.MemProfileRate = 64 << 10
		stops = append(stops, func() {
			runtime.GC() // the profile is as of the last collection
			if f, err := os.Create(p); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}
