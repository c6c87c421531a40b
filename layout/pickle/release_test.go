package pickle

import (
	"fmt"
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
			opts.Release = func(lo, hi int) { calls = append(calls, [2]int{lo, hi}) }
			got, err := DecodeBytes(data, opts)
			require.NoError(t, err)
			require.Equal(t, Repr(want), Repr(got))
			if sink {
				require.Equal(t, [2]int{0, len(data)}, calls[0], "the scanned input")
				calls = calls[1:]
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
