package ckpt

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// chunksFromBytes reads a small tensor and its chunks from fuzz input: a rank
// (0-4), a shape (each dimension 0-7), then per chunk an offset and a size
// per dimension, kept in bounds so that only coverage is under test.
func chunksFromBytes(data []byte) *Tensor {
	next := func() int64 {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return int64(b)
	}
	rank := int(next() % 5)
	shape := make([]int64, rank)
	for d := range shape {
		shape[d] = next() % 8
	}
	var chunks []Chunk
	for len(data) > 0 && len(chunks) < 32 {
		c := box(make([]int64, rank), make([]int64, rank))
		for d, s := range shape {
			c.Offsets[d] = next() % (s + 1)
			c.Sizes[d] = next() % (s - c.Offsets[d] + 1)
		}
		chunks = append(chunks, c)
		if rank == 0 {
			next()
		}
	}
	return tensor(shape, chunks...)
}

// FuzzValidateCoverage checks the coverage sweep against counting every
// element: valid exactly when each element is in one chunk, and an error
// names the first element that is not, with chunks that really hold it.
func FuzzValidateCoverage(f *testing.F) {
	f.Add([]byte{2, 4, 4, 0, 4, 0, 4})
	f.Add([]byte{2, 4, 4, 0, 2, 0, 4, 2, 2, 0, 4})
	f.Add([]byte{2, 3, 3, 0, 2, 0, 1, 0, 1, 1, 2, 1, 2, 2, 1, 2, 0, 1, 2, 1, 1, 1, 1})
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{3, 2, 3, 4, 0, 2, 0, 3, 0, 2, 0, 2, 0, 3, 2, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		tn := chunksFromBytes(data)
		var first []int64
		firstN := 0
		countCover(tn.Shape, tn.Chunks.Values(), func(elem []int64, n int) bool {
			if n != 1 {
				first, firstN = slices.Clone(elem), n
				return false
			}
			return true
		})
		err := tn.Validate()
		if general := errString(tn.validate(false)); general != errString(err) {
			t.Fatalf("shape %v chunks %v: one pass says %v, the general check %q", tn.Shape, tn.Chunks.Values(), err, general)
		}
		switch {
		case first == nil && err != nil:
			t.Fatalf("shape %v chunks %v tile, but: %v", tn.Shape, tn.Chunks.Values(), err)
		case first == nil:
			return
		case err == nil:
			t.Fatalf("shape %v chunks %v: element %v is in %d chunks, but Validate passed", tn.Shape, tn.Chunks.Values(), first, firstN)
		}
		msg := err.Error()
		want := fmt.Sprintf("no chunk holds element %v", first)
		if firstN > 1 {
			want = fmt.Sprintf("overlap (both hold element %v)", first)
			var a, b int
			at := strings.Index(msg, "chunks ")
			if at < 0 {
				t.Fatalf("%s: names no chunks", msg)
			}
			if _, serr := fmt.Sscanf(msg[at:], "chunks %d and %d", &a, &b); serr != nil || a == b ||
				!slices.Equal(first, clampTo(first, tn.Chunks.At(a))) || !slices.Equal(first, clampTo(first, tn.Chunks.At(b))) {
				t.Fatalf("%s: the chunks named do not both hold %v", msg, first)
			}
		}
		if !strings.Contains(msg, want) {
			t.Fatalf("shape %v chunks %v: got %q, want it to say %q", tn.Shape, tn.Chunks.Values(), msg, want)
		}
	})
}

// clampTo moves elem into chunk c: it is unchanged exactly when c holds it.
func clampTo(elem []int64, c Chunk) []int64 {
	out := slices.Clone(elem)
	for d := range out {
		out[d] = max(c.Offsets[d], min(out[d], c.Offsets[d]+c.Sizes[d]-1))
	}
	return out
}
