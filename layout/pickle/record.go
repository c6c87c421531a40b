package pickle

import (
	"cmp"
	"math/big"
	"slices"
)

// Records: the objects of a few classes, read without being built.
//
// A .metadata is millions of small objects of a handful of classes
// (torch's ChunkStorageMetadata, MetadataIndex, _StorageInfo), each made
// by NEWOBJ with no arguments and given a dict of a few fields by BUILD.
// Built as Objects, with their state dicts, tuples and boxed ints, and
// then taken apart by a Sink, they cost most of a decoding. A RecordSink
// names such classes; at the NEWOBJ of one (or at the BINGET of the class
// when EMPTY_TUPLE NEWOBJ follow, as a pickler writes every object of a
// class but its first), the VM reads the opcodes up to its BUILD with a
// small typed machine of its own (no Object, no dict, no boxed int) and
// offers the fields as a Record. The machine knows only
// the shapes CPython writes for such an object (strings, ints, None,
// tuples of ints, a global called with one tuple of ints as torch.Size is,
// lists of strings, the memo); at anything else, or anything a limit or
// an error of the VM could be about, it gives up, and the VM decodes the
// object the general way from the same opcode, as it would without a
// RecordSink. So a record changes nothing but speed: the memo, the limits
// and every error stay the VM's (record_test.go checks both ways). The
// machine is tried after a faster one that reads only the opcodes CPython
// writes for such an object (recordfast.go), and leaves the recorder as
// this one would.

// Kind is the type of a record's field.
type Kind uint8

// The kinds of field a record has.
const (
	KindNone Kind = iota // None
	KindInt              // an int that fits in int64: Int
	KindStr              // a str: Str
	KindInts             // a tuple of ints: Ints
	KindCall             // Func called with one tuple of ints (torch.Size((2, 3))): Func, Ints
	KindStrs             // a list of strs: Strs
)

// Field is one item of a record's state dict, valid only during
// BuiltRecord. Its value is read with the method of its Kind.
type Field struct {
	Name string
	v    *rval
	m    *recorder
}

// Kind is the type of the field's value.
func (f Field) Kind() Kind {
	switch f.v.kind {
	case rInt:
		return KindInt
	case rStr:
		return KindStr
	case rTuple:
		return KindInts
	case rCall:
		return KindCall
	case rList:
		return KindStrs
	}
	return KindNone
}

// Int is a KindInt's value.
func (f Field) Int() int64 { return f.v.i }

// Str is a KindStr's value.
func (f Field) Str() string {
	if f.v.kind != rStr {
		return ""
	}
	return f.m.boxes[f.v.box].(string)
}

// Func is the global a KindCall calls.
func (f Field) Func() Global {
	if f.v.kind != rCall {
		return Global{}
	}
	switch x := f.m.boxes[f.v.box].(type) {
	case Global:
		return x
	case *Object:
		return x.Class
	}
	return Global{}
}

// Ints are a KindInts's ints, or a KindCall's argument's.
func (f Field) Ints() []int64 {
	if f.v.kind != rTuple && f.v.kind != rCall {
		return nil
	}
	return f.m.ints[f.v.i : f.v.i+int64(f.v.n) : f.v.i+int64(f.v.n)]
}

// Strs are a KindStrs's strs.
func (f Field) Strs() []string {
	if f.v.kind != rList {
		return nil
	}
	return f.m.strs[f.v.i : f.v.i+int64(f.v.n) : f.v.i+int64(f.v.n)]
}

// Record is an object of a RecordSink's class: its class (and the tag
// RecordClass gave it) and its state's items, as the dict has them (in
// order, a key set twice once, with its last value). It is valid only
// during BuiltRecord: its fields are read from the record machine.
type Record struct {
	Class Global
	Tag   int
	m     *recorder
}

// Len is the number of fields.
func (r *Record) Len() int { return len(r.m.fields) }

// At returns field i.
func (r *Record) At(i int) Field {
	f := &r.m.fields[i]
	return Field{Name: f.name, v: &f.v, m: r.m}
}

// Field returns the field name.
func (r *Record) Field(name string) (Field, bool) {
	for i := range r.m.fields {
		if f := &r.m.fields[i]; f.name == name {
			return Field{Name: name, v: &f.v, m: r.m}, true
		}
	}
	return Field{}, false
}

// RecordSink is a Sink that takes the objects of some classes as records.
// StrSink is a RecordSink that may know a record's strings already (a
// .metadata pickles a tensor's name in full again for each of its chunks):
// Str returns a string equal to b, boxed (an any holding the string), or
// nil; the VM then makes and boxes one of its own. It saves a string and
// its box for every such field.
type StrSink interface {
	RecordSink
	Str(b []byte) any
}

type RecordSink interface {
	Sink
	// RecordClass returns a tag, not 0, when objects of class g are to
	// be offered to BuiltRecord (in Record.Tag), else 0. The VM asks once
	// per class it meets (up to a few).
	RecordClass(g Global) int
	// BuiltRecord offers an object of such a class whose state is a dict
	// of fields the VM could read as a Record. It is what Built would be
	// offered, with the same meaning of v, took and err; SetItem is not
	// called for the fields. When the sink does not take the record, the
	// VM decodes the object the general way (and offers it to Built).
	BuiltRecord(r *Record) (v any, took bool, err error)
}

// Bounds of a record; an object beyond them is decoded the general way.
const (
	recFields = 16 // fields of its state
	recInts   = 32 // ints in one tuple
	recStrs   = 64 // strs in one list
	// recStack bounds the stack a record uses (the object, its dict,
	// a mark, recFields key/value pairs, and a tuple being built): the
	// VM takes a record only where that many more entries fit under
	// MaxStack, so the record cannot hit the limit the general way would.
	recStack = 3 + 2*recFields + 3 + recInts
	// recDepth is the depth a record reaches (object, dict, torch.Size,
	// its tuple, the ints) beyond a memo value's own depth, which may be
	// at most recMemoDepth.
	recMemoDepth = 4
	recDepth     = recMemoDepth + 3
	// recClasses bounds the classes the VM remembers RecordClass's answer
	// for.
	recClasses = 8
)

// recorder is the record machine: its typed stack and buffers, reused from
// one record to the next.
type recorder struct {
	sink    RecordSink
	known   StrSink // sink, if it is one
	classes []recClass
	// bySlot is RecordClass's answer by the memo entry a class was got
	// from (BINGET, EMPTY_TUPLE, NEWOBJ: nearly every record), so that a
	// record's class costs a pointer compare, not two strings'.
	bySlot [recClasses]struct {
		e   *slot
		tag int
	}
	data []byte // the decoder's

	p      int     // input position
	vals   []rval  // the typed stack; vals[0] is the object, vals[1] its dict
	marks  []int   // lengths of vals at each MARK
	puts   int     // memo entries put
	kept   []rkept // the entries among them the pickle gets again
	placed []*node // memo containers the record put somewhere
	cost   int64   // items, as the VM counts them (decode.go, put)
	fields []rfield
	ints   []int64
	strs   []string
	// boxes are the strings, globals and torch.Size objects of the
	// record's values: the stack itself holds no pointers, so that
	// moving values costs no write barrier.
	boxes []any
	rec   Record
	list  int // vals index of the list APPEND(S) may add to (-1: none)
	// declined is the offset of the NEWOBJ whose record was declined at
	// its class's BINGET, so as not to read it again (-1: none).
	declined int
}

type recClass struct {
	g   Global
	tag int
}

type rkind uint8

const (
	rNone rkind = iota
	rInt
	rStr
	rGlobal
	rTuple // a tuple of ints: ints[lo : lo+n]
	rArgs  // a 1-tuple of a tuple of ints
	rCall  // a global called with rArgs
	rList  // a list of strs: strs[lo : lo+n]
	rDict  // the object's state
	rObj   // the object
)

// rval is a value on the record machine's stack, with what the VM would
// know of it: its weight and depth (weight.go), and whether it came from
// the memo (then putting it costs its weight).
type rval struct {
	kind   rkind
	shared bool
	n      uint8 // ints or strs
	d      int32
	box    int32 // rStr, rGlobal, rCall: its value, in boxes
	w      int64
	i      int64 // rInt: the int; rTuple, rArgs, rCall, rList: lo
}

// cost is what putting v into a container costs (decoder.put).
func (v *rval) cost() int64 {
	if v.shared {
		return v.w
	}
	return 1
}

type rkept struct {
	idx uint32
	e   *slot
	s   slot
}

type rfield struct {
	name string
	v    rval
}

// wantsFrom is wants of the class in memo entry e.
func (r *recorder) wantsFrom(e *slot, g Global) int {
	for i := range r.bySlot {
		if c := &r.bySlot[i]; c.e == e {
			return c.tag
		} else if c.e == nil {
			c.e, c.tag = e, r.wants(g)
			return c.tag
		}
	}
	return r.wants(g)
}

func (r *recorder) wants(g Global) int {
	for _, c := range r.classes {
		if c.g.Module == g.Module && c.g.Name == g.Name {
			return c.tag
		}
	}
	tag := r.sink.RecordClass(g)
	if len(r.classes) < recClasses {
		r.classes = append(r.classes, recClass{g, tag})
	}
	return tag
}

// record is NEWOBJ of callable with args when a RecordSink may take it as
// a record. It reports whether it did; false leaves the decoder as it was.
// from is the memo entry callable was got from, or nil.
func (d *decoder) record(callable, args slot, from *slot) (bool, error) {
	r := d.rec
	g, ok := callable.v.(Global)
	if !ok {
		return false, nil
	}
	if t, ok := args.v.(Tuple); !ok || len(t) != 0 {
		return false, nil
	}
	var tag int
	if from != nil {
		tag = r.wantsFrom(from, g)
	} else {
		tag = r.wants(g)
	}
	if tag == 0 {
		return false, nil
	}
	if len(d.stack)+len(d.marks)+recStack > d.opts.MaxStack || d.opts.MaxDepth < recDepth {
		return false, nil
	}
	r.p, r.puts, r.cost, r.list = d.pos, 0, 1, -1 // NEWOBJ puts args into the object
	if args.shared {
		r.cost = args.weight()
	}
	// The stack, marks and strs are recordState's, reset by recordFast
	// (the fast path has none); kept and placed are made empty only when
	// they are not: a slice written back costs a write barrier's check.
	if len(r.kept) > 0 {
		r.kept = r.kept[:0]
	}
	if len(r.placed) > 0 {
		r.placed = r.placed[:0]
	}
	r.fields, r.ints = r.fields[:0], r.ints[:0]
	clear(r.boxes) // keep nothing of the last record alive
	r.boxes = r.boxes[:0]
	build, ok := d.recordFast()
	if !ok || addWeight(d.items, r.cost) > d.opts.MaxItems {
		return false, nil
	}
	r.rec = Record{Class: g, Tag: tag, m: r}
	v, took, err := r.sink.BuiltRecord(&r.rec)
	if err != nil {
		d.op, d.opPos = opBUILD, build
		return false, d.sinkErr(err)
	}
	if !took {
		return false, nil
	}
	// Commit: what the VM would have left, without the object.
	d.pos = r.p
	d.pruned += r.puts
	for _, k := range r.kept {
		*k.e = k.s
	}
	for _, n := range r.placed {
		n.placed = true
	}
	d.items += r.cost
	return true, d.pushSlot(slot{v: v, w: 1})
}

// recordState runs the record machine from after NEWOBJ to the object's
// BUILD, and returns BUILD's offset. ok is false at anything it does not
// take: the VM then decodes the object itself.
func (d *decoder) recordState() (build int, ok bool) {
	r := d.rec
	data := d.data
	for r.p < len(data) {
		pos := r.p
		op := data[pos]
		r.p++
		switch op {
		case opFRAME:
			if !r.skip(8) {
				return 0, false
			}
		case opMEMOIZE:
			// Most entries are never read back: counted, and that is all.
			if idx := d.memoLen() + r.puts; len(r.vals) > r.base() && !d.refs.has(uint32(idx)) {
				r.puts++
				continue
			}
			if !d.recPut(op) {
				return 0, false
			}
		case opBINPUT, opLONG_BINPUT:
			if !d.recPut(op) {
				return 0, false
			}
		case opBINGET, opLONG_BINGET:
			if !d.recGet(op) {
				return 0, false
			}
		case opMARK:
			r.marks = append(r.marks, len(r.vals))
		case opNONE:
			r.push(rval{kind: rNone, w: 1})
		case opBININT1:
			n, ok := r.uint(1)
			if !ok {
				return 0, false
			}
			r.push(rval{kind: rInt, w: 1, i: int64(n)})
		case opBININT2:
			n, ok := r.uint(2)
			if !ok {
				return 0, false
			}
			r.push(rval{kind: rInt, w: 1, i: int64(n)})
		case opBININT:
			n, ok := r.uint(4)
			if !ok {
				return 0, false
			}
			r.push(rval{kind: rInt, w: 1, i: int64(int32(uint32(n)))})
		case opLONG1:
			n, ok := r.uint(1)
			if !ok || n > 8 || int(n) > len(data)-r.p {
				return 0, false
			}
			v := smallLong(data[r.p : r.p+int(n)])
			r.p += int(n)
			r.push(rval{kind: rInt, w: 1, i: v})
		case opSHORT_BINUNICODE, opBINUNICODE:
			w := 1
			if op == opBINUNICODE {
				w = 4
			}
			n, ok := r.uint(w)
			if !ok || n > uint64(d.opts.MaxStringLen) || n > uint64(len(data)-r.p) {
				return 0, false
			}
			b := data[r.p : r.p+int(n)]
			r.p += int(n)
			r.push(rval{kind: rStr, w: 1 + int64(n)/itemBytes, box: r.boxOf(d.str(b))})
		case opGLOBAL:
			g, ok := d.recGlobal()
			if !ok {
				return 0, false
			}
			r.push(rval{kind: rGlobal, w: 1, box: r.boxOf(g)})
		case opEMPTY_TUPLE:
			r.push(rval{kind: rTuple, w: 1, d: 1, i: int64(len(r.ints))})
		case opTUPLE1, opTUPLE2, opTUPLE3, opTUPLE:
			if !r.makeTuple(op) {
				return 0, false
			}
		case opREDUCE:
			if !r.reduce() {
				return 0, false
			}
		case opEMPTY_LIST:
			r.list = len(r.vals)
			r.push(rval{kind: rList, w: 1, d: 1, i: int64(len(r.strs))})
		case opAPPEND, opAPPENDS:
			if !r.appendTo(op) {
				return 0, false
			}
		case opEMPTY_DICT:
			if len(r.vals) != 1 || len(r.marks) != 0 {
				return 0, false // the object's state, and only that
			}
			r.push(rval{kind: rDict, w: 1, d: 1})
		case opSETITEM, opSETITEMS:
			if !r.setItems(op) {
				return 0, false
			}
		case opBUILD:
			// The state is the dict, the object under it, no mark open.
			if len(r.vals) != 2 || r.vals[1].kind != rDict || len(r.marks) != 0 {
				return 0, false
			}
			r.cost++ // BUILD puts the dict into the object
			return pos, true
		default:
			return 0, false
		}
		if len(r.vals)+len(r.marks) > recStack {
			return 0, false
		}
	}
	return 0, false
}

func (r *recorder) push(v rval) { r.vals = append(r.vals, v) }

func (r *recorder) boxOf(v any) int32 {
	r.boxes = append(r.boxes, v)
	return int32(len(r.boxes) - 1)
}

func (r *recorder) skip(n int) bool {
	if n > len(r.data)-r.p {
		return false
	}
	r.p += n
	return true
}

func (r *recorder) uint(n int) (uint64, bool) {
	if n > len(r.data)-r.p {
		return 0, false
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(r.data[r.p+i])
	}
	r.p += n
	return v, true
}

// base is where the values above the topmost mark begin.
func (r *recorder) base() int {
	if len(r.marks) == 0 {
		return 0
	}
	return r.marks[len(r.marks)-1]
}

// top returns the n topmost values (popsMark: those above the topmost mark,
// and the mark), removed; false where the VM would underflow.
func (r *recorder) top(n int) ([]rval, bool) {
	if n == popsMark {
		if len(r.marks) == 0 {
			return nil, false
		}
		b := r.marks[len(r.marks)-1]
		r.marks = r.marks[:len(r.marks)-1]
		out := r.vals[b:]
		r.vals = r.vals[:b]
		return out, true
	}
	if len(r.vals)-r.base() < n {
		return nil, false
	}
	out := r.vals[len(r.vals)-n:]
	r.vals = r.vals[:len(r.vals)-n]
	return out, true
}

// recPut is MEMOIZE, BINPUT or LONG_BINPUT: in order, as scanRefs found
// them; an entry the pickle gets again gets what the VM would keep, which
// the record machine has only for scalars.
func (d *decoder) recPut(op byte) bool {
	r := d.rec
	idx := uint64(d.memoLen() + r.puts)
	switch op {
	case opBINPUT, opLONG_BINPUT:
		w := 1
		if op == opLONG_BINPUT {
			w = 4
		}
		n, ok := r.uint(w)
		if !ok || n != idx {
			return false
		}
	}
	if len(r.vals) <= r.base() {
		return false
	}
	r.puts++
	e, kept := d.refs.at(uint32(idx))
	if !kept {
		return true
	}
	v := &r.vals[len(r.vals)-1]
	if v.shared {
		return false // the VM's slot is another's, depth and all
	}
	var s slot
	switch v.kind {
	case rNone:
		s = slot{v: nil, w: 1}
	case rInt:
		s = slot{v: v.i, w: 1}
	case rStr, rGlobal:
		s = slot{v: r.boxes[v.box], w: v.w}
	case rTuple, rArgs:
		// A torch.Size's tuple a later record gets again (a .metadata
		// written in one process shares a chunk's offsets with its
		// index): built as the VM builds it.
		s = slot{v: r.tuple(*v), d: v.d, w: v.w}
	case rCall:
		o := &Object{Class: r.boxes[v.box].(Global), Args: r.tuple(rval{kind: rArgs, i: v.i, n: v.n}),
			node: node{weight: v.w, depth: v.d, kept: true}}
		v.box = r.boxOf(o) // placed when it is put somewhere
		s = slot{v: o, d: v.d, w: 1}
	default:
		return false
	}
	s.shared = true
	r.kept = append(r.kept, rkept{uint32(idx), e, s}) // in order of idx
	return true
}

// recGet is BINGET or LONG_BINGET: the memo's value, as a record value, if
// it is one.
func (d *decoder) recGet(op byte) bool {
	r := d.rec
	w := 1
	if op == opLONG_BINGET {
		w = 4
	}
	n, ok := r.uint(w)
	if !ok {
		return false
	}
	e, ok := d.refs.at(uint32(n))
	if !ok || n > uint64(^uint32(0)) {
		return false
	}
	if e.shared {
		// The keys, the class of a torch.Size and a tensor's name: the
		// gets of almost every record.
		switch e.v.(type) {
		case string:
			r.push(rval{kind: rStr, shared: true, w: e.w, box: r.boxOf(e.v)})
			return true
		case Global:
			r.push(rval{kind: rGlobal, shared: true, w: e.w, box: r.boxOf(e.v)})
			return true
		}
	}
	s := *e
	if !s.shared {
		// Put by this record, if at all.
		i, found := slices.BinarySearchFunc(r.kept, uint32(n), func(k rkept, idx uint32) int { return cmp.Compare(k.idx, idx) })
		if found {
			s = r.kept[i].s
		}
		if !found {
			return false
		}
	}
	if s.depth() > recMemoDepth {
		return false
	}
	v := rval{shared: true, w: s.weight(), d: int32(s.depth())}
	switch x := s.v.(type) {
	case nil:
		v.kind = rNone
	case int64:
		v.kind, v.i = rInt, x
	case string:
		v.kind, v.box = rStr, r.boxOf(s.v) // boxed already: boxing again allocates
	case Global:
		v.kind, v.box = rGlobal, r.boxOf(s.v)
	case Tuple:
		lo := len(r.ints)
		if len(x) == 1 {
			if inner, ok := x[0].(Tuple); ok && r.appendInts(inner) {
				v.kind, v.i, v.n = rArgs, int64(lo), uint8(len(inner))
				break
			}
		}
		if !r.appendInts(x) {
			return false
		}
		v.kind, v.i, v.n = rTuple, int64(lo), uint8(len(x))
	case *Object:
		// A torch.Size the VM built (a record's fields may share one).
		if x.NewObj || x.Extra != nil || x.State != nil || len(x.Args) != 1 {
			return false
		}
		inner, ok := x.Args[0].(Tuple)
		lo := len(r.ints)
		if !ok || !r.appendInts(inner) {
			return false
		}
		v.kind, v.i, v.n, v.box = rCall, int64(lo), uint8(len(inner)), r.boxOf(x)
	default:
		return false
	}
	r.push(v)
	return true
}

// tuple builds the Tuple v is (rTuple or rArgs).
func (r *recorder) tuple(v rval) Tuple {
	t := make(Tuple, v.n)
	for i := range t {
		t[i] = r.ints[v.i+int64(i)]
	}
	if v.kind == rArgs {
		return Tuple{t}
	}
	if len(t) == 0 {
		return emptyTuple.(Tuple)
	}
	return t
}

// appendInts appends t's items to ints when all are ints that fit.
func (r *recorder) appendInts(t Tuple) bool {
	if len(t) > recInts {
		return false
	}
	lo := len(r.ints)
	for _, it := range t {
		switch x := it.(type) {
		case int64:
			r.ints = append(r.ints, x)
		case *big.Int:
			if !x.IsInt64() {
				r.ints = r.ints[:lo]
				return false
			}
			r.ints = append(r.ints, x.Int64())
		default:
			r.ints = r.ints[:lo]
			return false
		}
	}
	return true
}

// recGlobal reads GLOBAL's two lines as the VM does.
func (d *decoder) recGlobal() (any, bool) {
	r := d.rec
	start := r.p
	var lines [2][]byte
	for i := range lines {
		j := r.p
		for j < len(d.data) && d.data[j] != '\n' {
			if j-r.p > d.opts.MaxStringLen {
				return nil, false
			}
			j++
		}
		if j >= len(d.data) {
			return nil, false
		}
		lines[i] = d.data[r.p:j]
		r.p = j + 1
	}
	key := d.data[start:r.p]
	g := d.globals.get(key)
	if g == nil {
		g = Global{Module: string(lines[0]), Name: string(lines[1])}
		d.globals.put(key, g)
	}
	return g, true
}

// makeTuple is TUPLE1..3 and TUPLE: a tuple of ints, or one such tuple in
// a tuple (torch.Size's arguments).
func (r *recorder) makeTuple(op byte) bool {
	n := popsMark
	switch op {
	case opTUPLE1:
		n = 1
	case opTUPLE2:
		n = 2
	case opTUPLE3:
		n = 3
	}
	items, ok := r.top(n)
	if !ok {
		return false
	}
	if len(items) == 1 && items[0].kind == rTuple {
		in := items[0]
		r.push(rval{kind: rArgs, w: addWeight(1, in.w), d: max(1, in.d+1), i: in.i, n: in.n})
		r.cost = addWeight(r.cost, in.cost())
		return true
	}
	if len(items) > recInts {
		return false
	}
	t := rval{kind: rTuple, w: 1, d: 1, i: int64(len(r.ints)), n: uint8(len(items))}
	for _, it := range items {
		if it.kind != rInt {
			return false
		}
		r.ints = append(r.ints, it.i)
		t.w = addWeight(t.w, it.w)
		r.cost = addWeight(r.cost, it.cost())
	}
	r.push(t)
	return true
}

// reduce is REDUCE of a global with a tuple of ints as its one argument.
func (r *recorder) reduce() bool {
	items, ok := r.top(2)
	if !ok || items[0].kind != rGlobal || items[1].kind != rArgs {
		return false
	}
	f, args := items[0], items[1]
	r.push(rval{kind: rCall, w: addWeight(1, args.w), d: max(1, args.d+1), i: args.i, n: args.n, box: f.box})
	r.cost = addWeight(r.cost, args.cost())
	return true
}

// appendTo is APPEND(S) of strs to the list made last.
func (r *recorder) appendTo(op byte) bool {
	n := 1
	if op == opAPPENDS {
		n = popsMark
	}
	items, ok := r.top(n)
	if !ok || len(r.vals) == 0 || len(r.vals)-1 != r.list || len(r.vals) <= r.base() {
		return false
	}
	l := &r.vals[len(r.vals)-1]
	if int(l.i)+int(l.n) != len(r.strs) || int(l.n)+len(items) > recStrs {
		return false // another list's strs came after this one's
	}
	for _, it := range items {
		if it.kind != rStr {
			return false
		}
		r.strs = append(r.strs, r.boxes[it.box].(string))
		l.n++
		l.w = addWeight(l.w, it.w)
		r.cost = addWeight(r.cost, it.cost())
	}
	return true
}

// setItems is SETITEM(S) on the object's state dict.
func (r *recorder) setItems(op byte) bool {
	n := 2
	if op == opSETITEMS {
		n = popsMark
	}
	kv, ok := r.top(n)
	if !ok || len(kv)%2 != 0 || len(r.vals) != 2 || r.vals[1].kind != rDict || len(r.vals) <= r.base() {
		return false
	}
	if len(r.fields)+len(kv)/2 > recFields {
		return false
	}
	for i := 0; i < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		if k.kind != rStr {
			return false
		}
		switch v.kind {
		case rNone, rInt, rStr, rTuple, rCall, rList:
		default:
			return false
		}
		r.cost = addWeight(addWeight(r.cost, k.cost()), v.cost())
		if v.kind == rCall {
			if o, ok := r.boxes[v.box].(*Object); ok {
				r.placed = append(r.placed, &o.node) // the memo's
			}
		}
		r.set(r.boxes[k.box].(string), v)
	}
	return true
}

// set sets a field as a dict sets an item: a key set again keeps its place
// and takes the new value.
func (r *recorder) set(name string, v rval) {
	for i := range r.fields {
		if r.fields[i].name == name {
			r.fields[i].v = v
			return
		}
	}
	r.fields = append(r.fields, rfield{name: name, v: v})
}
