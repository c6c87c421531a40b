package par

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, workers := range []int{0, 1, 3, 64} {
		seen := make([]atomic.Int32, 1000)
		var wmax atomic.Int32
		Each(len(seen), workers, func(w, i int) bool {
			seen[i].Add(1)
			for v := wmax.Load(); int32(w) > v && !wmax.CompareAndSwap(v, int32(w)); v = wmax.Load() {
			}
			return true
		})
		for i := range seen {
			require.EqualValues(t, 1, seen[i].Load(), "index %d with %d workers", i, workers)
		}
		assert.Less(t, int(wmax.Load()), max(1, workers), "worker numbers below workers")
	}
}

// After a failure no further index is taken, and every index below the
// first failure was.
func TestEachStopsAfterAFailure(t *testing.T) {
	for range 50 {
		const n, bad = 10000, 137
		var taken [n]atomic.Bool
		Each(n, 4, func(_, i int) bool {
			taken[i].Store(true)
			return i != bad
		})
		for i := 0; i <= bad; i++ {
			require.True(t, taken[i].Load(), "index %d below the failure not taken", i)
		}
		count := 0
		for i := range taken {
			if taken[i].Load() {
				count++
			}
		}
		assert.Less(t, count, n, "indexes taken after the failure: all of them")
	}
}

func TestEachEmpty(t *testing.T) {
	Each(0, 4, func(_, _ int) bool { t.Fatal("called"); return true })
}
