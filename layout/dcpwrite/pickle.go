package dcpwrite

import (
	"encoding/binary"
	"math"
	"math/big"
)

// A protocol-2 pickle emitter for the few shapes DCP needs (FORMATS.md §2.6):
// GLOBAL, EMPTY_TUPLE/NEWOBJ/BUILD objects, REDUCE calls, dicts, lists,
// tuples, str, int, bool and None. No memo. Integers and strings use the
// opcodes CPython's pickler picks for protocol 2, so the output is what
// pickle.dumps(obj, protocol=2) would give for the same object graph, minus
// the memo.

// Pickle opcodes.
const (
	opProto      = 0x80
	opStop       = '.'
	opMark       = '('
	opGlobal     = 'c'
	opEmptyTuple = ')'
	opTuple      = 't'
	opTuple1     = 0x85
	opTuple2     = 0x86
	opTuple3     = 0x87
	opEmptyDict  = '}'
	opSetItems   = 'u'
	opEmptyList  = ']'
	opAppends    = 'e'
	opNewObj     = 0x81
	opReduce     = 'R'
	opBuild      = 'b'
	opNone       = 'N'
	opNewTrue    = 0x88
	opNewFalse   = 0x89
	opBinInt1    = 'K'
	opBinInt2    = 'M'
	opBinInt     = 'J'
	opLong1      = 0x8a
	opBinUnicode = 'X'
	opBinPersID  = 'Q'
)

type pickler struct {
	b []byte
}

func newPickler() *pickler { return &pickler{b: []byte{opProto, 2}} }

func (p *pickler) op(ops ...byte) { p.b = append(p.b, ops...) }

// finish appends STOP and returns the pickle.
func (p *pickler) finish() []byte { return append(p.b, opStop) }

func (p *pickler) global(module, name string) {
	p.b = append(p.b, opGlobal)
	p.b = append(p.b, module...)
	p.b = append(p.b, '\n')
	p.b = append(p.b, name...)
	p.b = append(p.b, '\n')
}

func (p *pickler) str(s string) {
	p.b = append(p.b, opBinUnicode)
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	p.b = append(p.b, s...)
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v < 1<<8:
		p.b = append(p.b, opBinInt1, byte(v))
	case v >= 0 && v < 1<<16:
		p.b = append(p.b, opBinInt2)
		p.b = binary.LittleEndian.AppendUint16(p.b, uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		p.b = append(p.b, opBinInt)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(v)))
	default:
		p.long1(v)
	}
}

// long1 emits LONG1: little-endian two's complement, shortest form, as
// CPython's encode_long does.
func (p *pickler) long1(v int64) {
	var le []byte
	x := big.NewInt(v)
	n := (x.BitLen() >> 3) + 1 // bytes incl. sign bit, like CPython
	if v < 0 {
		// Two's complement of n bytes; shrink while the top byte is 0xff
		// and the next one keeps the sign.
		u := uint64(v)
		for i := 0; i < 8; i++ {
			le = append(le, byte(u>>(8*i)))
		}
		for len(le) > 1 && le[len(le)-1] == 0xff && le[len(le)-2]&0x80 != 0 {
			le = le[:len(le)-1]
		}
	} else {
		u := uint64(v)
		for i := 0; i < n; i++ {
			le = append(le, byte(u>>(8*i)))
		}
	}
	p.b = append(p.b, opLong1, byte(len(le)))
	p.b = append(p.b, le...)
}

func (p *pickler) bool(v bool) {
	if v {
		p.op(opNewTrue)
	} else {
		p.op(opNewFalse)
	}
}

// tuple emits a tuple whose elements items writes; n is their count.
func (p *pickler) tuple(n int, items func()) {
	switch n {
	case 0:
		p.op(opEmptyTuple)
	case 1, 2, 3:
		items()
		p.op([]byte{opTuple1, opTuple2, opTuple3}[n-1])
	default:
		p.op(opMark)
		items()
		p.op(opTuple)
	}
}

func (p *pickler) intTuple(v []int64) {
	p.tuple(len(v), func() {
		for _, x := range v {
			p.int(x)
		}
	})
}

// object emits cls.__new__(cls) then BUILD with the state state writes.
func (p *pickler) object(module, name string, state func()) {
	p.global(module, name)
	p.op(opEmptyTuple, opNewObj)
	state()
	p.op(opBuild)
}

// dict emits a dict; items writes key, value pairs (n of them).
func (p *pickler) dict(n int, items func()) {
	p.op(opEmptyDict)
	if n == 0 {
		return
	}
	p.op(opMark)
	items()
	p.op(opSetItems)
}

// list emits a list; items writes n elements.
func (p *pickler) list(n int, items func()) {
	p.op(opEmptyList)
	if n == 0 {
		return
	}
	p.op(opMark)
	items()
	p.op(opAppends)
}

// size emits torch.Size((v...)).
func (p *pickler) size(v []int64) {
	p.global("torch", "Size")
	p.intTuple(v)
	p.op(opTuple1, opReduce)
}
