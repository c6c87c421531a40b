package box

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// naive lists, in box C order, the tensor byte offset of every byte of the
// box: the ground truth the geometry must agree with.
func naive(shape []int64, es int64, b Box) []int64 {
	full := append(append([]int64(nil), shape...), es)
	off := append(append([]int64(nil), b.Offsets...), 0)
	size := append(append([]int64(nil), b.Sizes...), es)
	for _, s := range size {
		if s == 0 {
			return nil
		}
	}
	var out []int64
	idx := make([]int64, len(full))
	for {
		pos := int64(0)
		for d := range full {
			pos = pos*full[d] + off[d] + idx[d]
		}
		out = append(out, pos)
		d := len(full) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return out
		}
	}
}

func TestGeometryAgreesWithNaive(t *testing.T) {
	cases := []struct {
		shape []int64
		es    int64
		box   Box
		runs  int64 // expected number of runs
	}{
		{[]int64{6, 4}, 4, Box{[]int64{2, 0}, []int64{3, 4}}, 1}, // whole rows: one run
		{[]int64{6, 4}, 4, Box{[]int64{0, 1}, []int64{6, 2}}, 6}, // a column block: a run per row
		{[]int64{3, 5, 7}, 2, Box{[]int64{1, 2, 0}, []int64{1, 3, 7}}, 1},
		{[]int64{3, 5, 7}, 2, Box{[]int64{0, 1, 3}, []int64{3, 2, 4}}, 6},
		{[]int64{4, 6}, 1, Box{[]int64{0, 0}, []int64{4, 6}}, 1}, // the whole tensor
		{[]int64{}, 8, Box{[]int64{}, []int64{}}, 1},             // 0-dim
		{[]int64{5, 3}, 4, Box{[]int64{5, 0}, []int64{0, 3}}, 0}, // empty at the end
		{[]int64{2, 0}, 4, Box{[]int64{0, 0}, []int64{2, 0}}, 0}, // zero-size tensor
	}
	for _, tc := range cases {
		g, err := New(tc.shape, tc.es, tc.box)
		require.NoError(t, err)
		want := naive(tc.shape, tc.es, tc.box)
		require.EqualValues(t, len(want), g.Bytes())
		require.Equal(t, tc.runs, g.Runs(), "%v %v", tc.shape, tc.box)
		var got []int64
		require.NoError(t, g.Spans(0, g.Bytes(), func(at, local, n int64) error {
			require.EqualValues(t, len(got), local)
			for i := int64(0); i < n; i++ {
				got = append(got, at+i)
			}
			return nil
		}))
		require.Equal(t, want, got)
		if len(want) > 0 {
			assert.Equal(t, want[0], g.Start())
			assert.Equal(t, want[len(want)-1]+1, g.End())
		}
	}
}

func TestCountBeforeIsMonotoneAndExact(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 300; i++ {
		rank := rng.Intn(4)
		shape, b := make([]int64, rank), Box{make([]int64, rank), make([]int64, rank)}
		total := int64(1 + rng.Intn(3))
		es := total
		for d := range shape {
			shape[d] = int64(rng.Intn(5))
			b.Offsets[d] = int64(rng.Intn(int(shape[d]) + 1))
			b.Sizes[d] = int64(rng.Intn(int(shape[d]-b.Offsets[d]) + 1))
			total *= shape[d]
		}
		g, err := New(shape, es, b)
		require.NoError(t, err)
		want := naive(shape, es, b)
		k := 0
		for pos := int64(0); pos <= total; pos++ {
			for k < len(want) && want[k] < pos {
				k++
			}
			require.EqualValues(t, k, g.CountBefore(pos), "shape %v box %v pos %d", shape, b, pos)
		}
	}
}

func TestNewRejectsOutside(t *testing.T) {
	for _, b := range []Box{
		{[]int64{0, 3}, []int64{1, 2}},
		{[]int64{-1, 0}, []int64{1, 1}},
		{[]int64{0}, []int64{1}},
		{[]int64{5, 0}, []int64{1, 0}},
	} {
		_, err := New([]int64{4, 4}, 4, b)
		assert.Error(t, err, "%v", b)
	}
}
