package checked

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
)

var edges = []int64{0, 1, -1, 2, -2, 3, 1 << 31, -(1 << 31), 1 << 32, 1 << 62, -(1 << 62),
	math.MaxInt64, math.MaxInt64 - 1, math.MinInt64, math.MinInt64 + 1, 3037000499, 3037000500}

// want computes op exactly and reports whether the result fits in int64.
func want(a, b int64, op func(z, x, y *big.Int) *big.Int) (int64, bool) {
	r := op(new(big.Int), big.NewInt(a), big.NewInt(b))
	if !r.IsInt64() {
		return 0, false
	}
	return r.Int64(), true
}

func check(t *testing.T, a, b int64) {
	for _, tc := range []struct {
		name string
		got  func(a, b int64) (int64, bool)
		op   func(z, x, y *big.Int) *big.Int
	}{
		{"Add", Add, (*big.Int).Add},
		{"Sub", Sub, (*big.Int).Sub},
		{"Mul", Mul, (*big.Int).Mul},
	} {
		v, ok := tc.got(a, b)
		wv, wok := want(a, b, tc.op)
		assert.Equal(t, wok, ok, "%s(%d, %d)", tc.name, a, b)
		if ok && wok {
			assert.Equal(t, wv, v, "%s(%d, %d)", tc.name, a, b)
		}
	}
}

func TestEdges(t *testing.T) {
	for _, a := range edges {
		for _, b := range edges {
			check(t, a, b)
			check(t, -a, b)
		}
	}
}

func FuzzArith(f *testing.F) {
	for _, a := range edges {
		f.Add(a, int64(7))
	}
	f.Fuzz(func(t *testing.T, a, b int64) { check(t, a, b) })
}
