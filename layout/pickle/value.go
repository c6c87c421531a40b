package pickle

import (
	"fmt"
	"math/big"
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
	node
}

// Set is a Python set or frozenset.
type Set struct {
	Items  []any
	Frozen bool
	node
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
	// an Object (see ObjectExtra.Func).
	Class Global
	// Args are the REDUCE / NEWOBJ arguments.
	Args Tuple
	// State is the BUILD argument (nil when there was no BUILD). A second
	// BUILD replaces it.
	State any
	// Extra holds what few objects have; nil when the object has none of
	// it. Apart, it keeps the millions of objects of a .metadata small
	// (a third of their bytes, which a fresh mount pays for in page faults).
	Extra *ObjectExtra
	// NewObj is true when the object was made by NEWOBJ(_EX) (cls.__new__)
	// rather than REDUCE (a call).
	NewObj bool
	node
}

// ObjectExtra is the part of an Object that few objects have.
type ObjectExtra struct {
	// Func is the callable when REDUCE called an Object rather than a Global
	// (protocol 2 pickles NEWOBJ_EX as functools.partial(...) then REDUCE).
	Func *Object
	// Kwargs are the NEWOBJ_EX keyword arguments, nil otherwise.
	Kwargs *Dict
	// Items are SETITEM(S) applied to the object; nil if none.
	Items *Dict
	// Appended are APPEND(S) applied to the object.
	Appended []any
}

// Extras returns the object's ObjectExtra, zero when it has none.
func (o *Object) Extras() ObjectExtra {
	if o.Extra == nil {
		return ObjectExtra{}
	}
	return *o.Extra
}

// extra returns the object's ObjectExtra, added if it had none.
func (o *Object) extra() *ObjectExtra {
	if o.Extra == nil {
		o.Extra = &ObjectExtra{}
	}
	return o.Extra
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
// ints, floats, strings, bytes, Globals, tuples of those, or Objects and
// frozensets (which compare by identity, as unpickled objects without __eq__
// do). Tuple keys are hashed and compared without expanding what the memo
// shares (see key.go).
type Dict struct {
	items  []DictItem
	index  map[any]int         // normalized non-tuple key → item, once the dict outgrows smallDict
	tuples map[tupleHash][]int // tuple key hash → items whose keys hash alike
	node
}

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
	i, _, err := d.find(key)
	if err != nil || i < 0 {
		return nil, false
	}
	return d.items[i].Value, true
}

// Set stores key → value. Setting an existing key replaces the value and keeps
// its position, as Python does.
func (d *Dict) Set(key, value any) error {
	i, k, err := d.find(key)
	if err != nil {
		return err
	}
	if i >= 0 {
		d.items[i].Value = value
		return nil
	}
	i = len(d.items)
	if h, ok := k.(tupleHash); ok {
		d.items = append(d.items, DictItem{Key: key, Value: value})
		if d.tuples == nil {
			d.tuples = map[tupleHash][]int{}
		}
		d.tuples[h] = append(d.tuples[h], i)
		return nil
	}
	d.items = append(d.items, DictItem{Key: key, Value: value})
	switch {
	case d.index != nil:
		d.index[k] = i
	case len(d.items) > smallDict:
		d.index = make(map[any]int, 2*len(d.items))
		for j, it := range d.items {
			if k, err := scalarKey(it.Key); err == nil { // not a tuple
				d.index[k] = j
			}
		}
	}
	return nil
}

// smallDict is the size up to which a dict finds scalar keys by scanning
// its items: a .metadata holds hundreds of thousands of 3-key dicts (the
// state of every chunk's index and storage entry), where a map each would
// dominate decoding.
const smallDict = 8

// find returns the index of key's item (-1 if absent) and the key's
// normalized form: its tuple hash for a tuple, else the scalar key.
func (d *Dict) find(key any) (int, any, error) {
	if t, ok := key.(Tuple); ok {
		h, err := hashTuple(t)
		if err != nil {
			return -1, nil, err
		}
		for _, i := range d.tuples[h] {
			if tuplesEqual(d.items[i].Key.(Tuple), t) {
				return i, h, nil
			}
		}
		return -1, h, nil
	}
	k, err := scalarKey(key)
	if err != nil {
		return -1, nil, err
	}
	if d.index == nil {
		// Normalizing again rather than keeping each item's normalized
		// key costs less than the 16 bytes per item a .metadata's
		// million dict items would hold.
		for i := range d.items {
			if n, err := scalarKey(d.items[i].Key); err == nil && n == k {
				return i, k, nil
			}
		}
		return -1, k, nil
	}
	if i, ok := d.index[k]; ok {
		return i, k, nil
	}
	return -1, k, nil
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
		if f := x.Extras().Func; f != nil {
			return "object (call of " + typeName(f) + ")"
		}
		return "object " + x.Class.String()
	default:
		return fmt.Sprintf("%T", v)
	}
}

// TypeName names v's type the way error messages of this package do
// ("int", "str", "object torch.Size", ...).
func TypeName(v any) string { return typeName(v) }

// Seq returns the items of v when it is a tuple or a list (pickle writes
// either for a Python sequence).
func Seq(v any) ([]any, bool) {
	switch x := v.(type) {
	case Tuple:
		return x, true
	case *List:
		return x.Items, true
	}
	return nil, false
}

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
