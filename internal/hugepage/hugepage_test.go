package hugepage

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestInteriorIsTheWholeHugePagesInside(t *testing.T) {
	const M = Size
	for _, c := range []struct {
		addr, n, lo, hi uintptr
	}{
		{0, 16 * M, 0, 16 * M},                    // aligned both ends
		{4096, 16 * M, M, 16 * M},                 // head cut to the next page
		{4096, 16*M - 8192, M, 15 * M},            // head and tail cut
		{M, M - 1, M, M},                          // short of one page: none
		{M + 1, M, 2 * M, 2 * M},                  // one page's worth, unaligned: none
		{M - 1, M + 2, M, 2 * M},                  // just one
		{M + 4096, 0, 2 * M, 2 * M},               // empty
		{3*M + 8192, 5 * M, 4 * M, 8 * M},         // in the middle
		{16*M - 8192, 2*M + 8192, 16 * M, 18 * M}, // tail aligned
	} {
		lo, hi := interior(c.addr, c.n)
		if c.hi <= c.lo {
			assert.LessOrEqual(t, hi, lo, "addr %#x n %#x: none", c.addr, c.n)
			continue
		}
		assert.Equal(t, [2]uintptr{c.lo, c.hi}, [2]uintptr{lo, hi}, "addr %#x n %#x", c.addr, c.n)
	}
}
