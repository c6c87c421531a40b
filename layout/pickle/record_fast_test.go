package pickle

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every test of this package checks each record the fast path reads
// against recordState, and counts them.
func init() {
	fastCheck = func(d *decoder, start int, cost int64, build int) {
		fastRecords++
		d.checkFast(start, cost, build)
	}
}

var fastRecords int

// rec4 is a protocol-4 pickle as CPython writes it, of torch.Size (put in
// memo entry 2 and popped), then [C(state), ...]: C's first object made
// by STACK_GLOBAL, the others by a get of the class, each state's items
// written by items (opcodes; memo entries from 9 on in the first).
func rec4(items ...string) string {
	var b strings.Builder
	b.WriteString("\x80\x04\x8c\x05torch\x94\x8c\x04Size\x94\x93\x940]\x94(\x8c\x01m\x94\x8c\x01C\x94\x93\x94")
	for i, it := range items {
		if i > 0 {
			b.WriteString("h\x06")
		}
		b.WriteString(")\x81\x94}\x94(" + it + "ub")
	}
	b.WriteString("e.")
	return b.String()
}

// The shapes the fast path reads, and those it leaves to recordState,
// each decoded with records and without (and every record it reads
// checked against recordState by fastCheck).
func TestRecordFastShapes(t *testing.T) {
	const a, b = "\x8c\x01a\x94", "\x8c\x01b\x94"
	size := func(ints string, tuple byte) string {
		if ints == "" {
			return "h\x02)\x85\x94R\x94"
		}
		return "h\x02" + ints + string([]byte{tuple}) + "\x94\x85\x94R\x94"
	}
	for _, tc := range []struct {
		name   string
		in     string
		opts   Options
		fast   int // records the fast path reads
		record bool
	}{
		{"ints, None, strs", rec4(a + "K\x01" + b + "M\x01\x02\x8c\x01c\x94J\xff\xff\xff\xff\x8c\x01d\x94\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8c\x01e\x94N\x8c\x01f\x94\x8c\x02hi\x94"), Options{}, 1, true},
		{"torch.Size of 0 to 3 ints", rec4(a + size("", 0) + b + size("K\x01", 0x85) + "\x8c\x01c\x94" + size("K\x01M\x00\x01", 0x86) + "\x8c\x01d\x94" + size("K\x01K\x02J\x00\x00\x00\x80", 0x87)), Options{}, 1, true},
		{"two records, keys got again", rec4(a+"K\x01"+b+size("K\x01", 0x85), "h\x09K\x02h\x0a"+size("K\x03", 0x85)), Options{}, 1, true},
		{"a key set twice", rec4(a + "K\x01" + a + "K\x02"), Options{}, 1, true},
		{"a key got again in its record", rec4(a + "K\x01h\x09K\x02"), Options{}, 0, true},
		{"16 fields", rec4(strings.Repeat(a+"K\x01", recFields)), Options{}, 1, true},
		{"17 fields", rec4(strings.Repeat(a+"K\x01", recFields+1)), Options{}, 0, false},
		{"torch.Size of 4 ints", rec4(a + "h\x02(K\x01K\x02K\x03K\x04t\x94\x85\x94R\x94"), Options{}, 0, true},
		{"a torch.Size's tuple got again", rec4(a+size("K\x01", 0x85), b+"h\x0a"), Options{}, 0, true},
		{"a frame inside", rec4(a + "\x95\x01\x00\x00\x00\x00\x00\x00\x00K\x01"), Options{}, 0, true},
		{"a value not memoized", rec4(a + "\x8c\x02hi"), Options{}, 0, true},
		{"a tuple not memoized", rec4(a + "h\x02K\x01\x85\x85\x94R\x94"), Options{}, 0, true},
		{"SETITEM", rec4(a + "K\x01s"), Options{}, 0, false},
		{"a float", rec4(a + "G\x3f\xf0\x00\x00\x00\x00\x00\x00"), Options{}, 0, false},
		{"a big LONG1", rec4(a + "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"), Options{}, 0, false},
		{"a call of an int", rec4(a + "K\x01K\x01\x85\x94\x85\x94R\x94"), Options{}, 0, false},
		{"a get of an entry not put", rec4(a + "h\x30"), Options{}, 0, false},
		// The second record is read at its class's BINGET, and what follows
		// it there too, as the loop would read it.
		{"a get of an entry not put, after records", strings.TrimSuffix(rec4(a+"K\x01", "h\x09K\x02"), "e.") + "h\x7fe.", Options{}, 1, true},
		{"a call of an int, after records", strings.TrimSuffix(rec4(a+"K\x01", "h\x09K\x02"), "e.") + "K\x05\x94h\x0d)\x81e.", Options{}, 1, true},
		{"truncated", rec4(a + "K\x01")[:44], Options{}, 0, false},
		// MaxMemo counts the entries kept: with a sink, those gotten again.
		{"memo past the limit, none got again", rec4(a + "K\x01"), Options{MaxMemo: 1}, 1, true},
		{"memo gets at the limit", rec4(a+size("K\x01", 0x85), b+"K\x02"), Options{MaxMemo: 2}, 2, true},
		{"memo gets past the limit", rec4(a+size("K\x01", 0x85), b+"K\x02"), Options{MaxMemo: 1}, 0, false},
		{"items short", rec4(a + "K\x01"), Options{MaxItems: 3}, 1, false},
		{"a long string", rec4(a + "\x8c\x05abcde\x94"), Options{MaxStringLen: 4}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fastRecords = 0
			s := checkRecords(t, []byte(tc.in), tc.opts, "C")
			assert.Equal(t, tc.record, s.records > 0, "taken as a record")
			assert.Equal(t, tc.fast, fastRecords, "read by the fast path")
		})
	}
}

// checkFast reads the record again with recordState and panics where it
// leaves the recorder otherwise than the fast path did.
func (d *decoder) checkFast(start int, cost int64, build int) {
	r := d.rec
	type field struct {
		name  string
		kind  rkind
		sh    bool
		w     int64
		dep   int32
		i     int64
		ints  string
		boxed any
	}
	snap := func() (out []field) {
		for _, f := range r.fields {
			x := field{name: f.name, kind: f.v.kind, sh: f.v.shared, w: f.v.w, dep: f.v.d}
			switch f.v.kind {
			case rInt:
				x.i = f.v.i
			case rTuple, rCall:
				x.ints = fmt.Sprint(r.ints[f.v.i : f.v.i+int64(f.v.n)])
			}
			switch f.v.kind {
			case rStr, rCall:
				x.boxed = r.boxes[f.v.box]
			}
			out = append(out, x)
		}
		return out
	}
	fast, p, puts, fcost := snap(), r.p, r.puts, r.cost
	r.p, r.cost, r.puts, r.list = start, cost, 0, -1
	r.vals, r.marks = append(r.vals[:0], rval{kind: rObj}), r.marks[:0]
	r.fields, r.ints = r.fields[:0], r.ints[:0]
	clear(r.boxes)
	r.boxes = r.boxes[:0]
	b, ok := d.recordState()
	if !ok || b != build || r.p != p || r.puts != puts || r.cost != fcost || len(r.kept) != 0 || len(r.placed) != 0 ||
		!reflect.DeepEqual(snap(), fast) {
		panic(fmt.Sprintf("pickle: record at %d: fast path %v %d %d %d %d %+v, recordState %v %d %d %d %d %+v",
			start, true, build, p, puts, fcost, fast, ok, b, r.p, r.puts, r.cost, snap()))
	}
}
