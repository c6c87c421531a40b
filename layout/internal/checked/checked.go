// Package checked is int64 arithmetic that reports overflow instead of
// wrapping: every count, size and offset computed from untrusted input
// (shapes, mapping expressions, split sizes) goes through it, so that a
// wrapped value never sizes an allocation or passes a bounds check.
package checked

import "math"

// Add returns a+b, or false when it overflows.
func Add(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// Sub returns a-b, or false when it overflows.
func Sub(a, b int64) (int64, bool) {
	if b == math.MinInt64 {
		if a >= 0 {
			return 0, false
		}
		return a - b, true
	}
	return Add(a, -b)
}

// Mul returns a*b, or false when it overflows.
func Mul(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	p := a * b
	if (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) || p/b != a {
		return 0, false
	}
	return p, true
}
