package pickle

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Options.Release hears of the whole input once it is scanned (with a
// Sink), then of the part behind the VM every releaseStep bytes, in order,
// each part where the last ended; the result is the same.
func TestRelease(t *testing.T) {
	e := NewEncoder()
	e.List(func() {
		for i := range 500_000 {
			e.Str(fmt.Sprintf("%040d", i))
		}
	})
	data := e.Bytes()
	require.Greater(t, len(data), 2*releaseStep+releaseLag)
	for _, sink := range []bool{true, false} {
		t.Run(fmt.Sprint("sink ", sink), func(t *testing.T) {
			opts := Options{}
			if sink {
				opts.Sink = &nopSink{}
			}
			want, err := DecodeBytes(data, opts)
			require.NoError(t, err)
			var calls [][2]int
			var mu sync.Mutex // the scan's segments call at once
			opts.Release = func(lo, hi int) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, [2]int{lo, hi})
			}
			got, err := DecodeBytes(data, opts)
			require.NoError(t, err)
			require.Equal(t, Repr(want), Repr(got))
			if sink {
				// The scan's parts, in any order, then the whole input.
				i := slices.Index(calls, [2]int{0, len(data)})
				require.GreaterOrEqual(t, i, len(data)/releaseStep-1, "the scan's parts: %v", calls)
				scanned := 0
				for _, c := range calls[:i] {
					require.True(t, 0 <= c[0] && c[0] < c[1] && c[1] <= len(data), "%v", calls)
					scanned += c[1] - c[0]
				}
				require.Greater(t, scanned, len(data)-2*releaseStep)
				calls = calls[i+1:]
			}
			require.GreaterOrEqual(t, len(calls), len(data)/releaseStep-1)
			end := 0
			for _, c := range calls {
				require.Equal(t, end, c[0], "%v", calls)
				require.Greater(t, c[1], c[0], "%v", calls)
				end = c[1]
			}
			require.LessOrEqual(t, end, len(data)-releaseLag)
		})
	}
}

// A scan in parts (with Options.Release: runIn) gives the scan in one run,
// parts of any size, of every seed and hostile pickle, in one segment and
// in segments; each part released once, none outside the input.
func TestScanInParts(t *testing.T) {
	old := scanPart
	t.Cleanup(func() { scanPart = old })
	for _, b := range sinkSeeds(t) {
		for _, size := range []int{64, 7} {
			f := reframe(b, size)
			want := scanOnce(f, Options{}.withDefaults())
			for _, part := range []int{1, 3, 16, 1 << 20} {
				scanPart = part
				var mu sync.Mutex
				released := 0
				opts := Options{Release: func(lo, hi int) {
					mu.Lock()
					defer mu.Unlock()
					require.True(t, 0 <= lo && lo < hi && hi <= len(f), "%d-%d of %d", lo, hi, len(f))
					released += hi - lo
				}}.withDefaults()
				require.True(t, sameRefs(want, scanOnce(f, opts)), "part %d of %x", part, f[:min(len(f), 32)])
				if want != nil {
					require.LessOrEqual(t, released, len(f))
				}
				if starts := frameStarts(f, 2); len(starts) > 1 {
					if got, ok := scanSegments(f, starts, opts); ok {
						require.True(t, sameRefs(want, got), "segments, part %d", part)
					}
				}
			}
		}
	}
}
