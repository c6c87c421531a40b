package pickle

import "math/bits"

// Streaming: a caller that wants millions of small objects (a .metadata's
// chunks) as flat arrays, not as a tree, sets Options.Sink. The VM offers
// it every object BUILD completes and every item SETITEM(S) puts into a
// dict; what the sink takes is replaced by the small value it returns (or
// not stored at all), so no tree of them is ever built. With a sink, the
// memo keeps only the entries the pickle refers to again (see refs), since
// a pickler memoizes every object and the memo alone would hold them all.

// Sink takes objects and dict items out of a decoding as they complete.
// Its methods run on the decoder's goroutine; an error stops decoding and
// is returned wrapped in an *Error at the opcode.
type Sink interface {
	// Built offers obj when BUILD has set its state and it is in no
	// container yet. took reports that the sink took it: v replaces it on
	// the stack (a small value of the sink's own type, which marks it as
	// taken for later Dict or List consumers). A taken object is cleared
	// when Built returns (see release), so v must not be or hold obj,
	// its Args or its State.
	Built(obj *Object) (v any, took bool, err error)
	// SetItem offers a key and value SETITEM(S) puts into dict. took
	// reports that the sink took them: the dict does not keep them.
	SetItem(dict *Dict, key, value any) (took bool, err error)
}

// release clears an object the sink took, and its state dict, unless the
// memo holds them: values come from slabs (decode.go), and one value alive
// keeps its slab's neighbours alive, and what they point to; cleared, a
// taken object points to nothing.
func release(obj *Object) {
	if obj.kept {
		return
	}
	if st, ok := obj.State.(*Dict); ok && !st.kept {
		clear(st.items)
		st.items, st.index, st.tuples = nil, nil, nil
	}
	obj.Args, obj.State, obj.Extra = nil, nil, nil
}

func (d *decoder) sinkErr(err error) error {
	return &Error{Offset: d.opPos, Op: opName(d.op), Msg: "sink: " + err.Error(), Err: err}
}

// refs marks the memo indices a pickle gets (BINGET, LONG_BINGET) after it
// puts them. It is only known when every put is the next index in order
// (MEMOIZE, and CPython's BINPUT/LONG_BINPUT): then a put index is never
// replaced, and an entry no GET names can be dropped.
type refs struct {
	bits []uint64
	// rank[w] is the number of bits set in bits[:w]; kept holds the
	// entries gotten again, by rank (an index into a slice, not a map:
	// a .metadata gets millions of times).
	rank []uint32
	kept []slot
}

// at returns where idx is kept, or false when the pickle never gets it.
func (r *refs) at(idx uint32) (*slot, bool) {
	w := int(idx / 64)
	if w >= len(r.bits) {
		return nil, false
	}
	bit := uint64(1) << (idx % 64)
	if r.bits[w]&bit == 0 {
		return nil, false
	}
	return &r.kept[int(r.rank[w])+bits.OnesCount64(r.bits[w]&(bit-1))], true
}

// has reports whether memo index i is read back.
func (r *refs) has(i uint32) bool {
	w := int(i / 64)
	return w < len(r.bits) && r.bits[w]&(1<<(i%64)) != 0
}

// index makes rank and kept once the bits are known, or reports false when
// more than maxKept entries are gotten again.
func (r *refs) index(maxKept int) bool {
	r.rank = make([]uint32, len(r.bits))
	n := 0
	for w, b := range r.bits {
		r.rank[w] = uint32(n)
		n += bits.OnesCount64(b)
	}
	if n > maxKept {
		return false
	}
	r.kept = make([]slot, n)
	return true
}

func (r *refs) set(i uint32) {
	w := int(i / 64)
	for w >= len(r.bits) {
		r.bits = append(r.bits, 0)
	}
	r.bits[w] |= 1 << (i % 64)
}
