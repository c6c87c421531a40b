// Package par runs the independent pieces of opening a checkpoint (the
// model's items, the view files' sources) on several cores: a checkpoint
// of hundreds of ranks is a million chunks of serial work after its decode
// while the other cores idle.
package par

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Cores is how many cores opening a checkpoint uses at most: past four the
// pieces are too few to share and the mount's readers need the rest.
func Cores() int { return min(runtime.GOMAXPROCS(0), 4) }

// Each calls do(w, i) for every i in [0, n) on up to workers goroutines,
// the caller's among them (w is the goroutine's number, below workers),
// each taking the next i not taken. Once do returns false no goroutine
// takes a further i; every i below the first that returned false was
// taken, so the first failure by index is the one a single pass finds.
func Each(n, workers int, do func(w, i int) bool) {
	workers = max(1, min(workers, n))
	var next atomic.Int64
	var failed atomic.Bool
	work := func(w int) {
		for !failed.Load() {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if !do(w, i) {
				failed.Store(true)
			}
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Go(func() { work(w) })
	}
	work(0)
	wg.Wait()
}
