// Package pickle is the Python pickle codec of ckptfs, one opcode table
// (ops.go) for both directions.
//
// Decode is a restricted decoder: a small virtual machine (vm.go) that
// understands the opcodes CPython emits for protocols 2 to 5 (plus a few
// protocol 0/1 container opcodes) and builds inert Go values. It never
// imports or executes anything: GLOBAL/STACK_GLOBAL give a Global name, and
// REDUCE, NEWOBJ and BUILD on it give an Object that records the class,
// arguments and state. Callers interpret Objects by class path. Encoder
// (encode.go) writes the protocol-2 subset torch's files need. A caller
// that wants millions of small objects as flat arrays, not a tree, sets
// Options.Sink (sink.go), which takes them as they complete; a RecordSink
// (record.go) takes the objects of a few classes as records, read from
// the opcodes without building them (recordfast.go: the shape CPython
// writes for nearly all of them, in one pass). With a Sink the memo keeps
// only the entries the pickle gets again, found by a scan of the opcodes
// before decoding (scan.go: a large framed pickle in segments at once).
// A StrSink hands the record reader strings it knows already (a name
// pickled in full for every chunk), and Options.Release hears of the input
// the scan and the VM are done with (a mapped input drops those pages).
//
// Every resource an attacker controls is bounded by Options: input size,
// string length, container items, nesting depth, stack depth and memo size.
// Exceeding a limit is an error wrapping ErrLimit, never a panic or an
// allocation sized by the input before it was checked.
package pickle

import (
	"errors"
	"fmt"
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
	// MaxMemo bounds the number of memo entries kept (default 1<<26).
	// With a Sink, an entry the pickle never gets again is not kept and
	// not counted: torch's .metadata memoizes ~15 objects per chunk and
	// gets a few of them back, so its puts pass 1<<26 from ~4 M chunks.
	MaxMemo int
	// Sink, when set, takes objects and dict items as they complete
	// (sink.go), and the memo keeps only what the pickle gets again.
	Sink Sink
	// PersistentLoad resolves BINPERSID persistent ids (torch.save data.pkl
	// storages). Without it BINPERSID is an error.
	PersistentLoad func(pid any) (any, error)
	// Release, when set, is told of each part of data the decoder is done
	// with (each part the scan has read, from each of its goroutines at
	// once; the whole of it once scanned; then the part behind the VM as
	// it goes, in order): a mapped input may drop those pages from the
	// process's memory, as nothing decoded points into data. Data must
	// stay readable (a byte released may be read again, rarely).
	Release func(lo, hi int)
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

// maxMaxDepth caps MaxDepth: slots keep depths in 32 bits.
const maxMaxDepth = 1 << 30

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
	o.MaxDepth = min(o.MaxDepth, maxMaxDepth)
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

// DecodeBytes decodes the pickle in data, up to its STOP opcode. Bytes after
// STOP are ignored, as Python does.
func DecodeBytes(data []byte, opts Options) (any, error) {
	opts = opts.withDefaults()
	if int64(len(data)) > opts.MaxInputBytes {
		return nil, &Error{Msg: fmt.Sprintf("input larger than %d bytes", opts.MaxInputBytes), Err: ErrLimit}
	}
	d := &decoder{data: data, opts: opts, releaseAt: math.MaxInt}
	if opts.Sink != nil {
		d.refs = scanRefs(data, opts)
	}
	if opts.Release != nil {
		if opts.Sink != nil {
			opts.Release(0, len(data)) // scanned: read again from its start
		}
		d.releaseAt = releaseStep
	}
	if rs, ok := opts.Sink.(RecordSink); ok && d.refs != nil {
		d.rec = &recorder{sink: rs, data: data, declined: -1}
		d.rec.known, _ = rs.(StrSink)
	}
	return d.run()
}

// slot is a stack or memo entry: a value and, for tuples and scalars, its
// nesting depth and expanded weight (mutable containers carry their own in
// their node). shared marks a second reference (from the memo or DUP).
// A .metadata of 100k chunks memoizes 1.5M values, hence the 32 bits of
// depth (withDefaults bounds MaxDepth below that).
type slot struct {
	v      any
	w      int64
	d      int32
	shared bool
}

func (s slot) depth() int {
	if n := nodeOf(s.v); n != nil {
		return int(n.depth)
	}
	return int(s.d)
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
	// refs, with a Sink, is the memo: only the entries the pickle gets
	// again are kept (in refs.kept), and pruned counts every entry put
	// (nil: memo is the memo).
	refs   *refs
	pruned int
	// releaseAt is where the VM next tells opts.Release of the part
	// behind it (MaxInt: never), released where the last part ended.
	releaseAt, released int
	// rec reads the objects a RecordSink takes as records (record.go);
	// nil without one, or when the memo is not pruned.
	rec *recorder
	// gets are the kept entries the fast path got last, by index
	// (recordfast.go, fastGet).
	gets [64]struct {
		n uint32
		e *slot
	}

	// A .metadata holds millions of small values; one allocation each was
	// most of the time to decode it. Tuples, objects and dicts come from
	// slabs, and short strings and globals are boxed once (a pickle without
	// a memo repeats its field names for every chunk).
	tuples  slab[any]
	objects slab[Object]
	dicts   slab[Dict]
	entries slab[DictItem]
	strs    interner
	globals interner
}

// slab hands out values from chunks of slabLen, one allocation per chunk.
// A value keeps its whole chunk alive, which costs nothing when the values
// are kept together, as a decoded pickle is.
type slab[T any] struct {
	free []T
	last int // the last chunk's length: chunks start small, for a small pickle
}

const slabLen = 256

// chunk refills free with a chunk twice the last, up to slabLen: a 160-byte
// data.pkl (a DCP chunk record's, decoded per chunk) does not pay for 256.
func (s *slab[T]) chunk() {
	s.last = min(slabLen, max(8, 2*s.last))
	s.free = make([]T, s.last)
}

func (s *slab[T]) one() *T {
	if len(s.free) == 0 {
		s.chunk()
	}
	p := &s.free[0]
	s.free = s.free[1:]
	return p
}

// many returns n zero values whose capacity is n, so that appending to
// them never writes over a neighbour's.
func (s *slab[T]) many(n int) []T {
	if n > slabLen/4 {
		return make([]T, n)
	}
	if len(s.free) < n {
		s.chunk()
		if len(s.free) < n {
			return make([]T, n)
		}
	}
	v := s.free[:n:n]
	s.free = s.free[n:]
	return v
}

// interner boxes each distinct short string (or global) once. It holds at
// most maxInterned of them, so hostile input cannot grow it without bound.
type interner map[string]any

const (
	maxInternLen = 64
	maxInterned  = 4096
)

// get returns the value interned under key, or nil.
func (in interner) get(key []byte) any {
	if len(key) > maxInternLen {
		return nil
	}
	return in[string(key)] // no allocation: the compiler looks up in place
}

// put interns v under key when there is room.
func (in *interner) put(key []byte, v any) {
	if len(key) > maxInternLen || len(*in) >= maxInterned {
		return
	}
	if *in == nil {
		*in = interner{}
	}
	(*in)[string(key)] = v
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

// readCounted reads a string of n bytes, n checked against the string
// limit and the remaining input before anything is allocated.
func (d *decoder) readCounted(n uint64) ([]byte, error) {
	if n > uint64(d.opts.MaxStringLen) {
		return nil, d.limit("length %d exceeds the limit of %d bytes", n, d.opts.MaxStringLen)
	}
	if n > uint64(len(d.data)-d.pos) {
		return nil, d.fail("truncated input: length %d but %d bytes left", n, len(d.data)-d.pos)
	}
	return d.read(int(n))
}

// readLine reads up to the next newline and returns the line without it.
func (d *decoder) readLine() ([]byte, error) {
	for i := d.pos; i < len(d.data); i++ {
		if i-d.pos > d.opts.MaxStringLen {
			return nil, d.limit("line longer than %d bytes", d.opts.MaxStringLen)
		}
		if d.data[i] == '\n' {
			b := d.data[d.pos:i]
			d.pos = i + 1
			return b, nil
		}
	}
	return nil, d.fail("truncated input: unterminated line")
}

// str returns b as a boxed string, interned when short.
func (d *decoder) str(b []byte) any {
	if v := d.strs.get(b); v != nil {
		return v
	}
	var v any = string(b)
	d.strs.put(b, v)
	return v
}

func (d *decoder) base() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

// push pushes a new scalar or container.
func (d *decoder) push(v any, depth int) error {
	return d.pushSlot(slot{v: v, d: int32(depth), w: scalarWeight(v)})
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

// popMark removes everything above the topmost MARK, and the mark, and
// returns what it removed: the stack's own slots, valid until the next push
// (no copy: a .metadata has a MARK for every object). Slots left above the
// top are overwritten by later pushes, or dropped with the decoder.
func (d *decoder) popMark() ([]slot, error) {
	if len(d.marks) == 0 {
		return nil, d.fail("no MARK on the stack")
	}
	b := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	out := d.stack[b:]
	d.stack = d.stack[:b]
	return out, nil
}

// popN is popMark for the n topmost slots.
func (d *decoder) popN(n int) ([]slot, error) {
	if len(d.stack)-d.base() < n {
		return nil, d.fail("stack underflow")
	}
	out := d.stack[len(d.stack)-n:]
	d.stack = d.stack[:len(d.stack)-n]
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
func (d *decoder) deepen(p *int32, c int) error {
	if c+1 > int(*p) {
		*p = int32(c + 1)
	}
	if int(*p) > d.opts.MaxDepth {
		return d.limit("values nested deeper than %d", d.opts.MaxDepth)
	}
	return nil
}

// emptyTuple is (), boxed once.
var emptyTuple any = Tuple{}

// pushTuple pushes the tuple of items, which may be the stack's own slots
// above the top (popMark).
func (d *decoder) pushTuple(items []slot) error {
	if len(items) == 0 {
		return d.pushSlot(slot{v: emptyTuple, d: 1, w: 1})
	}
	t := Tuple(d.tuples.many(len(items)))
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
	if d.refs != nil {
		// scanRefs saw every put in order: idx is a new entry.
		if int64(idx) != int64(d.memoLen()) {
			return d.fail("memo index %d out of order", idx)
		}
		// scanRefs bounded what is kept by MaxMemo and the puts by the
		// index's width: an entry never gotten again is only counted.
		d.pruned++ // counted here, kept (or not) in refs
		e, ok := d.refs.at(idx)
		if !ok {
			return nil
		}
		if n := nodeOf(s.v); n != nil {
			n.kept = true
		}
		s.shared = true
		*e = s
		return nil
	}
	if !d.memo.has(idx) && d.memo.n >= d.opts.MaxMemo {
		return d.limit("more than %d memo entries", d.opts.MaxMemo)
	}
	d.memo.put(idx, s)
	return nil
}

// memoLen is the number of memo entries put: MEMOIZE's index.
func (d *decoder) memoLen() int { return d.memo.n + d.pruned }

func (d *decoder) memoGet(idx uint32) error {
	if d.refs != nil {
		e, ok := d.refs.at(idx)
		if !ok || !e.shared {
			return d.fail("memo key %d not found", idx)
		}
		return d.pushSlot(*e)
	}
	s, ok := d.memo.get(idx)
	if !ok {
		return d.fail("memo key %d not found", idx)
	}
	return d.pushSlot(s) // shared, as all the memo holds
}

// memo is the pickle memo. Writers number entries 0, 1, 2, ... (MEMOIZE,
// and BINPUT from CPython's pickler), so they live in fixed-size pages,
// which grow without copying what is there (a .metadata of 100k chunks
// holds millions of entries); any other index a hand-made pickle uses goes
// to a map. What the memo holds is shared by definition, so an entry's
// shared flag also tells a set entry of the pages from an unset one.
type memo struct {
	pages  [][]slot // every page full but the last
	dense  int      // entries in pages: indices [0, dense)
	sparse map[uint32]slot
	n      int // entries in both
}

const memoPage = 1024

func (m *memo) has(idx uint32) bool {
	_, ok := m.get(idx)
	return ok
}

func (m *memo) get(idx uint32) (slot, bool) {
	if int64(idx) < int64(m.dense) {
		s := m.pages[idx/memoPage][idx%memoPage]
		return s, s.shared
	}
	s, ok := m.sparse[idx]
	return s, ok
}

func (m *memo) put(idx uint32, s slot) {
	s.shared = true
	switch {
	case int64(idx) < int64(m.dense):
		e := &m.pages[idx/memoPage][idx%memoPage]
		if !e.shared {
			m.n++
		}
		*e = s
		return
	case int64(idx) == int64(m.dense):
		if _, moved := m.sparse[idx]; moved {
			delete(m.sparse, idx)
			m.n--
		}
		if idx%memoPage == 0 {
			n := memoPage
			if idx == 0 {
				n = 16 // the first page grows as it fills: most pickles are small
			}
			m.pages = append(m.pages, make([]slot, 0, n))
		}
		last := len(m.pages) - 1
		m.pages[last] = append(m.pages[last], s)
		m.dense++
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
		c.Items = reserve(c.Items, len(items))
		for _, s := range items {
			if err := d.put(&c.node, s); err != nil {
				return err
			}
			c.Items = append(c.Items, s.v)
		}
	case *Object:
		e := c.extra()
		e.Appended = reserve(e.Appended, len(items))
		for _, s := range items {
			if err := d.put(&c.node, s); err != nil {
				return err
			}
			e.Appended = append(e.Appended, s.v)
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
		e := c.extra()
		if e.Items == nil {
			e.Items = d.dicts.one()
		}
		dict, n = e.Items, &c.node
	default:
		return d.fail("cannot set items on %s", typeName(t.v))
	}
	if cap(dict.items) == 0 && len(kv) > 2 {
		// SETITEMS says how many. Once only: a dict whose items a sink
		// takes stays empty, batch after batch.
		dict.items = d.entries.many(len(kv) / 2)[:0]
	}
	dict.items = reserve(dict.items, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		if err := d.put(n, kv[i]); err != nil {
			return err
		}
		if err := d.put(n, kv[i+1]); err != nil {
			return err
		}
		if d.opts.Sink != nil && n == &dict.node {
			took, err := d.opts.Sink.SetItem(dict, kv[i].v, kv[i+1].v)
			if err != nil {
				return d.sinkErr(err)
			}
			if took {
				continue
			}
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

// reserve returns s with room for n more elements, doubling its capacity
// when it grows: append grows a large slice by a quarter, and a pickle
// fills a list or dict of 100k entries by the thousand (APPENDS,
// SETITEMS), which copied it over and over. n is at most what the stack
// held, so the room is bounded by what was already allocated.
func reserve[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	return append(make([]T, 0, max(2*cap(s), len(s)+n)), s...)
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
		return smallLong(b)
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

// smallLong is a LONG1 of at most 8 bytes (little-endian two's complement).
func smallLong(b []byte) int64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	shift := uint(64 - 8*len(b))
	return int64(v<<shift) >> shift // sign-extend
}
