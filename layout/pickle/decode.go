// Package pickle is a restricted Python pickle decoder: a small virtual
// machine that understands the opcodes CPython emits for protocols 2 to 5
// (plus a few protocol 0/1 container opcodes) and builds inert Go values. It
// never imports or executes anything: GLOBAL/STACK_GLOBAL give a Global name,
// and REDUCE, NEWOBJ and BUILD on it give an Object that records the class,
// arguments and state. Callers interpret Objects by class path.
//
// Every resource an attacker controls is bounded by Options: input size,
// string length, container items, nesting depth, stack depth and memo size.
// Exceeding a limit is an error wrapping ErrLimit, never a panic or an
// allocation sized by the input before it was checked.
package pickle

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strings"
)

// ErrLimit is wrapped by every error caused by exceeding an Options limit.
var ErrLimit = errors.New("pickle: limit exceeded")

// Options bounds the decoder. Zero fields take the defaults below.
type Options struct {
	// MaxInputBytes bounds the whole pickle (default 1 GiB).
	MaxInputBytes int64
	// MaxStringLen bounds one str, bytes or GLOBAL name (default 64 MiB).
	MaxStringLen int
	// MaxItems bounds the total number of elements put into containers
	// (tuples, lists, dicts, sets, object args/items), counting a value the
	// memo shares as a copy each time it is referenced, so it bounds the
	// expanded size of the result (see weight.go) (default 1<<26).
	MaxItems int64
	// MaxDepth bounds how deeply containers nest (default 256).
	MaxDepth int
	// MaxStack bounds the number of values on the stack, marks included
	// (default 1<<20).
	MaxStack int
	// MaxMemo bounds the number of memo entries (default 1<<26).
	MaxMemo int
	// PersistentLoad resolves BINPERSID persistent ids (torch.save data.pkl
	// storages). Without it BINPERSID is an error.
	PersistentLoad func(pid any) (any, error)
}

// Defaults for Options.
const (
	DefaultMaxInputBytes = 1 << 30
	DefaultMaxStringLen  = 64 << 20
	DefaultMaxItems      = 1 << 26
	DefaultMaxDepth      = 256
	DefaultMaxStack      = 1 << 20
	DefaultMaxMemo       = 1 << 26
)

// maxLongBytes bounds LONG1/LONG4 integers (2 kbit): nothing sane is larger.
const maxLongBytes = 256

func (o Options) withDefaults() Options {
	if o.MaxInputBytes <= 0 {
		o.MaxInputBytes = DefaultMaxInputBytes
	}
	if o.MaxStringLen <= 0 {
		o.MaxStringLen = DefaultMaxStringLen
	}
	if o.MaxItems <= 0 {
		o.MaxItems = DefaultMaxItems
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	if o.MaxStack <= 0 {
		o.MaxStack = DefaultMaxStack
	}
	if o.MaxMemo <= 0 {
		o.MaxMemo = DefaultMaxMemo
	}
	return o
}

// Error is a decoding error at a position in the input.
type Error struct {
	// Offset is the byte offset of the opcode being executed.
	Offset int
	// Op is the opcode's name ("" before the first opcode).
	Op  string
	Msg string
	// Err is ErrLimit for limit errors, or the persistent-load hook's error.
	Err error
}

func (e *Error) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("pickle: %s", e.Msg)
	}
	return fmt.Sprintf("pickle: %s (%s at offset %d)", e.Msg, e.Op, e.Offset)
}

func (e *Error) Unwrap() error { return e.Err }

// Decode reads a whole pickle from r (at most Options.MaxInputBytes) and
// decodes it.
func Decode(r io.Reader, opts Options) (any, error) {
	opts = opts.withDefaults()
	data, err := io.ReadAll(io.LimitReader(r, opts.MaxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("pickle: reading input: %w", err)
	}
	if int64(len(data)) > opts.MaxInputBytes {
		return nil, &Error{Msg: fmt.Sprintf("input larger than %d bytes", opts.MaxInputBytes), Err: ErrLimit}
	}
	return DecodeBytes(data, opts)
}

// DecodeBytes decodes the pickle in data, up to its STOP opcode. Bytes after
// STOP are ignored, as Python does.
func DecodeBytes(data []byte, opts Options) (any, error) {
	opts = opts.withDefaults()
	if int64(len(data)) > opts.MaxInputBytes {
		return nil, &Error{Msg: fmt.Sprintf("input larger than %d bytes", opts.MaxInputBytes), Err: ErrLimit}
	}
	d := &decoder{data: data, opts: opts}
	// About one memo entry per 16 bytes of a real .metadata: sized once,
	// not grown through a dozen copies.
	d.memo.dense = make([]memoEntry, 0, min(len(data)/16, opts.MaxMemo, 1<<20))
	return d.run()
}

// slot is a stack or memo entry: a value and, for tuples and scalars, its
// nesting depth and expanded weight (mutable containers carry their own in
// their node). shared marks a second reference (from the memo or DUP).
type slot struct {
	v      any
	d      int
	w      int64
	shared bool
}

func (s slot) depth() int {
	if n := nodeOf(s.v); n != nil {
		return n.depth
	}
	return s.d
}

func (s slot) weight() int64 {
	if n := nodeOf(s.v); n != nil {
		return n.weight
	}
	return s.w
}

type decoder struct {
	data  []byte
	pos   int
	opPos int
	op    byte
	opts  Options

	stack []slot
	marks []int // stack lengths at each MARK
	memo  memo
	items int64 // expanded items so far, checked against MaxItems
	late  bool  // a container grew after it was put somewhere
}

func (d *decoder) fail(format string, args ...any) error {
	return &Error{Offset: d.opPos, Op: opName(d.op), Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) limit(format string, args ...any) error {
	return &Error{Offset: d.opPos, Op: opName(d.op), Msg: fmt.Sprintf(format, args...), Err: ErrLimit}
}

func (d *decoder) read(n int) ([]byte, error) {
	if n < 0 || n > len(d.data)-d.pos {
		return nil, d.fail("truncated input: need %d bytes, %d left", n, len(d.data)-d.pos)
	}
	b := d.data[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

func (d *decoder) readUint(n int) (uint64, error) {
	b, err := d.read(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// readLen reads an n-byte little-endian length and checks it against the
// string limit and the remaining input before anything is allocated.
func (d *decoder) readLen(n int) (int, error) {
	v, err := d.readUint(n)
	if err != nil {
		return 0, err
	}
	if v > uint64(d.opts.MaxStringLen) {
		return 0, d.limit("length %d exceeds the limit of %d bytes", v, d.opts.MaxStringLen)
	}
	if v > uint64(len(d.data)-d.pos) {
		return 0, d.fail("truncated input: length %d but %d bytes left", v, len(d.data)-d.pos)
	}
	return int(v), nil
}

func (d *decoder) readLine() (string, error) {
	for i := d.pos; i < len(d.data); i++ {
		if i-d.pos > d.opts.MaxStringLen {
			return "", d.limit("line longer than %d bytes", d.opts.MaxStringLen)
		}
		if d.data[i] == '\n' {
			s := string(d.data[d.pos:i])
			d.pos = i + 1
			return s, nil
		}
	}
	return "", d.fail("truncated input: unterminated line")
}

func (d *decoder) base() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

// push pushes a new scalar or container.
func (d *decoder) push(v any, depth int) error {
	return d.pushSlot(slot{v: v, d: depth, w: scalarWeight(v)})
}

func (d *decoder) pushSlot(s slot) error {
	if len(d.stack)+len(d.marks) >= d.opts.MaxStack {
		return d.limit("stack deeper than %d entries", d.opts.MaxStack)
	}
	if s.depth() > d.opts.MaxDepth {
		return d.limit("values nested deeper than %d", d.opts.MaxDepth)
	}
	d.stack = append(d.stack, s)
	return nil
}

func (d *decoder) pop() (slot, error) {
	if len(d.stack) <= d.base() {
		return slot{}, d.fail("stack underflow")
	}
	s := d.stack[len(d.stack)-1]
	d.stack[len(d.stack)-1] = slot{}
	d.stack = d.stack[:len(d.stack)-1]
	return s, nil
}

func (d *decoder) top() (slot, error) {
	if len(d.stack) <= d.base() {
		return slot{}, d.fail("stack underflow")
	}
	return d.stack[len(d.stack)-1], nil
}

// popMark removes and returns everything above the topmost MARK, and the mark.
func (d *decoder) popMark() ([]slot, error) {
	if len(d.marks) == 0 {
		return nil, d.fail("no MARK on the stack")
	}
	b := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	out := make([]slot, len(d.stack)-b)
	copy(out, d.stack[b:])
	clear(d.stack[b:])
	d.stack = d.stack[:b]
	return out, nil
}

// put records that the value in s went into the container whose node is n:
// it charges the value against MaxItems (one item, or its whole weight when
// it is a second reference) and adds its depth and weight to the container.
func (d *decoder) put(n *node, s slot) error {
	cost := int64(1)
	if s.shared {
		cost = s.weight()
	}
	d.items = addWeight(d.items, cost)
	if d.items > d.opts.MaxItems {
		return d.limit("more than %d container items (memo references count as copies)", d.opts.MaxItems)
	}
	if n.placed {
		d.late = true
	}
	if c := nodeOf(s.v); c != nil {
		c.placed = true
	}
	n.weight = addWeight(n.weight, s.weight())
	return d.deepen(&n.depth, s.depth())
}

// deepen records that a child of depth c went into a container of depth *p.
func (d *decoder) deepen(p *int, c int) error {
	if c+1 > *p {
		*p = c + 1
	}
	if *p > d.opts.MaxDepth {
		return d.limit("values nested deeper than %d", d.opts.MaxDepth)
	}
	return nil
}

func (d *decoder) pushTuple(items []slot) error {
	t := make(Tuple, len(items))
	n := newNode()
	for i, s := range items {
		t[i] = s.v
		if err := d.put(&n, s); err != nil {
			return err
		}
	}
	return d.pushSlot(slot{v: t, d: n.depth, w: n.weight})
}

func (d *decoder) memoPut(idx uint32, s slot) error {
	if !d.memo.has(idx) && d.memo.n >= d.opts.MaxMemo {
		return d.limit("more than %d memo entries", d.opts.MaxMemo)
	}
	d.memo.put(idx, s)
	return nil
}

func (d *decoder) memoGet(idx uint32) error {
	s, ok := d.memo.get(idx)
	if !ok {
		return d.fail("memo key %d not found", idx)
	}
	s.shared = true
	return d.pushSlot(s)
}

// memo is the pickle memo. Writers number entries 0, 1, 2, ... (MEMOIZE,
// and BINPUT from CPython's pickler), so they live in a slice; any other
// index a hand-made pickle uses goes to a map.
type memo struct {
	dense  []memoEntry
	sparse map[uint32]slot
	n      int // entries in both
}

type memoEntry struct {
	s   slot
	set bool
}

func (m *memo) has(idx uint32) bool {
	_, ok := m.get(idx)
	return ok
}

func (m *memo) get(idx uint32) (slot, bool) {
	if int64(idx) < int64(len(m.dense)) {
		e := m.dense[idx]
		return e.s, e.set
	}
	s, ok := m.sparse[idx]
	return s, ok
}

func (m *memo) put(idx uint32, s slot) {
	switch {
	case int64(idx) < int64(len(m.dense)):
		if !m.dense[idx].set {
			m.n++
		}
		m.dense[idx] = memoEntry{s, true}
		return
	case int64(idx) == int64(len(m.dense)):
		if _, moved := m.sparse[idx]; moved {
			delete(m.sparse, idx)
			m.n--
		}
		m.dense = append(m.dense, memoEntry{s, true})
		m.n++
		return
	}
	if m.sparse == nil {
		m.sparse = map[uint32]slot{}
	}
	if _, ok := m.sparse[idx]; !ok {
		m.n++
	}
	m.sparse[idx] = s
}

// appendTo implements APPEND(S) on a list or a list-like object.
func (d *decoder) appendTo(items []slot) error {
	t, err := d.top()
	if err != nil {
		return err
	}
	switch c := t.v.(type) {
	case *List:
		for _, s := range items {
			if err := d.put(&c.node, s); err != nil {
				return err
			}
			c.Items = append(c.Items, s.v)
		}
	case *Object:
		for _, s := range items {
			if err := d.put(&c.node, s); err != nil {
				return err
			}
			c.Appended = append(c.Appended, s.v)
		}
	default:
		return d.fail("cannot append to %s", typeName(t.v))
	}
	return nil
}

// setItems implements SETITEM(S) on a dict or a dict-like object.
func (d *decoder) setItems(kv []slot) error {
	if len(kv)%2 != 0 {
		return d.fail("odd number of items (%d) for dict", len(kv))
	}
	t, err := d.top()
	if err != nil {
		return err
	}
	var dict *Dict
	var n *node
	switch c := t.v.(type) {
	case *Dict:
		dict, n = c, &c.node
	case *Object:
		if c.Items == nil {
			c.Items = &Dict{}
		}
		dict, n = c.Items, &c.node
	default:
		return d.fail("cannot set items on %s", typeName(t.v))
	}
	for i := 0; i < len(kv); i += 2 {
		if err := d.put(n, kv[i]); err != nil {
			return err
		}
		if err := d.put(n, kv[i+1]); err != nil {
			return err
		}
		if err := dict.Set(kv[i].v, kv[i+1].v); err != nil {
			var pe *Error
			if errors.As(err, &pe) {
				return err
			}
			return &Error{Offset: d.opPos, Op: opName(d.op), Msg: strings.TrimPrefix(err.Error(), "pickle: "), Err: errors.Unwrap(err)}
		}
	}
	return nil
}

func (d *decoder) addToSet(s *Set, items []slot) error {
	for _, it := range items {
		if err := d.put(&s.node, it); err != nil {
			return err
		}
		s.Items = append(s.Items, it.v)
	}
	return nil
}

func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var v uint64
		for i := len(b) - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		shift := uint(64 - 8*len(b))
		return int64(v<<shift) >> shift // sign-extend
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	n := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if n.IsInt64() {
		return n.Int64()
	}
	return n
}

func (d *decoder) run() (any, error) {
	for {
		if d.pos >= len(d.data) {
			d.op = 0
			return nil, &Error{Offset: d.pos, Msg: "truncated input: no STOP opcode"}
		}
		d.opPos = d.pos
		d.op = d.data[d.pos]
		d.pos++
		if d.op == opSTOP {
			s, err := d.pop()
			if err != nil {
				return nil, err
			}
			if d.late && expandedSize(s.v, d.opts.MaxItems) > d.opts.MaxItems {
				return nil, d.limit("more than %d container items (memo references count as copies)", d.opts.MaxItems)
			}
			return s.v, nil
		}
		if err := d.step(); err != nil {
			return nil, err
		}
	}
}

func (d *decoder) step() error {
	switch d.op {
	case opPROTO:
		v, err := d.readUint(1)
		if err != nil {
			return err
		}
		if v > 5 {
			return d.fail("unsupported protocol %d", v)
		}
		return nil
	case opFRAME:
		_, err := d.readUint(8)
		return err
	case opMARK:
		if len(d.stack)+len(d.marks) >= d.opts.MaxStack {
			return d.limit("stack deeper than %d entries", d.opts.MaxStack)
		}
		d.marks = append(d.marks, len(d.stack))
		return nil
	case opPOP:
		if len(d.stack) > d.base() {
			_, err := d.pop()
			return err
		}
		_, err := d.popMark()
		return err
	case opPOP_MARK:
		_, err := d.popMark()
		return err
	case opDUP:
		s, err := d.top()
		if err != nil {
			return err
		}
		s.shared = true
		return d.pushSlot(s)

	// Constants and scalars.
	case opNONE:
		return d.push(nil, 0)
	case opNEWTRUE:
		return d.push(true, 0)
	case opNEWFALSE:
		return d.push(false, 0)
	case opBININT1:
		v, err := d.readUint(1)
		if err != nil {
			return err
		}
		return d.push(int64(v), 0)
	case opBININT2:
		v, err := d.readUint(2)
		if err != nil {
			return err
		}
		return d.push(int64(v), 0)
	case opBININT:
		v, err := d.readUint(4)
		if err != nil {
			return err
		}
		return d.push(int64(int32(uint32(v))), 0)
	case opLONG1, opLONG4:
		size := 1
		if d.op == opLONG4 {
			size = 4
		}
		n, err := d.readUint(size)
		if err != nil {
			return err
		}
		if n > maxLongBytes {
			return d.limit("integer of %d bytes exceeds the limit of %d", n, maxLongBytes)
		}
		b, err := d.read(int(n))
		if err != nil {
			return err
		}
		return d.push(decodeLong(b), 0)
	case opBINFLOAT:
		b, err := d.read(8)
		if err != nil {
			return err
		}
		return d.push(math.Float64frombits(binary.BigEndian.Uint64(b)), 0)
	case opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8:
		n, err := d.readLen(lenSize(d.op))
		if err != nil {
			return err
		}
		b, err := d.read(n)
		if err != nil {
			return err
		}
		return d.push(string(b), 0)
	case opSHORT_BINBYTES, opBINBYTES, opBINBYTES8, opBYTEARRAY8:
		n, err := d.readLen(lenSize(d.op))
		if err != nil {
			return err
		}
		b, err := d.read(n)
		if err != nil {
			return err
		}
		return d.push(append([]byte(nil), b...), 0)

	// Containers.
	case opEMPTY_TUPLE:
		return d.pushSlot(slot{v: Tuple{}, d: 1, w: 1})
	case opTUPLE1, opTUPLE2, opTUPLE3:
		n := int(d.op-opTUPLE1) + 1
		if len(d.stack)-d.base() < n {
			return d.fail("stack underflow")
		}
		items := make([]slot, n)
		copy(items, d.stack[len(d.stack)-n:])
		clear(d.stack[len(d.stack)-n:])
		d.stack = d.stack[:len(d.stack)-n]
		return d.pushTuple(items)
	case opTUPLE:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		return d.pushTuple(items)
	case opEMPTY_LIST:
		return d.push(&List{node: newNode()}, 1)
	case opLIST:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		l := &List{node: newNode()}
		if err := d.push(l, 1); err != nil {
			return err
		}
		return d.appendTo(items)
	case opAPPEND:
		s, err := d.pop()
		if err != nil {
			return err
		}
		return d.appendTo([]slot{s})
	case opAPPENDS:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		return d.appendTo(items)
	case opEMPTY_DICT:
		return d.push(&Dict{node: newNode()}, 1)
	case opDICT:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if err := d.push(&Dict{node: newNode()}, 1); err != nil {
			return err
		}
		return d.setItems(items)
	case opSETITEM:
		v, err := d.pop()
		if err != nil {
			return err
		}
		k, err := d.pop()
		if err != nil {
			return err
		}
		return d.setItems([]slot{k, v})
	case opSETITEMS:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		return d.setItems(items)
	case opEMPTY_SET:
		return d.push(&Set{node: newNode()}, 1)
	case opADDITEMS:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		s, ok := t.v.(*Set)
		if !ok || s.Frozen {
			return d.fail("cannot add items to %s", typeName(t.v))
		}
		return d.addToSet(s, items)
	case opFROZENSET:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		s := &Set{Frozen: true, node: newNode()}
		if err := d.addToSet(s, items); err != nil {
			return err
		}
		return d.push(s, s.depth)

	// Memo.
	case opMEMOIZE:
		s, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(uint32(d.memo.n), s)
	case opBINPUT, opLONG_BINPUT:
		size := 1
		if d.op == opLONG_BINPUT {
			size = 4
		}
		idx, err := d.readUint(size)
		if err != nil {
			return err
		}
		s, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(uint32(idx), s)
	case opBINGET, opLONG_BINGET:
		size := 1
		if d.op == opLONG_BINGET {
			size = 4
		}
		idx, err := d.readUint(size)
		if err != nil {
			return err
		}
		return d.memoGet(uint32(idx))

	// Globals and objects.
	case opGLOBAL:
		module, err := d.readLine()
		if err != nil {
			return err
		}
		name, err := d.readLine()
		if err != nil {
			return err
		}
		return d.push(Global{Module: module, Name: name}, 0)
	case opSTACK_GLOBAL:
		name, err := d.pop()
		if err != nil {
			return err
		}
		module, err := d.pop()
		if err != nil {
			return err
		}
		ms, ok1 := module.v.(string)
		ns, ok2 := name.v.(string)
		if !ok1 || !ok2 {
			return d.fail("STACK_GLOBAL needs two strings, got %s and %s", typeName(module.v), typeName(name.v))
		}
		return d.push(Global{Module: ms, Name: ns}, 0)
	case opREDUCE, opNEWOBJ:
		args, err := d.pop()
		if err != nil {
			return err
		}
		callable, err := d.pop()
		if err != nil {
			return err
		}
		return d.newObject(callable, args, nil)
	case opNEWOBJ_EX:
		kwargs, err := d.pop()
		if err != nil {
			return err
		}
		args, err := d.pop()
		if err != nil {
			return err
		}
		cls, err := d.pop()
		if err != nil {
			return err
		}
		return d.newObject(cls, args, &kwargs)
	case opBUILD:
		state, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		obj, ok := t.v.(*Object)
		if !ok {
			return d.fail("BUILD on %s", typeName(t.v))
		}
		if err := d.put(&obj.node, state); err != nil {
			return err
		}
		obj.State = state.v
		return nil
	case opBINPERSID:
		pid, err := d.pop()
		if err != nil {
			return err
		}
		if d.opts.PersistentLoad == nil {
			return d.fail("persistent id without a persistent-load hook")
		}
		v, err := d.opts.PersistentLoad(pid.v)
		if err != nil {
			return &Error{Offset: d.opPos, Op: opName(d.op), Msg: "persistent load: " + err.Error(), Err: err}
		}
		return d.pushSlot(slot{v: v, d: pid.depth(), w: pid.weight()})
	}
	if name, ok := opNames[d.op]; ok {
		return &Error{Offset: d.opPos, Msg: fmt.Sprintf("unsupported opcode %s (0x%02x) at offset %d", name, d.op, d.opPos)}
	}
	return &Error{Offset: d.opPos, Msg: fmt.Sprintf("unknown opcode 0x%02x at offset %d", d.op, d.opPos)}
}

func (d *decoder) newObject(callable, args slot, kwargs *slot) error {
	obj := &Object{NewObj: d.op != opREDUCE, node: newNode()}
	switch c := callable.v.(type) {
	case Global:
		obj.Class = c
	case *Object:
		if d.op != opREDUCE {
			return d.fail("%s on %s (needs a class)", opName(d.op), typeName(callable.v))
		}
		obj.Func = c
		if err := d.put(&obj.node, callable); err != nil {
			return err
		}
	default:
		return d.fail("%s on %s (only globals and objects can be called)", opName(d.op), typeName(callable.v))
	}
	t, ok := args.v.(Tuple)
	if !ok {
		return d.fail("%s arguments must be a tuple, got %s", opName(d.op), typeName(args.v))
	}
	obj.Args = t
	if err := d.put(&obj.node, args); err != nil {
		return err
	}
	if kwargs != nil {
		kw, ok := kwargs.v.(*Dict)
		if !ok {
			return d.fail("NEWOBJ_EX keyword arguments must be a dict, got %s", typeName(kwargs.v))
		}
		if err := d.put(&obj.node, *kwargs); err != nil {
			return err
		}
		obj.Kwargs = kw
	}
	return d.push(obj, obj.depth)
}
