package ckpt

import (
	"cmp"
	"errors"
	"slices"
)

// Chunk coverage: do a tensor's chunks tile its shape, every element in
// exactly one chunk? (Validate answers the commonest case, rows of the first
// dimension in order, in one pass before coming here.)
//
// Count how many chunks hold each element, minus one for the tensor itself:
// the chunks tile the shape exactly when that count f is zero everywhere.
// Sweep the first dimension: f changes between the slices x=p-1 and x=p only
// by the chunks that start at p (+1) and end at p (-1), each contributing its
// box in the remaining dimensions. So f is zero everywhere exactly when, at
// every p, the signed boxes that start or end there add up to zero in the
// remaining dimensions, which is the same question one dimension down.
// Identical boxes with opposite signs cancel before going down: where one
// chunk ends and the next starts with the same cross-section (every regular
// grid), nothing is left to check. Going down in order of p finds the
// lexicographically first element where f is not zero: covered twice (an
// overlap) or not at all (a hole).
//
// Each level at most doubles what reaches the next, so the work is
// O(n log n) for chunks split along one or two dimensions whatever their
// layout, and grows with 2^dims only for irregular layouts split along many;
// errTooIrregular is returned when checking coverage exceeds its budget.
var errTooIrregular = errors.New("chunk layout too irregular to check")

// coverBudget bounds the signed boxes a coverage check may sort, in
// proportion to the chunks, so that the time to open a checkpoint stays
// proportional to its size: irregular splits along up to 5 dimensions fit.
func coverBudget(chunks int) int { return 1<<16 + 64*chunks }

// uncovered finds the lexicographically first element of shape that the
// chunks in idx (non-empty, in bounds) do not cover exactly once. It returns
// the element and how many chunks hold it, or ok=false when they tile the
// shape.
func uncovered(shape []int64, chunks *Chunks, idx []int) (elem []int64, count int64, ok bool, err error) {
	var dims []int // the dimensions some chunk splits
	for d := range shape {
		for _, i := range idx {
			if off, sizes := chunks.box(i); off[d] != 0 || sizes[d] != shape[d] {
				dims = append(dims, d)
				break
			}
		}
	}
	// Box b spans [box[b*2D+2k], box[b*2D+2k+1]) along dims[k]; the last
	// box is the tensor.
	D := len(dims)
	c := coverage{dims: D, box: make([]int64, 0, 2*D*(len(idx)+1)), budget: coverBudget(len(idx))}
	items := make([]signedBox, 0, len(idx)+1)
	for n, i := range idx {
		for _, d := range dims {
			off, sizes := chunks.box(i)
			c.box = append(c.box, off[d], off[d]+sizes[d])
		}
		items = append(items, signedBox{box: int32(n), w: 1})
	}
	for _, d := range dims {
		c.box = append(c.box, 0, shape[d])
	}
	if total, _ := NumElements(shape); total > 0 {
		items = append(items, signedBox{box: int32(len(idx)), w: -1})
	}
	at, f, err := c.first(items, 0)
	if err != nil || f == 0 {
		return nil, 0, false, err
	}
	elem = make([]int64, len(shape))
	for k, d := range dims {
		elem[d] = at[k]
	}
	return elem, f + 1, true, nil
}

// signedBox is a box with a weight.
type signedBox struct {
	box int32
	w   int32
}

// event is where a signed box starts or ends along one dimension.
type event struct {
	pos int64
	signedBox
}

type coverage struct {
	dims   int     // dimensions checked
	box    []int64 // per box and dimension: start, end
	budget int     // signed boxes left to sort
}

// extent returns box b's [start, end) pairs along dims[k:].
func (c *coverage) extent(b signedBox, k int) []int64 {
	at := int(b.box) * 2 * c.dims
	return c.box[at+2*k : at+2*c.dims]
}

// first returns the lexicographically first point of dims[k:] where the
// signed boxes in items do not add up to zero, and their sum there.
func (c *coverage) first(items []signedBox, k int) ([]int64, int64, error) {
	if k == c.dims {
		var sum int64
		for _, b := range items {
			sum += int64(b.w)
		}
		return nil, sum, nil
	}
	c.budget -= 2 * len(items)
	if c.budget < 0 {
		return nil, 0, errTooIrregular
	}
	events := make([]event, 0, 2*len(items))
	for _, b := range items {
		e := c.extent(b, k)
		events = append(events, event{e[0], b}, event{e[1], signedBox{b.box, -b.w}})
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.pos, b.pos) })
	var next []signedBox
	for g := 0; g < len(events); {
		pos := events[g].pos
		end := g + 1
		for end < len(events) && events[end].pos == pos {
			end++
		}
		group := events[g:end]
		g = end
		// Merge boxes equal in the remaining dimensions.
		if len(group) > 1 && k+1 < c.dims {
			slices.SortFunc(group, func(a, b event) int {
				return slices.Compare(c.extent(a.signedBox, k+1), c.extent(b.signedBox, k+1))
			})
		}
		next = next[:0]
		for i := 0; i < len(group); {
			b := group[i].signedBox
			rest := c.extent(b, k+1)
			for i++; i < len(group) && slices.Equal(rest, c.extent(group[i].signedBox, k+1)); i++ {
				b.w += group[i].w
			}
			if b.w != 0 {
				next = append(next, b)
			}
		}
		if len(next) == 0 {
			continue
		}
		at, f, err := c.first(next, k+1)
		if err != nil || f != 0 {
			return append([]int64{pos}, at...), f, err
		}
	}
	return nil, 0, nil
}

// holding returns the first two chunks among idx that hold elem.
func holding(chunks *Chunks, idx []int, elem []int64) (a, b int) {
	found := make([]int, 0, 2)
	for _, i := range idx {
		off, sizes := chunks.box(i)
		in := true
		for d, x := range elem {
			if x < off[d] || x >= off[d]+sizes[d] {
				in = false
				break
			}
		}
		if in {
			if found = append(found, i); len(found) == 2 {
				break
			}
		}
	}
	for len(found) < 2 {
		found = append(found, -1)
	}
	return found[0], found[1]
}
