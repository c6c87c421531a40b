package pickle

import (
	"bytes"
	"math"
	"math/bits"
)

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

// scanRefs walks the opcodes of data up to STOP without building anything
// and returns the memo indices gotten after they were put, or nil when the
// memo cannot be pruned (a put out of order, an opcode the VM does not run,
// a truncated input: decoding then keeps every entry, or fails where the
// VM fails). Its bitmap is at most one bit per opcode.
func scanRefs(data []byte, opts Options) *refs {
	r := &refs{}
	var puts uint32 // entries put so far: the next index
	// An entry that is not gotten again costs nothing, so only the memo
	// index's width bounds the puts; MaxMemo bounds the entries kept.
	const maxPuts = math.MaxUint32
	pos := 0
	for pos < len(data) {
		op := data[pos]
		// The opcodes of a .metadata's records first, each its own case:
		// where the next opcode is then does not wait for a table load,
		// and the branch predictor follows their repeating pattern.
		switch op {
		case opMEMOIZE:
			if puts++; puts >= maxPuts {
				return nil
			}
			pos++
			continue
		case opBININT1:
			pos += 2
			continue
		case opBININT2:
			pos += 3
			continue
		case opBININT:
			pos += 5
			continue
		case opTUPLE1, opTUPLE2, opTUPLE3, opREDUCE, opNEWOBJ, opEMPTY_TUPLE, opEMPTY_DICT, opMARK,
			opSETITEMS, opBUILD, opNONE:
			pos++
			continue
		case opBINGET:
			if pos+1 >= len(data) {
				return nil
			}
			if n := uint32(data[pos+1]); n < puts {
				r.set(n)
			}
			pos += 2
			continue
		}
		k := scanKinds[op]
		// Most other opcodes need no more than their width: skipped
		// without reading the operand (one past the end is a truncated
		// input, which ends the loop).
		switch k.kind {
		case scanRun:
			pos += 1 + int(k.width)
			continue
		case scanMemoize:
			if puts++; puts >= maxPuts {
				return nil
			}
			pos++
			continue
		}
		pos++
		w := int(k.width)
		if w > len(data)-pos {
			return nil
		}
		var n uint64
		switch w {
		case 1:
			n = uint64(data[pos])
		case 2, 4, 8:
			for i := w - 1; i >= 0; i-- {
				n = n<<8 | uint64(data[pos+i])
			}
		}
		pos += w
		switch k.kind {
		case scanCounted:
			if n > uint64(len(data)-pos) {
				return nil
			}
			pos += int(n)
		case scanGet:
			if n < uint64(puts) {
				r.set(uint32(n))
			}
		case scanPut:
			if n != uint64(puts) {
				return nil
			}
			if puts++; puts >= maxPuts {
				return nil
			}
		case scanFloat:
			pos += 8
		case scanGlobal:
			for range 2 {
				i := bytes.IndexByte(data[pos:], '\n')
				if i < 0 {
					return nil
				}
				pos += i + 1
			}
		case scanStop:
			if !r.index(opts.MaxMemo) {
				return nil // the VM keeps every entry, and stops at the limit
			}
			return r
		default:
			return nil
		}
	}
	return nil
}

// What scanRefs does with each opcode, from one table: a .metadata is
// hundreds of millions of them.
const (
	scanBad     = iota // not run by the VM: the scan gives up
	scanRun            // nothing but its operand
	scanCounted        // a string or long: the operand counts the bytes that follow
	scanGet
	scanMemoize
	scanPut
	scanFloat
	scanGlobal
	scanStop
)

var scanKinds = func() (t [256]struct{ kind, width uint8 }) {
	for op := range t {
		t[op].width = uint8(shapes[op].width)
		if runs[op] {
			t[op].kind = scanRun
		}
	}
	for _, op := range []byte{opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8, opSHORT_BINBYTES, opBINBYTES,
		opBINBYTES8, opBYTEARRAY8, opLONG1, opLONG4} {
		t[op].kind = scanCounted
	}
	t[opBINGET].kind, t[opLONG_BINGET].kind = scanGet, scanGet
	t[opMEMOIZE].kind = scanMemoize
	t[opBINPUT].kind, t[opLONG_BINPUT].kind = scanPut, scanPut
	t[opBINFLOAT].kind = scanFloat
	t[opGLOBAL].kind = scanGlobal
	t[opSTOP].kind = scanStop
	return t
}()

// runs are the opcodes without operands in the input that the VM runs.
var runs = func() (t [256]bool) {
	for _, op := range []byte{opMARK, opPOP, opPOP_MARK, opDUP, opNONE, opNEWTRUE, opNEWFALSE,
		opBININT1, opBININT2, opBININT, opPROTO, opFRAME, opEMPTY_TUPLE, opTUPLE1, opTUPLE2, opTUPLE3,
		opTUPLE, opEMPTY_LIST, opLIST, opAPPEND, opAPPENDS, opEMPTY_DICT, opDICT, opSETITEM,
		opSETITEMS, opEMPTY_SET, opADDITEMS, opFROZENSET, opSTACK_GLOBAL, opREDUCE, opNEWOBJ,
		opNEWOBJ_EX, opBUILD, opBINPERSID} {
		t[op] = true
	}
	return t
}()
