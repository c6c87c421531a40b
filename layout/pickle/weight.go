package pickle

import "math"

// Expanded size.
//
// The memo lets a pickle refer to one value many times: a tuple of ten
// references to a tuple of ten references to ... is 250 bytes of input and
// 10^10 values to anyone who walks it. So MaxItems bounds the expanded size
// of what is decoded, as if every memo reference were a copy: a value put
// into a container for the first time costs one item (its contents were
// counted when they went into it), and a value put in again (fetched from
// the memo or DUP) costs its whole weight, where
//
//	weight(container) = 1 + the weights of everything put into it
//	weight(str/bytes) = 1 + len/itemBytes
//	weight(other)     = 1
//
// Tuples are immutable, so their weight is fixed when they are built; the
// mutable containers keep theirs in a node. A container that grows after it
// was put somewhere (only recursive structures do that in what Python
// writes) makes the running count an underestimate, so then the result is
// recounted exactly once decoding ends.

// itemBytes is how many bytes of a str or bytes count as one item when the
// string is referenced again: a string shared a million times costs what a
// million copies would.
const itemBytes = 16

// node is the bookkeeping of a mutable container (list, dict, set, object).
type node struct {
	weight int64 // expanded size
	depth  int32 // nesting depth: 1 + the deepest thing put into it (as slot.d)
	placed bool  // put into a container; growth after that is "late"
	kept   bool  // held by the memo (only tracked with a Sink)
}

func newNode() node { return node{depth: 1, weight: 1} }

func nodeOf(v any) *node {
	switch x := v.(type) {
	case *List:
		return &x.node
	case *Dict:
		return &x.node
	case *Set:
		return &x.node
	case *Object:
		return &x.node
	}
	return nil
}

// addWeight adds without overflowing.
func addWeight(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func scalarWeight(v any) int64 {
	switch x := v.(type) {
	case string:
		return 1 + int64(len(x))/itemBytes
	case []byte:
		return 1 + int64(len(x))/itemBytes
	}
	return 1
}

// expandedSize counts v's expanded size exactly, up to limit: each distinct
// container is weighed once, and a reference back to a container being
// weighed (a cycle) counts one, as a walker that tracks its path sees it.
func expandedSize(v any, limit int64) int64 {
	w := weigher{limit: limit, done: map[any]int64{}, open: map[any]bool{}}
	return w.weigh(v)
}

type weigher struct {
	limit int64
	done  map[any]int64 // container pointer or tupleID → weight
	open  map[any]bool  // containers on the current path
}

func (w *weigher) weigh(v any) int64 {
	var id any
	switch x := v.(type) {
	case Tuple:
		if len(x) == 0 {
			return 1
		}
		id = idOf(x)
	case *List, *Dict, *Set, *Object:
		id = x
	default:
		return scalarWeight(v)
	}
	if n, ok := w.done[id]; ok {
		return n
	}
	if w.open[id] {
		return 1
	}
	w.open[id] = true
	n := int64(1)
	w.children(v, func(c any) bool {
		n = addWeight(n, w.weigh(c))
		return n <= w.limit
	})
	delete(w.open, id)
	w.done[id] = n
	return n
}

// children calls f on each value v holds until f returns false.
func (w *weigher) children(v any, f func(any) bool) {
	each := func(items []any) bool {
		for _, c := range items {
			if !f(c) {
				return false
			}
		}
		return true
	}
	dict := func(d *Dict) bool {
		for _, it := range d.Items() {
			if !f(it.Key) || !f(it.Value) {
				return false
			}
		}
		return true
	}
	switch x := v.(type) {
	case Tuple:
		each(x)
	case *List:
		each(x.Items)
	case *Set:
		each(x.Items)
	case *Dict:
		dict(x)
	case *Object:
		e := x.Extras()
		_ = (e.Func == nil || f(e.Func)) && each(x.Args) && dict(e.Kwargs) &&
			f(x.State) && dict(e.Items) && each(e.Appended)
	}
}
