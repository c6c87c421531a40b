package pickle

import (
	"encoding/binary"
	"math"
	"strings"
)

// Encoder writes a protocol-2 pickle of the few shapes torch's files need
// (FORMATS.md §2.6, §3.4): GLOBAL classes, cls.__new__ + BUILD objects,
// REDUCE calls, persistent ids, dicts, lists, tuples, str, int, bool and
// None. It uses no memo (NewMemoEncoder's does, in protocol 4, as CPython
// writes one: files of torch's shape for tests). Integers and strings use
// the opcodes CPython's pickler picks for protocol 2, so the output is
// what pickle.dumps(obj, 2) gives for the same object graph, minus the
// memo opcodes; Decode reads it back.
//
// Containers take their element count and a function that writes the
// elements: the count picks the opcodes (TUPLE1..3 or MARK ... TUPLE), as
// CPython does.
type Encoder struct {
	b []byte
	// memo, in a memo encoder, is the memo index of each str and global
	// written ("s" or "g" and its text), which are written again as gets;
	// n counts the entries put.
	memo map[string]uint32
	n    uint32
}

// NewEncoder starts a protocol-2 pickle.
func NewEncoder() *Encoder { return &Encoder{b: []byte{opPROTO, 2}} }

// NewMemoEncoder starts a protocol-4 pickle with a memo as CPython's
// pickler keeps one: every str, global, non-empty tuple, list, dict and
// object is memoized where it is written, and a str or global equal to
// one written before is written as a get of it (CPython gets an object
// it met before: its field names, a class, a name used twice); nothing
// else is ever got again. Files of torch's shape for tests and benchmarks
// (a .metadata pickled by torch, without torch).
func NewMemoEncoder() *Encoder { return &Encoder{b: []byte{opPROTO, 4}, memo: map[string]uint32{}} }

// put memoizes the value just written, in a memo encoder.
func (e *Encoder) put() {
	if e.memo != nil {
		e.b = append(e.b, opMEMOIZE)
		e.n++
	}
}

// got writes a get of the value memoized as key, if it was.
func (e *Encoder) got(key string) bool {
	i, ok := e.memo[key]
	switch {
	case !ok:
		return false
	case i < 1<<8:
		e.b = append(e.b, opBINGET, byte(i))
	default:
		e.b = append(e.b, opLONG_BINGET)
		e.b = binary.LittleEndian.AppendUint32(e.b, i)
	}
	return true
}

// remember notes that the value just written is memo entry key, and
// memoizes it.
func (e *Encoder) remember(key string) {
	e.memo[key] = e.n
	e.put()
}

// Bytes ends the pickle (STOP) and returns it. The Encoder must not be used
// afterwards.
func (e *Encoder) Bytes() []byte { return append(e.b, opSTOP) }

// Global pushes the class or function module.name.
func (e *Encoder) Global(module, name string) {
	if e.memo != nil {
		// Protocol 4: STACK_GLOBAL, as CPython writes it.
		key := "g" + module + "\n" + name
		if e.got(key) {
			return
		}
		e.Str(module)
		e.Str(name)
		e.b = append(e.b, opSTACK_GLOBAL)
		e.remember(key)
		return
	}
	if strings.ContainsRune(module, '\n') || strings.ContainsRune(name, '\n') {
		// GLOBAL's operands are lines. A name read from a hostile file can
		// hold a newline; STACK_GLOBAL (protocol 4, read by CPython in any
		// stream) takes them as strings.
		e.Str(module)
		e.Str(name)
		e.b = append(e.b, opSTACK_GLOBAL)
		return
	}
	e.b = append(e.b, opGLOBAL)
	e.b = append(e.b, module...)
	e.b = append(e.b, '\n')
	e.b = append(e.b, name...)
	e.b = append(e.b, '\n')
}

// Str pushes a str.
func (e *Encoder) Str(s string) {
	if e.memo != nil {
		key := "s" + s
		if e.got(key) {
			return
		}
		if len(s) < 1<<8 {
			e.b = append(e.b, opSHORT_BINUNICODE, byte(len(s)))
			e.b = append(e.b, s...)
			e.remember(key)
			return
		}
		defer e.remember(key)
	}
	e.b = append(e.b, opBINUNICODE)
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(s)))
	e.b = append(e.b, s...)
}

// NewStr pushes a str as a pickler writes a str object it has not met,
// though equal to one it has (torch's MetadataIndex.fqn, made anew for
// each chunk): in full, memoized, never got again. Str, in an encoder
// without a memo.
func (e *Encoder) NewStr(s string) {
	if e.memo == nil || len(s) >= 1<<8 {
		memo := e.memo
		e.memo = nil
		e.Str(s)
		if e.memo = memo; memo != nil {
			e.put()
		}
		return
	}
	e.b = append(e.b, opSHORT_BINUNICODE, byte(len(s)))
	e.b = append(e.b, s...)
	e.put()
}

// Int pushes an int with the shortest opcode CPython uses.
func (e *Encoder) Int(v int64) {
	switch {
	case v >= 0 && v < 1<<8:
		e.b = append(e.b, opBININT1, byte(v))
	case v >= 0 && v < 1<<16:
		e.b = append(e.b, opBININT2)
		e.b = binary.LittleEndian.AppendUint16(e.b, uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		e.b = append(e.b, opBININT)
		e.b = binary.LittleEndian.AppendUint32(e.b, uint32(int32(v)))
	default:
		e.long1(v)
	}
}

// long1 writes LONG1: little-endian two's complement in the fewest bytes
// that keep the sign, as CPython's encode_long does.
func (e *Encoder) long1(v int64) {
	le := binary.LittleEndian.AppendUint64(nil, uint64(v))
	for len(le) > 1 {
		top, next := le[len(le)-1], le[len(le)-2]
		if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
			le = le[:len(le)-1]
			continue
		}
		break
	}
	e.b = append(e.b, opLONG1, byte(len(le)))
	e.b = append(e.b, le...)
}

// Bool pushes True or False.
func (e *Encoder) Bool(v bool) {
	if v {
		e.b = append(e.b, opNEWTRUE)
	} else {
		e.b = append(e.b, opNEWFALSE)
	}
}

// None pushes None.
func (e *Encoder) None() { e.b = append(e.b, opNONE) }

// Tuple pushes a tuple of the n values items pushes.
func (e *Encoder) Tuple(n int, items func()) {
	switch n {
	case 0:
		e.b = append(e.b, opEMPTY_TUPLE)
	case 1, 2, 3:
		items()
		e.b = append(e.b, []byte{opTUPLE1, opTUPLE2, opTUPLE3}[n-1])
		e.put()
	default:
		e.b = append(e.b, opMARK)
		items()
		e.b = append(e.b, opTUPLE)
		e.put()
	}
}

// IntTuple pushes a tuple of ints.
func (e *Encoder) IntTuple(v []int64) {
	e.Tuple(len(v), func() {
		for _, x := range v {
			e.Int(x)
		}
	})
}

// Dict pushes a dict of the key, value pairs items pushes.
func (e *Encoder) Dict(items func()) { e.container(opEMPTY_DICT, opSETITEMS, items) }

// List pushes a list of the values items pushes.
func (e *Encoder) List(items func()) { e.container(opEMPTY_LIST, opAPPENDS, items) }

// DictOf pushes a dict of n items, item(i) pushing the i-th key and value:
// in one batch as Dict does, or in a memo encoder as CPython's C pickler
// writes a dict (a .metadata's storage_data has millions of items): one
// item by SETITEM, more in MARK … SETITEMS batches of 1000 (and an empty
// batch after a full last one).
func (e *Encoder) DictOf(n int, item func(i int)) {
	if e.memo == nil {
		e.Dict(func() {
			for i := range n {
				item(i)
			}
		})
		return
	}
	e.b = append(e.b, opEMPTY_DICT)
	e.put()
	switch n {
	case 0:
		return
	case 1:
		item(0)
		e.b = append(e.b, opSETITEM)
		return
	}
	for i := 0; ; {
		e.b = append(e.b, opMARK)
		k := 0
		for ; i < n && k < batch; k++ {
			item(i)
			i++
		}
		e.b = append(e.b, opSETITEMS)
		if k < batch {
			return
		}
	}
}

// batch is how many items CPython's pickler adds to a container at once.
const batch = 1000

// container pushes an empty container and adds what items pushes in one
// MARK … add batch; an empty one is the empty opcode alone, as pickle
// writes it.
func (e *Encoder) container(empty, add byte, items func()) {
	e.b = append(e.b, empty)
	e.put()
	if items == nil {
		return
	}
	mark := len(e.b)
	e.b = append(e.b, opMARK)
	items()
	if len(e.b) == mark+1 {
		e.b = e.b[:mark]
		return
	}
	e.b = append(e.b, add)
}

// Object pushes module.name.__new__(module.name) with the state that state
// pushes set by BUILD: how a dataclass instance pickles.
func (e *Encoder) Object(module, name string, state func()) {
	e.Global(module, name)
	e.b = append(e.b, opEMPTY_TUPLE, opNEWOBJ)
	e.put()
	state()
	e.b = append(e.b, opBUILD)
}

// Call pushes module.name(*args), args being the n values args pushes
// (REDUCE).
func (e *Encoder) Call(module, name string, n int, args func()) {
	e.Global(module, name)
	e.Tuple(n, args)
	e.b = append(e.b, opREDUCE)
	e.put()
}

// PersistentID pushes what the unpickler's persistent_load returns for the
// tuple of the n values items pushes (BINPERSID).
func (e *Encoder) PersistentID(n int, items func()) {
	e.Tuple(n, items)
	e.b = append(e.b, opBINPERSID)
}
