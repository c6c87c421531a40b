package pickle

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// The values Decode produces. Python None is Go nil; bool, int64, *big.Int
// (only for integers that do not fit in int64), float64, string and []byte
// stand for themselves. Everything else is one of the types below.

// Tuple is an immutable Python tuple.
type Tuple []any

// List is a Python list. It is a pointer type because pickles share and mutate
// lists through the memo (EMPTY_LIST, MEMOIZE, then APPENDS).
type List struct {
	Items []any
	depth int
}

// Set is a Python set or frozenset.
type Set struct {
	Items  []any
	Frozen bool
	depth  int
}

// Global is a class or function reference (GLOBAL / STACK_GLOBAL). The
// decoder never resolves it: it is only a name.
type Global struct {
	Module string
	Name   string
}

func (g Global) String() string { return g.Module + "." + g.Name }

// Object is the inert result of calling a Global: REDUCE, NEWOBJ and
// NEWOBJ_EX record the class and arguments, BUILD records the state, and
// SETITEM(S)/APPEND(S) on the object (dict and list subclasses such as
// collections.OrderedDict) record the items. Nothing is ever executed; the
// caller interprets an Object by its class path.
type Object struct {
	// Class is the called global. It is empty when the callable was itself
	// an Object (see Func).
	Class Global
	// Func is the callable when REDUCE called an Object rather than a Global
	// (protocol 2 pickles NEWOBJ_EX as functools.partial(...) then REDUCE).
	Func *Object
	// Args are the REDUCE / NEWOBJ arguments.
	Args Tuple
	// Kwargs are the NEWOBJ_EX keyword arguments, nil otherwise.
	Kwargs *Dict
	// NewObj is true when the object was made by NEWOBJ(_EX) (cls.__new__)
	// rather than REDUCE (a call).
	NewObj bool
	// State is the BUILD argument (nil when there was no BUILD). A second
	// BUILD replaces it.
	State any
	// Items are SETITEM(S) applied to the object; nil if none.
	Items *Dict
	// Appended are APPEND(S) applied to the object.
	Appended []any
	depth    int
}

// Is reports whether the object's class is module.name.
func (o *Object) Is(module, name string) bool {
	return o != nil && o.Class.Module == module && o.Class.Name == name
}

// StateDict returns the BUILD state as a dict: either the state itself, or
// from a (dict, slotsdict) pair the dict, else the slots dict. It returns nil
// when there is no dict state.
func (o *Object) StateDict() *Dict {
	switch s := o.State.(type) {
	case *Dict:
		return s
	case Tuple:
		if len(s) == 2 {
			if d, ok := s[0].(*Dict); ok {
				return d
			}
			d, _ := s[1].(*Dict)
			return d
		}
	}
	return nil
}

// DictItem is one key/value pair of a Dict.
type DictItem struct {
	Key   any
	Value any
}

// Dict is a Python dict that keeps insertion order. Keys may be None, bools,
// ints, floats, strings, bytes, Globals, tuples of those, or Objects (which
// compare by identity, as unpickled objects without __eq__ do).
type Dict struct {
	items []DictItem
	index map[any]int
	depth int
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{} }

// Len is the number of items.
func (d *Dict) Len() int {
	if d == nil {
		return 0
	}
	return len(d.items)
}

// Items returns the items in insertion order. The slice must not be modified.
func (d *Dict) Items() []DictItem {
	if d == nil {
		return nil
	}
	return d.items
}

// Get looks a key up. Unhashable keys are never found.
func (d *Dict) Get(key any) (any, bool) {
	if d == nil {
		return nil, false
	}
	k, err := hashKey(key, 0)
	if err != nil {
		return nil, false
	}
	i, ok := d.index[k]
	if !ok {
		return nil, false
	}
	return d.items[i].Value, true
}

// Set stores key → value. Setting an existing key replaces the value and keeps
// its position, as Python does.
func (d *Dict) Set(key, value any) error {
	k, err := hashKey(key, 0)
	if err != nil {
		return err
	}
	if d.index == nil {
		d.index = map[any]int{}
	}
	if i, ok := d.index[k]; ok {
		d.items[i].Value = value
		return nil
	}
	d.index[k] = len(d.items)
	d.items = append(d.items, DictItem{Key: key, Value: value})
	return nil
}

// Keys used in Dict.index for values that are not themselves comparable or
// whose Go equality differs from Python's.
type (
	noneKey  struct{}
	bytesKey string
	bigKey   string
	tupleKey string
)

// maxKeyDepth bounds recursion through nested tuples when hashing a key. The
// decoder's own depth limit is normally lower.
const maxKeyDepth = 1000

func hashKey(v any, depth int) (any, error) {
	switch x := v.(type) {
	case nil:
		return noneKey{}, nil
	case bool:
		// Python: True == 1 and hash(True) == hash(1).
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	case int64, string, Global, *Object:
		return x, nil
	case float64:
		if x == float64(int64(x)) {
			return int64(x), nil
		}
		return x, nil
	case []byte:
		return bytesKey(x), nil
	case *big.Int:
		return bigKey(x.String()), nil
	case *Set:
		if x.Frozen {
			return x, nil
		}
		return nil, fmt.Errorf("pickle: unhashable key type set")
	case Tuple:
		if depth > maxKeyDepth {
			return nil, fmt.Errorf("%w: tuple key nested deeper than %d", ErrLimit, maxKeyDepth)
		}
		var b strings.Builder
		b.WriteByte('(')
		for _, e := range x {
			k, err := hashKey(e, depth+1)
			if err != nil {
				return nil, err
			}
			writeKey(&b, k)
			b.WriteByte(',')
		}
		b.WriteByte(')')
		return tupleKey(b.String()), nil
	default:
		return nil, fmt.Errorf("pickle: unhashable key type %s", typeName(v))
	}
}

func writeKey(b *strings.Builder, k any) {
	switch x := k.(type) {
	case noneKey:
		b.WriteString("N")
	case int64:
		b.WriteString("i" + strconv.FormatInt(x, 10))
	case float64:
		b.WriteString("f" + strconv.FormatFloat(x, 'g', -1, 64))
	case string:
		b.WriteString("s" + strconv.Quote(x))
	case bytesKey:
		b.WriteString("b" + strconv.Quote(string(x)))
	case bigKey:
		b.WriteString("i" + string(x))
	case Global:
		b.WriteString("g" + strconv.Quote(x.Module) + strconv.Quote(x.Name))
	case tupleKey:
		b.WriteString(string(x))
	default: // identity-compared pointers
		fmt.Fprintf(b, "p%p", x)
	}
}

// typeName names a decoded value's Python-ish type for error messages.
func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case Tuple:
		return "tuple"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	case *Set:
		if x.Frozen {
			return "frozenset"
		}
		return "set"
	case Global:
		return "global " + x.String()
	case *Object:
		if x.Func != nil {
			return "object (call of " + typeName(x.Func) + ")"
		}
		return "object " + x.Class.String()
	default:
		return fmt.Sprintf("%T", v)
	}
}

// TypeName names v's type the way error messages of this package do
// ("int", "str", "object torch.Size", ...).
func TypeName(v any) string { return typeName(v) }

// Int returns v as an int64 when it is an integer that fits. Bools are not
// integers here.
func Int(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	}
	return 0, false
}
