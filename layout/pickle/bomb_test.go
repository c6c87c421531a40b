package pickle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/cost"
)

// tupleBomb is a "billion laughs" pickle: level 0 is the int 1, level k a
// tuple of fanout references (BINGET) to level k-1, and the last level is
// used as a dict key. It is about 4+levels*(fanout*2+4) bytes and expands to
// fanout^levels values.
func tupleBomb(levels, fanout int) string {
	var b strings.Builder
	b.WriteString("\x80\x02K\x01q\x00")
	for l := 1; l <= levels; l++ {
		b.WriteString("(" + strings.Repeat("h"+string(rune(l-1)), fanout) + "tq" + string(rune(l)))
	}
	b.WriteString("}h" + string(rune(levels)) + "Ns.")
	return b.String()
}

// lateListBomb makes empty lists 0..levels first, then fills them from the
// top down: list k gets fanout references to list k-1 while k-1 is still
// empty, so every reference is cheap when it is made and the result expands
// to fanout^levels values only once the lower lists grow.
func lateListBomb(levels, fanout int) string {
	var b strings.Builder
	b.WriteString("\x80\x02")
	for l := 0; l <= levels; l++ {
		b.WriteString("]q" + string(rune(l)) + "0")
	}
	b.WriteString("h\x00K\x01a0") // list 0 = [1]
	for l := levels; l >= 1; l-- {
		b.WriteString("h" + string(rune(l)) + "(" + strings.Repeat("h"+string(rune(l-1)), fanout) + "e0")
	}
	b.WriteString("h" + string(rune(levels)) + ".")
	return b.String()
}

func TestMemoBombs(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		opts Options
		err  string // "" means it decodes
	}{
		// 10^12 values in 268 bytes: stopped by the default item limit.
		{"tuple bomb key", tupleBomb(12, 10), Options{}, "more than 67108864 container items"},
		{"tuple bomb key under a low limit", tupleBomb(4, 10), Options{MaxItems: 1000}, "more than 1000 container items"},
		// 10^7 values fit the default limit: then hashing the key must not
		// expand it.
		{"tuple bomb key within the limit", tupleBomb(7, 10), Options{}, ""},
		{"wide shallow bomb", tupleBomb(3, 250), Options{}, ""},
		{"late-growing lists", lateListBomb(12, 10), Options{}, "more than 67108864 container items"},
		{"late-growing lists under a low limit", lateListBomb(4, 10), Options{MaxItems: 1000}, "more than 1000 container items"},
		// [[[1]*10]*10]*10 is 2111 values counted exactly.
		{"late-growing lists within the limit", lateListBomb(3, 10), Options{MaxItems: 2111}, ""},
		{"late-growing lists just over the limit", lateListBomb(3, 10), Options{MaxItems: 2110}, "more than 2110 container items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v any
			var err error
			c := cost.Of(func() { v, err = DecodeBytes([]byte(tc.in), tc.opts) })
			assert.Less(t, c.CPU, time.Second)
			assert.Less(t, c.Alloc, uint64(16<<20), "bytes allocated")
			if tc.err == "" {
				require.NoError(t, err)
				if d, ok := v.(*Dict); ok {
					k := d.Items()[0].Key
					_, found := d.Get(k)
					assert.True(t, found)
				}
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.True(t, errors.Is(err, ErrLimit))
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

// chain builds a tuple of fanout references to a tuple of ... levels deep,
// each level one Go slice shared fanout times, like the memo shares it.
func chain(levels, fanout int, leaf any) Tuple {
	t := Tuple{leaf}
	for range levels {
		next := make(Tuple, fanout)
		for i := range next {
			next[i] = t
		}
		t = next
	}
	return t
}

func TestTupleKeysDoNotExpand(t *testing.T) {
	// Two separately built 2^40-leaf tuples: equal, and found by each other.
	a, b := chain(40, 2, int64(1)), chain(40, 2, true)
	d := &Dict{}
	c := cost.Of(func() {
		require.NoError(t, d.Set(a, "a"))
		require.NoError(t, d.Set(b, "b")) // True == 1: replaces
	})
	assert.Less(t, c.CPU, 100*time.Millisecond)
	assert.Less(t, c.Alloc, uint64(1<<20))
	assert.Equal(t, 1, d.Len())
	v, ok := d.Get(chain(40, 2, 1.0))
	assert.True(t, ok)
	assert.Equal(t, "b", v)

	// A difference at the deepest leaf is seen.
	_, ok = d.Get(chain(40, 2, int64(2)))
	assert.False(t, ok)
	require.NoError(t, d.Set(chain(39, 2, int64(1)), "shallower"))
	assert.Equal(t, 2, d.Len())
}

func TestTupleKeyEquality(t *testing.T) {
	for _, tc := range []struct {
		a, b Tuple
		eq   bool
	}{
		{Tuple{}, Tuple{}, true},
		{Tuple{int64(1), "x"}, Tuple{true, "x"}, true},
		{Tuple{1.5}, Tuple{1.5}, true},
		{Tuple{1.5}, Tuple{int64(1)}, false},
		{Tuple{"1"}, Tuple{int64(1)}, false},
		{Tuple{[]byte("x")}, Tuple{"x"}, false},
		{Tuple{nil}, Tuple{Tuple{}}, false},
		{Tuple{Tuple{int64(1)}}, Tuple{Tuple{int64(1)}}, true},
		{Tuple{Tuple{int64(1)}}, Tuple{Tuple{int64(1), int64(2)}}, false},
		{Tuple{Global{"a", "b"}}, Tuple{Global{"a", "b"}}, true},
	} {
		d := &Dict{}
		require.NoError(t, d.Set(tc.a, 1))
		_, found := d.Get(tc.b)
		assert.Equal(t, tc.eq, found, "%s vs %s", Repr(tc.a), Repr(tc.b))
	}
	_, err := hashTuple(Tuple{&List{}})
	assert.ErrorContains(t, err, "unhashable key type list")
	_, err = hashTuple(chain(maxKeyDepth+1, 1, nil))
	assert.ErrorIs(t, err, ErrLimit)
}
