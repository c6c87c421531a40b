package deepspeed

// flatBoxes calls fn for boxes of a tensor of shape that together hold its
// C-order elements [a, b), each box's own C order one run of them from
// start (n elements): a ZeRO partition holds a parameter flattened, cut
// anywhere, and a box whose elements are one run of a file is what the read
// plan reads as one extent. A run is at most 2·len(shape)−1 boxes: the rest
// of a first partial row, whole rows, the start of a last partial row, at
// each level. fn gets fresh offsets and sizes.
func flatBoxes(shape []int64, a, b int64, fn func(off, size []int64, start, n int64)) {
	flatBoxesAt(shape, nil, 0, a, b, fn)
}

// flatBoxesAt is flatBoxes inside the sub-tensor at index prefix, whose
// first element is element base of the tensor.
func flatBoxesAt(shape, prefix []int64, base, a, b int64, fn func(off, size []int64, start, n int64)) {
	if a >= b {
		return
	}
	emit := func(lead, rows int64, start, n int64) {
		n0 := len(prefix) + len(shape)
		both := make([]int64, 0, 2*n0) // one allocation for the two
		off, size := both[:0:n0], both[n0:n0:2*n0]
		for _, p := range prefix {
			off, size = append(off, p), append(size, 1)
		}
		if len(shape) > 0 {
			off, size = append(off, lead), append(size, rows)
			for _, d := range shape[1:] {
				off, size = append(off, 0), append(size, d)
			}
		}
		fn(off, size, start, n)
	}
	if len(shape) == 0 { // a scalar: [0, 1)
		emit(0, 0, base, 1)
		return
	}
	inner := int64(1)
	for _, d := range shape[1:] {
		inner *= d
	}
	r0, r1 := a/inner, b/inner // the row of a; the row b ends in
	sub := append(prefix[:len(prefix):len(prefix)], 0)
	if a%inner != 0 { // the rest of row r0
		end := min(b, (r0+1)*inner)
		sub[len(sub)-1] = r0
		flatBoxesAt(shape[1:], sub, base+r0*inner, a-r0*inner, end-r0*inner, fn)
		r0++
		if end == b {
			return
		}
	}
	if r1 > r0 { // whole rows
		emit(r0, r1-r0, base+r0*inner, (r1-r0)*inner)
	}
	if b%inner != 0 { // the start of row r1 (a is at a row's start here)
		sub[len(sub)-1] = r1
		flatBoxesAt(shape[1:], sub, base+r1*inner, 0, b-r1*inner, fn)
	}
}
