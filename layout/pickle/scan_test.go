package pickle

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Every scan of this package's tests that the segments give is compared
// with the scan in one pass, and counted.
func init() {
	scanCheck = func(data []byte, opts Options, got *refs) {
		joined++
		if want := scanOnce(data, opts); !sameRefs(want, got) {
			panic(fmt.Sprintf("the segments' scan of %q differs from the scan in one pass", data[:min(len(data), 64)]))
		}
	}
}

var joined int

func sameRefs(a, b *refs) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.bits, b.bits) && slices.Equal(a.rank, b.rank) && len(a.kept) == len(b.kept)
}

// splitScans makes every scan of a framed pickle of two frames or more
// run in segments while the test runs.
func splitScans(t testing.TB) {
	old := scanSplitMin
	scanSplitMin = 1
	t.Cleanup(func() { scanSplitMin = old })
}

// reframe writes data's opcodes again in frames of about size bytes (a
// frame ends at the first opcode boundary past size), as CPython frames
// protocol 4: PROTO, then FRAMEs. Frames data had are dropped; data that
// does not parse is returned as it was.
func reframe(data []byte, size int) []byte {
	var ops [][]byte
	pos := 0
	for pos < len(data) {
		start := pos
		op := data[pos]
		k := scanKinds[op]
		pos++
		w := int(k.width)
		if k.kind == scanBad && op != opSTOP || w > len(data)-pos {
			return data
		}
		var n uint64
		for i := w - 1; i >= 0; i-- {
			n = n<<8 | uint64(data[pos+i])
		}
		pos += w
		switch k.kind {
		case scanCounted:
			if n > uint64(len(data)-pos) {
				return data
			}
			pos += int(n)
		case scanFloat:
			pos += 8
		case scanGlobal:
			for range 2 {
				i := slices.Index(data[pos:], '\n')
				if i < 0 {
					return data
				}
				pos += i + 1
			}
		}
		if pos > len(data) {
			return data
		}
		if op != opFRAME && op != opPROTO {
			ops = append(ops, data[start:pos])
		}
		if op == opSTOP {
			break
		}
	}
	out := []byte{opPROTO, 4}
	for len(ops) > 0 {
		var frame []byte
		for len(ops) > 0 && len(frame) < size {
			frame = append(frame, ops[0]...)
			ops = ops[1:]
		}
		out = append(out, opFRAME)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(frame)))
		out = append(out, frame...)
	}
	return out
}

// frames are a pickle written frame by frame (each a string of opcodes).
func frames(fs ...string) []byte {
	out := []byte{opPROTO, 4}
	for _, f := range fs {
		out = append(out, opFRAME)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(f)))
		out = append(out, f...)
	}
	return out
}

// Framed in small frames, every seed scans in segments to what it scans
// to in one pass (scanCheck), and decodes with a sink as without.
func TestScanSegments(t *testing.T) {
	splitScans(t)
	before := joined
	for _, b := range sinkSeeds(t) {
		for _, size := range []int{1, 7, 64} {
			f := reframe(b, size)
			scanRefs(f, Options{}.withDefaults())
			checkPruned(t, f, Options{PersistentLoad: func(pid any) (any, error) { return pid, nil }})
		}
	}
	assert.Greater(t, joined-before, 20, "scans the segments gave")
}

// What the segments cannot tell from the scan in one pass is scanned again
// in one pass; what they can, they give.
func TestScanSegmentsHostile(t *testing.T) {
	opts := Options{}.withDefaults()
	// ["a", "a"]: "a" put at 1, got again in the second segment.
	got := "\x8c\x01a\x94h\x01"
	for _, tc := range []struct {
		name   string
		data   []byte
		starts []int
		ok     bool
	}{
		{"a get across the segments", frames("]\x94(", got, "e."), nil, true},
		{"the get in the first segment", frames("]\x94("+got, "e."), nil, true},
		{"an opcode across the boundary", frames("]\x94(\x8c\x01a\x94h\x01e."), []int{0, 15}, false},
		{"a segment from inside a str", frames("]\x94(\x8c\x02NN\x94h\x01e."), []int{0, 16}, false},
		{"a frame longer than the pickle", append(frames("]\x94("), opFRAME, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '.'), nil, true},
		{"a get of an entry not put yet", frames("]\x94(", "h\x02\x8c\x01a\x94\x8c\x01b\x94", "e."), nil, false},
		{"a get of an entry put later, far", frames("]\x94(", "j\xff\xff\x00\x00\x8c\x01a\x94", "e."), nil, true},
		{"a BINPUT in order", frames("]q\x00(", "\x8c\x01aq\x01h\x01", "e."), nil, true},
		{"a BINPUT out of order", frames("]q\x00(", "\x8c\x01aq\x05h\x05", "e."), nil, false},
		{"STOP, then anything", frames("N.", "\xff\xff"), nil, true},
		{"no STOP", frames("N", "N"), nil, false},
		{"an opcode the VM does not run", frames("N", "\xff."), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			starts := tc.starts
			if starts == nil {
				starts = frameStarts(tc.data, 8)
			}
			require.Greater(t, len(starts), 1)
			r, ok := scanSegments(tc.data, starts, opts)
			assert.Equal(t, tc.ok, ok)
			if ok {
				assert.True(t, sameRefs(scanOnce(tc.data, opts), r))
			}
			splitScans(t)
			assert.True(t, sameRefs(scanOnce(tc.data, opts), scanRefs(tc.data, opts)))
		})
	}
}

// frameStarts splits at frames only, the first one at or after each
// part's share, and stops at a frame length past the end.
func TestFrameStarts(t *testing.T) {
	b := frames(strings.Repeat("N", 10), strings.Repeat("N", 10), strings.Repeat("N", 10), "N.")
	assert.Equal(t, []int{0, 40, 59}, frameStarts(b, 3)) // frames at 2, 21, 40, 59 of 70 bytes
	assert.Equal(t, []int{0, 40}, frameStarts(b, 2))
	assert.Equal(t, []int{0}, frameStarts(b, 1))
	assert.Equal(t, []int{0}, frameStarts([]byte("\x80\x02N."), 4))
	cut := slices.Clone(b)
	binary.LittleEndian.PutUint64(cut[3:], 1<<62) // the first frame's length
	assert.Equal(t, []int{0}, frameStarts(cut, 4))
}

// A segment scanned on another goroutine of a mapped file cut short
// faults as the caller would (a panic with its SetPanicOnFault), not a
// crash of the process; the segments then say nothing, and no goroutine is
// left running.
func TestScanSegmentsFault(t *testing.T) {
	page := os.Getpagesize()
	first := "]\x94(" + strings.Repeat("N", page-2-9-3-1) + "e" // ends at the page's end
	data := frames(first, "]\x94("+strings.Repeat("N", page)+"e.")
	require.Equal(t, byte('e'), data[page-1])
	p := filepath.Join(t.TempDir(), "p.pkl")
	require.NoError(t, os.WriteFile(p, data, 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(b)
	require.NoError(t, os.Truncate(p, int64(page)))

	n := runtime.NumGoroutine()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	r, ok := scanSegments(b, []int{0, page}, Options{}.withDefaults())
	assert.False(t, ok)
	assert.Nil(t, r)
	// In one pass, the fault is this goroutine's.
	assert.Panics(t, func() { scanOnce(b, Options{}.withDefaults()) })
	noneLeft(t, n)
}

// noneLeft waits until no more than n goroutines run (those of a scan
// are gone once it returns; the runtime may take a moment to count them).
func noneLeft(t *testing.T, n int) {
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > n; time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "%d goroutines, %d before", runtime.NumGoroutine(), n)
	}
}

// Scans in segments leave no goroutine behind.
func TestScanSegmentsLeaveNoGoroutine(t *testing.T) {
	splitScans(t)
	data := reframe([]byte(rec4(strings.Repeat("\x8c\x01a\x94K\x01", 3), "h\x0aK\x02")), 3)
	n := runtime.NumGoroutine()
	for range 100 {
		require.NotNil(t, scanRefs(data, Options{}.withDefaults()))
	}
	noneLeft(t, n)
}

// FuzzScanSegments: segments starting anywhere give the scan in one pass,
// or nothing.
func FuzzScanSegments(f *testing.F) {
	for _, b := range sinkSeeds(f) {
		f.Add(b, uint16(len(b)/3), uint16(len(b)/2))
		f.Add(reframe(b, 5), uint16(11), uint16(20))
	}
	opts := Options{MaxMemo: 1 << 12}.withDefaults()
	f.Fuzz(func(t *testing.T, data []byte, a, b uint16) {
		if len(data) == 0 {
			return
		}
		starts := []int{0, int(a) % len(data), int(b) % len(data)}
		slices.Sort(starts)
		starts = slices.Compact(starts)
		r, ok := scanSegments(data, starts, opts)
		if ok {
			require.True(t, sameRefs(scanOnce(data, opts), r))
		}
	})
}
