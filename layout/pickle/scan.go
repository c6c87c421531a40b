package pickle

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"runtime/debug"
	"sync"
)

// The memo scan: before a decoding with a Sink, one pass over the opcodes
// finds the memo entries the pickle gets again (refs), so that the decoder
// keeps only those. A .metadata of millions of chunks is hundreds of
// millions of opcodes, and the scan cannot follow the decoder (at each
// put the decoder needs to know whether any later get reads it), so a
// large pickle is scanned in segments at once, one per core: a pickle of
// protocol 4 and up is a chain of frames, and a frame starts at an opcode.
// A segment does not know how many entries were put before it; it checks
// what it can, keeps what it needs to check the rest once the segments
// before it are done, and the segments are joined only where that gives
// exactly what the scan in one pass gives (each segment ending where the
// next starts, every get and put in order); anything else, including a
// hostile frame length, is scanned again in one pass.

// scanSplitMin is the size of the smallest segment: below it a second
// goroutine costs more than it saves (tests lower it).
var scanSplitMin = 8 << 20

// scanMaxParts bounds the segments: the scan is a small part of a
// decoding, and each segment may hold a bitmap of the memo's size.
const scanMaxParts = 4

// scanCheck, set by tests, is called with what the segments gave
// (scan_test.go compares it with the scan in one pass).
var scanCheck func(data []byte, opts Options, got *refs)

// scanRefs walks the opcodes of data up to STOP without building anything
// and returns the memo indices gotten after they were put, or nil when the
// memo cannot be pruned (a put out of order, an opcode the VM does not run,
// a truncated input: decoding then keeps every entry, or fails where the
// VM fails). Its bitmap is at most one bit per opcode.
func scanRefs(data []byte, opts Options) *refs {
	if parts := min(runtime.GOMAXPROCS(0), scanMaxParts, len(data)/max(scanSplitMin, 1)); parts > 1 {
		if starts := frameStarts(data, parts); len(starts) > 1 {
			if r, ok := scanSegments(data, starts, opts); ok {
				if scanCheck != nil {
					scanCheck(data, opts, r)
				}
				return r
			}
		}
	}
	return scanOnce(data, opts)
}

// scanOnce is the scan in one pass.
func scanOnce(data []byte, opts Options) *refs {
	s := scanSeg{end: len(data), known: true}
	s.runIn(data, opts.Release)
	if s.bad || !s.stop {
		return nil
	}
	if !s.r.index(opts.MaxMemo) {
		return nil // the VM keeps every entry, and stops at the limit
	}
	return &s.r
}

// An entry that is not gotten again costs nothing, so only the memo
// index's width bounds the puts; MaxMemo bounds the entries kept.
const maxPuts = math.MaxUint32

// scanSeg is the scan of data[start:end].
type scanSeg struct {
	start, end int
	// known: the segment is the first, the entries put before it none,
	// so every check is made as it goes.
	known bool

	r    refs   // the gets; only bits are set
	puts uint32 // entries put in the segment
	pos  int    // where the scan ended
	stop bool   // at STOP, pos after it
	bad  bool   // at something the scan in one pass gives up at

	// Where the entries put before it are not known: late is the largest
	// n-puts+1 of a get of entry n made after the segment had put puts
	// entries, for an n it did not put (0: none), which must be at most
	// the entries put before it; put is n-puts+1 of its BINPUTs, which
	// must be that number plus one (0: none).
	late, put uint64
}

// run scans the segment. Its loop is the scan's cost: locals, no calls
// on the common path, the opcodes of a .metadata's records first.
func (s *scanSeg) run(data []byte) {
	r := &s.r
	puts := s.puts                         // entries put so far: the next index, less the unknown base
	pos, end := max(s.start, s.pos), s.end // s.pos: where runIn stopped it
	for pos < end {
		op := data[pos]
		// The opcodes of a .metadata's records first, each its own case:
		// where the next opcode is then does not wait for a table load,
		// and the branch predictor follows their repeating pattern.
		switch op {
		case opMEMOIZE:
			if puts++; puts >= maxPuts {
				s.bad = true
				return
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
				s.bad = true
				return
			}
			if n := uint32(data[pos+1]); n < puts {
				r.set(n)
			} else if !s.known {
				s.early(uint64(n), puts)
			}
			pos += 2
			continue
		case opLONG_BINGET:
			// The gets of a tensor's name or a file's path, after the
			// first 256 entries: read as one word, not byte by byte.
			if pos+4 >= len(data) {
				s.bad = true
				return
			}
			if n := binary.LittleEndian.Uint32(data[pos+1:]); n < puts {
				r.set(n)
			} else if !s.known {
				s.early(uint64(n), puts)
			}
			pos += 5
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
				s.bad = true
				return
			}
			pos++
			continue
		}
		pos++
		w := int(k.width)
		if w > len(data)-pos {
			s.bad = true
			return
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
				s.bad = true
				return
			}
			pos += int(n)
		case scanGet:
			if n < uint64(puts) {
				r.set(uint32(n))
			} else if !s.known {
				s.early(n, puts)
			}
		case scanPut:
			if !s.putAt(n, puts) {
				s.bad = true
				return
			}
			if puts++; puts >= maxPuts {
				s.bad = true
				return
			}
		case scanFloat:
			pos += 8
		case scanGlobal:
			for range 2 {
				i := bytes.IndexByte(data[pos:], '\n')
				if i < 0 {
					s.bad = true
					return
				}
				pos += i + 1
			}
		case scanStop:
			s.puts, s.pos, s.stop = puts, pos, true
			return
		default:
			s.bad = true
			return
		}
	}
	s.puts, s.pos = puts, pos
}

// scanPart is the part runIn scans between releases (a var: tests scan in
// parts of a few bytes).
var scanPart = releaseStep

// runIn runs the segment in parts of scanPart bytes, telling release
// (Options.Release; nil: the segment in one run) of each part scanned, so
// that a mapped input is not all resident at the scan's end. run stops
// after the opcode that crosses a part's end, and goes on from there.
func (s *scanSeg) runIn(data []byte, release func(lo, hi int)) {
	if release == nil {
		s.run(data)
		return
	}
	end := s.end
	defer func() { s.end = end }()
	for lo := s.start; ; lo = s.pos {
		s.end = min(end, max(lo, s.start)+scanPart)
		s.run(data)
		if s.bad || s.stop || s.end == end {
			return
		}
		release(lo, s.pos)
	}
}

// early is a get of entry n, which the segment did not put, made after it
// had put puts entries: an entry put before the segment when more than
// n-puts were (checked by join). Each put is an opcode, so fewer than
// start were: a larger n is not put yet, and the get keeps nothing, as in
// one pass (where the VM then fails at it).
func (s *scanSeg) early(n uint64, puts uint32) {
	if n >= uint64(s.start)+uint64(puts) {
		return
	}
	s.late = max(s.late, n-uint64(puts)+1)
	s.r.set(uint32(n))
}

// putAt checks a BINPUT of entry n after puts entries: the next one.
func (s *scanSeg) putAt(n uint64, puts uint32) bool {
	switch {
	case s.known:
		return n == uint64(puts)
	case n < uint64(puts):
		return false
	case s.put == 0:
		s.put = n - uint64(puts) + 1
		return true
	}
	return s.put == n-uint64(puts)+1
}

// frameStarts returns where the segments of a scan in parts start: 0, and
// the first frame at or after each part's share of data.
func frameStarts(data []byte, parts int) []int {
	starts := []int{0}
	pos := 0
	if len(data) >= 2 && data[0] == opPROTO {
		pos = 2
	}
	for len(starts) < parts && pos <= len(data)-9 && data[pos] == opFRAME {
		if pos >= len(data)/parts*len(starts) {
			starts = append(starts, pos)
		}
		n := binary.LittleEndian.Uint64(data[pos+1:])
		if n > uint64(len(data)-pos-9) {
			break
		}
		pos += 9 + int(n)
	}
	return starts
}

// scanSegments scans data in segments from starts (starts[0] is 0), the
// first on this goroutine, and joins them. ok is false where the joined
// scan could differ from the scan in one pass: the caller scans again.
func scanSegments(data []byte, starts []int, opts Options) (_ *refs, ok bool) {
	segs := make([]scanSeg, len(starts))
	for i := range segs {
		segs[i].start, segs[i].end = starts[i], len(data)
		if i+1 < len(starts) {
			segs[i].end = starts[i+1]
		}
	}
	segs[0].known = true
	// A mapped file cut short faults where it is read: the other
	// segments fault as this goroutine would (a panic with the caller's
	// SetPanicOnFault, not a crash), and such a segment is scanned again
	// here, in one pass, if it matters.
	onFault := debug.SetPanicOnFault(false)
	debug.SetPanicOnFault(onFault)
	failed := make([]bool, len(segs))
	var wg sync.WaitGroup
	for i := 1; i < len(segs); i++ {
		wg.Go(func() {
			debug.SetPanicOnFault(onFault)
			defer func() {
				if recover() != nil {
					failed[i] = true
				}
			}()
			segs[i].runIn(data, opts.Release)
		})
	}
	func() {
		defer wg.Wait() // none left running, even if this one panics
		segs[0].runIn(data, opts.Release)
	}()

	bits := segs[0].r.bits
	var base uint64 // entries put before the segment
	for i := range segs {
		s := &segs[i]
		if s.bad || failed[i] || s.late > base || (s.put != 0 && s.put != base+1) {
			return nil, false
		}
		if i > 0 {
			for len(bits) < len(s.r.bits) {
				bits = append(bits, 0)
			}
			for w, b := range s.r.bits {
				bits[w] |= b
			}
		}
		if base += uint64(s.puts); base >= maxPuts {
			return nil, false
		}
		if s.stop {
			r := &refs{bits: bits}
			if !r.index(opts.MaxMemo) {
				return nil, true
			}
			return r, true
		}
		if s.pos != s.end {
			return nil, false // an opcode across the segments' boundary
		}
	}
	return nil, false // no STOP
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
