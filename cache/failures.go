package cache

import (
	"sync"
	"time"
)

// failMemory is how long a block whose foreground fill failed fails again
// without asking its Source. The kernel reads a page again, at once, when
// the read-ahead holding it failed: asking the Source again would make a
// read of a store that is down take twice its retry budget to fail.
var failMemory = time.Second // a variable for tests

// maxFailures bounds the blocks remembered; past it, those older than
// failMemory are forgotten first.
const maxFailures = 1024

// failures remembers the latest failed foreground fill of blocks, by
// ristretto key.
type failures struct {
	mu sync.Mutex
	m  map[uint64]failure // GUARDED_BY(mu)
}

type failure struct {
	err *FillError
	at  time.Time
}

func (f *failures) add(key uint64, err *FillError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[uint64]failure{}
	}
	now := time.Now()
	if len(f.m) >= maxFailures {
		for k, old := range f.m {
			if now.Sub(old.at) >= failMemory {
				delete(f.m, k)
			}
		}
	}
	if len(f.m) < maxFailures {
		f.m[key] = failure{err, now}
	}
}

func (f *failures) forget(key uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}

// recent returns the error of block idx of file id if its fill failed less
// than failMemory ago (keys may collide: the block is checked).
func (f *failures) recent(key, id uint64, idx int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.m[key]
	if !ok || old.err.ID != id || old.err.Block != idx || time.Since(old.at) >= failMemory {
		return nil
	}
	return old.err
}
