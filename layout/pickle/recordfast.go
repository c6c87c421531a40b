package pickle

// The record machine's fast path: the one shape CPython (protocol 4 and
// up) writes for nearly every record of a .metadata, read in one pass
// with no stack:
//
//	MEMOIZE EMPTY_DICT MEMOIZE MARK (key value)... SETITEMS BUILD
//
// key:   a str got from the memo, or SHORT_BINUNICODE MEMOIZE
// value: NONE | BININT1 | BININT2 | BININT | LONG1 (up to 8 bytes)
//	| a str got from the memo | SHORT_BINUNICODE MEMOIZE
//	| a global got from the memo called with a tuple of up to 3 ints:
//	  GET (EMPTY_TUPLE | ints TUPLE1..3 MEMOIZE) TUPLE1 MEMOIZE REDUCE MEMOIZE
//
// where no entry put is one the pickle gets again. It leaves the recorder
// as recordState would (fields, ints, boxes, puts, cost, p), and gives up
// at anything else, the general machine then reading the record from its
// start; a test hook (fastCheck) runs both and compares.

// fastCheck, set by tests, is called for every record the fast path
// reads, with the record's start and cost before it (record_fast_test.go
// reads it again with recordState and compares).
var fastCheck func(d *decoder, start int, cost int64, build int)

// fastState is recordState for the shape above. Its helpers take and
// return the input position (and the next memo index) rather than share
// them through closures: kept in registers, not in memory.
func (d *decoder) fastState() (build int, ok bool) {
	r := d.rec
	data := d.data
	p := r.p
	next := d.memoLen() // the index the next MEMOIZE puts

	// The object's MEMOIZE, its state dict's, and the MARK of its items.
	if p, next, ok = d.fastMemoize(p, next); !ok || p >= len(data) || data[p] != opEMPTY_DICT {
		return 0, false
	}
	if p, next, ok = d.fastMemoize(p+1, next); !ok || p >= len(data) || data[p] != opMARK {
		return 0, false
	}
	p++
	cost := r.cost
	for pairs := 0; ; pairs++ {
		if p >= len(data) {
			return 0, false
		}
		if data[p] == opSETITEMS {
			break
		}
		if pairs == recFields {
			return 0, false
		}
		var name string
		var kc int64 // what putting the name costs
		var v rval
		if name, kc, p, next, ok = d.fastKey(p, next); !ok || p >= len(data) {
			return 0, false
		}
		switch op := data[p]; op {
		case opNONE:
			p++
			v = rval{kind: rNone, w: 1}
		case opBININT1, opBININT2, opBININT, opLONG1:
			var i int64
			if i, p, ok = fastInt(data, p); !ok {
				return 0, false
			}
			v = rval{kind: rInt, w: 1, i: i}
		case opSHORT_BINUNICODE:
			if v, p, next, ok = d.fastStr(p, next); !ok {
				return 0, false
			}
		case opBINGET, opLONG_BINGET:
			var e *slot
			if e, p, ok = d.fastGet(p); !ok {
				return 0, false
			}
			switch e.v.(type) {
			case string:
				v = rval{kind: rStr, shared: true, w: e.w, box: r.boxOf(e.v)}
			case Global:
				// A call of it with a tuple of ints (torch.Size).
				lo := len(r.ints)
				if p < len(data) && data[p] == opEMPTY_TUPLE {
					p++
				} else {
					for len(r.ints)-lo < 3 {
						var i int64
						if i, p, ok = fastInt(data, p); !ok {
							break
						}
						r.ints = append(r.ints, i)
					}
					n := len(r.ints) - lo
					if n == 0 || p >= len(data) || data[p] != opTUPLE1+byte(n-1) {
						return 0, false
					}
					if p, next, ok = d.fastMemoize(p+1, next); !ok {
						return 0, false
					}
				}
				n := len(r.ints) - lo
				if p >= len(data) || data[p] != opTUPLE1 {
					return 0, false
				}
				if p, next, ok = d.fastMemoize(p+1, next); !ok || p >= len(data) || data[p] != opREDUCE {
					return 0, false
				}
				if p, next, ok = d.fastMemoize(p+1, next); !ok {
					return 0, false
				}
				// The weights and costs recordState gives: the ints, the
				// tuple in a tuple, the call.
				v = rval{kind: rCall, w: 3 + int64(n), d: 3, i: int64(lo), n: uint8(n), box: r.boxOf(e.v)}
				cost = addWeight(cost, int64(n)+2)
			default:
				return 0, false
			}
		default:
			return 0, false
		}
		cost = addWeight(addWeight(cost, kc), v.cost())
		r.set(name, v)
	}
	// SETITEMS, then BUILD.
	if p+1 >= len(data) || data[p+1] != opBUILD {
		return 0, false
	}
	r.p = p + 2
	r.puts = next - d.memoLen()
	r.cost = cost + 1 // BUILD puts the dict into the object
	return p + 1, true
}

// fastMemoize reads a MEMOIZE at p of memo entry next, one the pickle
// never gets.
func (d *decoder) fastMemoize(p, next int) (int, int, bool) {
	if p >= len(d.data) || d.data[p] != opMEMOIZE || d.refs.has(uint32(next)) {
		return p, next, false
	}
	return p + 1, next + 1, true
}

// fastGet reads a BINGET or LONG_BINGET at p of an entry the memo shares.
func (d *decoder) fastGet(p int) (*slot, int, bool) {
	data := d.data
	var n uint32
	switch {
	case p+1 < len(data) && data[p] == opBINGET:
		n = uint32(data[p+1])
		p += 2
	case p+4 < len(data) && data[p] == opLONG_BINGET:
		n = uint32(data[p+1]) | uint32(data[p+2])<<8 | uint32(data[p+3])<<16 | uint32(data[p+4])<<24
		p += 5
	default:
		return nil, p, false
	}
	// A record's keys and classes are a handful of entries got millions
	// of times: where each is kept is remembered (kept never moves).
	c := &d.gets[n%uint32(len(d.gets))]
	if c.e == nil || c.n != n {
		e, ok := d.refs.at(n)
		if !ok {
			return nil, p, false
		}
		c.n, c.e = n, e
	}
	return c.e, p, c.e.shared
}

// fastStr reads a str at p, got from the memo or written there (and
// memoized, as entry next), as a value.
func (d *decoder) fastStr(p, next int) (rval, int, int, bool) {
	data, r := d.data, d.rec
	if p < len(data) && data[p] == opSHORT_BINUNICODE {
		if p+1 >= len(data) {
			return rval{}, p, next, false
		}
		n := int(data[p+1])
		if n > d.opts.MaxStringLen || n > len(data)-p-2 {
			return rval{}, p, next, false
		}
		var box any
		if r.known != nil {
			box = r.known.Str(data[p+2 : p+2+n])
		}
		if box == nil {
			box = d.str(data[p+2 : p+2+n])
		}
		v := rval{kind: rStr, w: 1 + int64(n)/itemBytes, box: r.boxOf(box)}
		p, next, ok := d.fastMemoize(p+2+n, next)
		return v, p, next, ok
	}
	e, p, ok := d.fastGet(p)
	if !ok {
		return rval{}, p, next, false
	}
	if _, ok := e.v.(string); !ok {
		return rval{}, p, next, false
	}
	return rval{kind: rStr, shared: true, w: e.w, box: r.boxOf(e.v)}, p, next, true // boxed already
}

// fastKey reads a field's name at p, as fastStr reads a str, and what
// putting it into the state costs; not boxed (a record keeps its fields'
// names as strings), which was a box per field.
func (d *decoder) fastKey(p, next int) (string, int64, int, int, bool) {
	data := d.data
	if p < len(data) && data[p] == opSHORT_BINUNICODE {
		v, p, next, ok := d.fastStr(p, next)
		if !ok {
			return "", 0, p, next, false
		}
		return d.rec.boxes[v.box].(string), v.cost(), p, next, true
	}
	e, p, ok := d.fastGet(p)
	if !ok {
		return "", 0, p, next, false
	}
	name, ok := e.v.(string)
	// A str from the memo is shared: putting it costs its weight (rval.cost).
	return name, e.w, p, next, ok
}

// fastInt reads an int opcode at p.
func fastInt(data []byte, p int) (int64, int, bool) {
	if p >= len(data) {
		return 0, p, false
	}
	switch data[p] {
	case opBININT1:
		if p+1 < len(data) {
			return int64(data[p+1]), p + 2, true
		}
	case opBININT2:
		if p+2 < len(data) {
			return int64(data[p+1]) | int64(data[p+2])<<8, p + 3, true
		}
	case opBININT:
		if p+4 < len(data) {
			return int64(int32(uint32(data[p+1]) | uint32(data[p+2])<<8 | uint32(data[p+3])<<16 | uint32(data[p+4])<<24)), p + 5, true
		}
	case opLONG1:
		if p+1 < len(data) {
			n := int(data[p+1])
			if n <= 8 && n <= len(data)-p-2 {
				return smallLong(data[p+2 : p+2+n]), p + 2 + n, true
			}
		}
	}
	return 0, p, false
}

// recordFast runs the fast path, then the general machine where it gives
// up (from the record's start, with nothing of the fast path's kept).
func (d *decoder) recordFast() (build int, ok bool) {
	r := d.rec
	start, cost := r.p, r.cost
	if build, ok = d.fastState(); ok {
		if fastCheck != nil {
			fastCheck(d, start, cost, build)
		}
		return build, true
	}
	r.p, r.cost = start, cost
	r.vals, r.marks = append(r.vals[:0], rval{kind: rObj}), r.marks[:0]
	r.fields, r.ints, r.strs = r.fields[:0], r.ints[:0], r.strs[:0]
	clear(r.boxes)
	r.boxes = r.boxes[:0]
	return d.recordState()
}
