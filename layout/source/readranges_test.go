package source

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestReadRangesDropOnlyWhatWasRead(t *testing.T) {
	const M = 1 << 20
	const folio = 2 * M
	type read struct{ start, end, lo, hi int64 }
	for _, tc := range []struct {
		name  string
		size  int64
		reads []read
	}{
		{"in order: each drop reaches back to the folio the read before ended in", 16 * M, []read{
			{0, 3 * M, 0, 3 * M},
			{3 * M, 6 * M, 2 * M, 6 * M},
			{6 * M, 9 * M, 6 * M, 9 * M},
		}},
		{"out of order: never over bytes not read yet", 16 * M, []read{
			{5 * M, 7 * M, 5 * M, 7 * M},
			{1 * M, 3 * M, 1 * M, 3 * M}, // [0, 1 MiB) and [3, 5 MiB) not read
		}},
		{"the hole read last drops the folios around it", 16 * M, []read{
			{0, 3 * M, 0, 3 * M},
			{5 * M, 9 * M, 5 * M, 9 * M},
			{3 * M, 5 * M, 2 * M, 6 * M},
		}},
		{"a gap under 64 KiB counts as read (record headers)", 16 * M, []read{
			{0, 3 * M, 0, 3 * M},
			{3*M + 1000, 5 * M, 2 * M, 5 * M},
		}},
		{"a gap of 64 KiB does not", 16 * M, []read{
			{0, 3 * M, 0, 3 * M},
			{3*M + 64<<10, 5 * M, 3*M + 64<<10, 5 * M},
		}},
		{"the start and the end of the file count as read", 5*M + 100, []read{
			{1000, 3 * M, 0, 3 * M},
			{3 * M, 5 * M, 2 * M, 6 * M},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r readRanges
			for i, rd := range tc.reads {
				lo, hi := r.add(rd.start, rd.end, tc.size, folio)
				assert.Equal(t, [2]int64{rd.lo, rd.hi}, [2]int64{lo, hi}, "read %d [%d, %d)", i, rd.start, rd.end)
			}
		})
	}
}

// A file read in a scattered order keeps at most maxRuns runs; past that,
// a drop is the bytes read.
func TestReadRangesBounded(t *testing.T) {
	var r readRanges
	const step = 1 << 20
	for i := int64(0); i < 2*maxRuns; i++ {
		start := i * 2 * step // never adjacent
		lo, hi := r.add(start+step/4, start+step/2, 1<<40, 2*step)
		if i >= maxRuns {
			assert.Equal(t, [2]int64{start + step/4, start + step/2}, [2]int64{lo, hi})
		}
	}
	assert.LessOrEqual(t, len(r.runs), maxRuns)
}

// Drops are batched: touching ranges merge until dropBatch, readers at
// different places keep their own ranges, and the oldest goes when too many
// wait; flush returns the rest.
func TestPendingDrops(t *testing.T) {
	const mib = 1 << 20
	var p pendingDrops
	var dropped []span
	for i := int64(0); i < 20; i++ { // one reader, in order
		dropped = append(dropped, p.add(i*mib, (i+1)*mib)...)
	}
	assert.Equal(t, []span{{0, 16 * mib}}, dropped)
	assert.Equal(t, []span{{16 * mib, 20 * mib}}, p.flush())
	assert.Empty(t, p.flush())

	// two readers, interleaved: each one's range grows on its own
	for i := int64(0); i < 4; i++ {
		assert.Empty(t, p.add(i*mib, (i+1)*mib))
		assert.Empty(t, p.add(100*mib+i*mib, 100*mib+(i+1)*mib))
	}
	assert.Equal(t, []span{{0, 4 * mib}, {100 * mib, 104 * mib}}, p.flush())

	// more separate ranges than are kept: the oldest is dropped
	for i := int64(0); i < maxPending; i++ {
		assert.Empty(t, p.add(i*10*mib, i*10*mib+mib))
	}
	assert.Equal(t, []span{{0, mib}}, p.add(500*mib, 501*mib))
	assert.Len(t, p.flush(), maxPending)

	// a range that bridges two waiting ones merges all three
	p.add(0, mib)
	p.add(2*mib, 3*mib)
	p.add(mib, 2*mib)
	assert.Equal(t, []span{{0, 3 * mib}}, p.flush())
}
