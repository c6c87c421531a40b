package pickle

import (
	"math/big"
	"strconv"
	"strings"
)

// maxReprDepth and maxReprLen bound Repr on hostile values.
const (
	maxReprDepth = 64
	maxReprLen   = 1 << 16
)

// Repr renders a decoded value in a Python-like notation, for messages and
// tests. A container that contains itself prints as "..." where it recurs;
// deep or long output is cut short with "…".
func Repr(v any) string {
	r := reprer{seen: map[any]bool{}}
	r.write(v, 0)
	return r.b.String()
}

type reprer struct {
	b    strings.Builder
	seen map[any]bool // containers on the current path
	cut  bool
}

func (r *reprer) s(s string) {
	if r.cut {
		return
	}
	if r.b.Len()+len(s) > maxReprLen {
		r.b.WriteString("…")
		r.cut = true
		return
	}
	r.b.WriteString(s)
}

func (r *reprer) seq(items []any, depth int) {
	for i, it := range items {
		if i > 0 {
			r.s(", ")
		}
		r.write(it, depth+1)
	}
}

func (r *reprer) write(v any, depth int) {
	if r.cut {
		return
	}
	if depth > maxReprDepth {
		r.s("…")
		return
	}
	if nodeOf(v) != nil { // a container, which may hold itself
		if r.seen[v] {
			r.s("...")
			return
		}
		r.seen[v] = true
		defer delete(r.seen, v)
	}
	switch x := v.(type) {
	case nil:
		r.s("None")
	case bool:
		if x {
			r.s("True")
		} else {
			r.s("False")
		}
	case int64:
		r.s(strconv.FormatInt(x, 10))
	case *big.Int:
		r.s(x.String())
	case float64:
		r.s(strconv.FormatFloat(x, 'g', -1, 64))
	case string:
		r.s(strconv.Quote(x))
	case []byte:
		r.s("b" + strconv.Quote(string(x)))
	case Global:
		r.s(x.String())
	case Tuple:
		r.s("(")
		r.seq(x, depth)
		if len(x) == 1 {
			r.s(",")
		}
		r.s(")")
	case *List:
		r.s("[")
		r.seq(x.Items, depth)
		r.s("]")
	case *Set:
		if x.Frozen {
			r.s("frozenset")
		}
		r.s("{")
		r.seq(x.Items, depth)
		r.s("}")
	case *Dict:
		r.dict(x, depth)
	case *Object:
		e := x.Extras()
		if e.Func != nil {
			r.write(e.Func, depth+1)
		} else {
			r.s(x.Class.String())
		}
		if x.NewObj {
			r.s(".__new__")
		}
		r.s("(")
		r.seq(x.Args, depth)
		if e.Kwargs != nil {
			r.s(", **")
			r.dict(e.Kwargs, depth)
		}
		r.s(")")
		if x.State != nil {
			r.s("<state ")
			r.write(x.State, depth+1)
			r.s(">")
		}
		if e.Items != nil {
			r.s("<items ")
			r.dict(e.Items, depth)
			r.s(">")
		}
		if len(e.Appended) > 0 {
			r.s("<appended [")
			r.seq(e.Appended, depth)
			r.s("]>")
		}
	default:
		r.s("<" + typeName(v) + ">")
	}
}

func (r *reprer) dict(d *Dict, depth int) {
	r.s("{")
	for i, it := range d.Items() {
		if i > 0 {
			r.s(", ")
		}
		r.write(it.Key, depth+1)
		r.s(": ")
		r.write(it.Value, depth+1)
	}
	r.s("}")
}
