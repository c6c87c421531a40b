package ckpt

import (
	"math"
	"math/rand"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rowsOf cuts shape along its first dimension into n rows of random heights,
// in order, with empty chunks here and there: FSDP's layout.
func rowsOf(rng *rand.Rand, shape []int64, n int) []Chunk {
	var chunks []Chunk
	at := int64(0)
	for k := 0; k < n && at < shape[0]; k++ {
		h := 1 + rng.Int63n(max(1, 2*shape[0]/int64(n)))
		if k == n-1 {
			h = shape[0] - at
		}
		h = min(h, shape[0]-at)
		off := make([]int64, len(shape))
		off[0] = at
		size := slices.Clone(shape)
		size[0] = h
		chunks = append(chunks, box(off, size))
		at += h
		if rng.Intn(4) == 0 { // an empty chunk, as torch writes for ranks past the end
			e := box(slices.Clone(off), slices.Clone(size))
			e.Offsets[0], e.Sizes[0] = at, 0
			chunks = append(chunks, e)
		}
	}
	return chunks
}

// hostile breaks rows in ways the one-pass proof must not accept.
func hostile(rng *rand.Rand, shape []int64, chunks []Chunk) []Chunk {
	if len(chunks) == 0 {
		return chunks
	}
	i := rng.Intn(len(chunks))
	c := box(slices.Clone(chunks[i].Offsets), slices.Clone(chunks[i].Sizes))
	d := rng.Intn(len(shape))
	switch rng.Intn(9) {
	case 0: // out of order
		j := rng.Intn(len(chunks))
		chunks[i], chunks[j] = chunks[j], chunks[i]
		return chunks
	case 1: // out of bounds
		c.Sizes[d] = shape[d] - c.Offsets[d] + 1
	case 2: // negative
		if rng.Intn(2) == 0 {
			c.Offsets[d] = -1
		} else {
			c.Sizes[d] = -1
		}
	case 3: // overflowing the end
		c.Offsets[d] = math.MaxInt64 - rng.Int63n(2)
		c.Sizes[d] = math.MaxInt64
	case 4: // short of a full row
		if c.Sizes[d] > 0 {
			c.Sizes[d]--
		}
	case 5: // moved by one: an overlap or a hole
		c.Offsets[d] += int64(rng.Intn(3)) - 1
	case 6: // a chunk twice
		return append(chunks, c)
	case 7: // a chunk dropped
		return slices.Delete(chunks, i, i+1)
	case 8: // rank of another tensor
		c.Offsets = append(c.Offsets, 0)
	}
	chunks[i] = c
	return chunks
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestValidateRowsAgainstGeneral checks the one-pass proof for rows against
// the general check, and both against counting every element, on rows
// intact and broken: the same verdict and the same message.
func TestValidateRowsAgainstGeneral(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	valid := 0
	for iter := 0; iter < 3000; iter++ {
		rank := 1 + rng.Intn(4)
		shape := make([]int64, rank)
		for d := range shape {
			shape[d] = 1 + rng.Int63n(5)
		}
		chunks := rowsOf(rng, shape, 1+rng.Intn(8))
		for k := rng.Intn(3); k > 0; k-- {
			chunks = hostile(rng, shape, chunks)
		}
		tn := tensor(shape, chunks...)
		fast, general := errString(tn.Validate()), errString(tn.validate(false))
		require.Equal(t, general, fast, "shape %v chunks %v", shape, chunks)
		if fast == "" {
			valid++
			tiles := true
			countCover(shape, chunks, func(_ []int64, n int) bool { tiles = n == 1; return tiles })
			require.True(t, tiles, "shape %v chunks %v", shape, chunks)
		}
	}
	// Both kinds were tried.
	assert.Greater(t, valid, 300)
	assert.Less(t, valid, 2700)
}

// FuzzValidateRows checks that the one-pass proof agrees with the general
// check, message for message, on any chunks of any values: negative,
// overflowing, out of bounds, of another rank.
func FuzzValidateRows(f *testing.F) {
	f.Add([]byte{2, 4, 3, 0, 2, 0, 3, 2, 2, 0, 3})
	f.Add([]byte{1, 4, 0, 2, 2, 2, 2, 0})
	f.Add([]byte{2, 4, 3, 0, 2, 0, 3, 1, 2, 0, 3})
	f.Add([]byte{1, 4, 255, 255, 0, 4})
	f.Add([]byte{3, 2, 2, 2, 0, 1, 0, 2, 0, 2, 1, 1, 0, 2, 0, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int64 {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			switch b {
			case 255:
				return math.MaxInt64
			case 254:
				return math.MinInt64
			case 253:
				return -1
			}
			return int64(b % 8)
		}
		rank := 0
		if len(data) > 0 {
			rank, data = int(data[0]%4), data[1:]
		}
		shape := make([]int64, rank)
		for d := range shape {
			shape[d] = next()
		}
		var chunks []Chunk
		for len(data) > 0 && len(chunks) < 32 {
			r := rank
			if len(data) > 0 && data[0] == 252 { // a chunk of another rank
				data = data[1:]
				r++
			}
			c := box(make([]int64, r), make([]int64, r))
			for d := range r {
				c.Offsets[d], c.Sizes[d] = next(), next()
			}
			chunks = append(chunks, c)
		}
		tn := tensor(shape, chunks...)
		fast, general := errString(tn.Validate()), errString(tn.validate(false))
		if fast != general {
			t.Fatalf("shape %v chunks %v: one pass says %q, the general check %q", shape, chunks, fast, general)
		}
	})
}

// The rows of a 405B-sized tensor from 512 ranks are proved in one pass
// that allocates nothing but the mark (the general check allocates per
// chunk), and a break in them is still found.
func TestValidateRowsInOnePass(t *testing.T) {
	const n = 1 << 16
	shape := i64{n * 3, 16384}
	var chunks []Chunk
	for i := int64(0); i < n; i++ {
		chunks = append(chunks, box(i64{3 * i, 0}, i64{3, 16384}), box(i64{3 * (i + 1), 0}, i64{0, 16384}))
	}
	tn := tensor(shape, chunks...)
	require.NoError(t, tn.Validate())
	allocs := testing.AllocsPerRun(5, func() {
		if err := tn.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	assert.LessOrEqual(t, allocs, 3.0)

	c := chunks[2*(n/2)]
	chunks[2*(n/2)] = box(i64{c.Offsets[0] + 1, 0}, i64{2, 16384})
	assert.ErrorContains(t, tensor(shape, chunks...).Validate(),
		"chunks cover 3221209088 of 3221225472 elements (hole in chunk coverage): no chunk holds element [98304 0]")
}

// CheckValid does not check again a tensor Validate passed, and checks
// again one changed since in any way that can break its tiling.
func TestCheckValidAfterChange(t *testing.T) {
	grid := func() *Tensor {
		return tensor(i64{4, 6}, box(i64{0, 0}, i64{2, 3}), box(i64{0, 3}, i64{2, 3}), box(i64{2, 0}, i64{2, 3}), box(i64{2, 3}, i64{2, 3}))
	}
	tn := grid()
	require.NoError(t, tn.Validate())
	// The general check allocates; CheckValid of the marked tensor does not.
	assert.Zero(t, testing.AllocsPerRun(10, func() { require.NoError(t, tn.CheckValid()) }))
	assert.NotZero(t, testing.AllocsPerRun(10, func() { require.NoError(t, tn.Validate()) }))
	// Its sources are not what it checked: a new source keeps the mark.
	tn.Chunks.SetSource(0, nil)
	assert.Zero(t, testing.AllocsPerRun(10, func() { require.NoError(t, tn.CheckValid()) }))

	for _, tc := range []struct {
		name   string
		change func(tn *Tensor)
		err    string
	}{
		{"never validated", func(tn *Tensor) { tn.valid = atomic.Value{} }, ""},
		{"a chunk added", func(tn *Tensor) { tn.Chunks.Add(i64{1, 1}, i64{1, 1}, nil) }, "overlap (both hold element [1 1])"},
		{"a chunk added in spare capacity", func(tn *Tensor) {
			cs := MakeChunks(tn.Chunks.Values()...)
			cs.Grow(1, 2)
			tn.Chunks = cs
			require.NoError(t, tn.Validate())
			tn.Chunks.Add(i64{0, 0}, i64{1, 1}, nil)
		}, "overlap (both hold element [0 0])"},
		{"chunks replaced", func(tn *Tensor) { tn.Chunks = MakeChunks(tn.Chunks.Values()[1:]...) }, "no chunk holds element [0 0]"},
		{"chunks replaced by ones of the same length", func(tn *Tensor) {
			cs := tn.Chunks.Values()
			cs[3] = cs[0]
			tn.Chunks = MakeChunks(cs...)
		}, "overlap (both hold element [0 0])"},
		{"shape changed in place", func(tn *Tensor) { tn.Shape[1]++ }, "no chunk holds element [0 6]"},
		{"shape replaced", func(tn *Tensor) { tn.Shape = i64{4, 5} }, "is outside shape [4 5]"},
		{"dtype changed", func(tn *Tensor) { tn.DType = "X9" }, `unknown dtype "X9"`},
		{"copied, then chunks replaced", func(tn *Tensor) {
			twin := *tn
			twin.Chunks = MakeChunks(tn.Chunks.Values()[:3]...)
			*tn = twin
		}, "no chunk holds element [2 3]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn := grid()
			require.NoError(t, tn.Validate())
			tc.change(tn)
			err := tn.CheckValid()
			if tc.err == "" {
				require.NoError(t, err)
				// Not marked before: checked, and marked now.
				assert.Zero(t, testing.AllocsPerRun(10, func() { require.NoError(t, tn.CheckValid()) }))
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.err)
		})
	}

	// A broken tensor never validated is checked.
	bad := tensor(i64{4}, box(i64{0}, i64{3}))
	assert.ErrorContains(t, bad.CheckValid(), "no chunk holds element [3]")
	// A copy of a marked tensor, unchanged, keeps the mark.
	twin := *tn
	assert.NoError(t, twin.CheckValid())
}
