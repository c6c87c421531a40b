package cache

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readOrders are ways of reading every byte of a block of n bytes, as the
// spans each read takes, in order.
var readOrders = map[string]func(n int64, r *rand.Rand) []span{
	"forward in pages": func(n int64, _ *rand.Rand) []span { return pieces(n, 4096) },
	"reverse in 128 KiB reads": func(n int64, _ *rand.Rand) []span {
		p := pieces(n, 128<<10)
		for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
			p[i], p[j] = p[j], p[i]
		}
		return p
	},
	"interleaved: even pieces, then odd": func(n int64, _ *rand.Rand) []span {
		var even, odd []span
		for i, s := range pieces(n, 3*4096) {
			if i%2 == 0 {
				even = append(even, s)
			} else {
				odd = append(odd, s)
			}
		}
		return append(even, odd...)
	},
	"first half twice, then the rest": func(n int64, _ *rand.Rand) []span {
		half := pieces(n/2, 4096)
		return append(append(half, half...), span{n / 2, n})
	},
	"overlapping halves of pieces, shuffled": func(n int64, r *rand.Rand) []span {
		var p []span
		for off := int64(0); off < n; off += 2048 {
			p = append(p, span{off, min(off+4096, n)})
		}
		r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
		return p
	},
	"unaligned cuts, shuffled": unalignedCuts,
	"random reads over unaligned cuts, shuffled": func(n int64, r *rand.Rand) []span {
		p := unalignedCuts(n, r)
		for range len(p) {
			off := r.Int64N(n)
			if r.IntN(4) == 0 { // page-aligned, as through the page cache
				off &^= 4095
			}
			p = append(p, span{off, min(n, off+1+r.Int64N(20000))})
		}
		r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
		return p
	},
}

// unalignedCuts cuts [0, n) into reads of 1 to 5000 bytes, shuffled.
func unalignedCuts(n int64, r *rand.Rand) []span {
	var p []span
	for off := int64(0); off < n; {
		end := min(n, off+1+r.Int64N(5000))
		p = append(p, span{off, end})
		off = end
	}
	r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// pieces cuts [0, n) into reads of size bytes, the last one shorter.
func pieces(n, size int64) []span {
	var p []span
	for off := int64(0); off < n; off += size {
		p = append(p, span{off, min(off+size, n)})
	}
	return p
}

// byteSet is the oracle: a bit per byte.
type byteSet []uint64

// add sets the bits of [lo, hi) and returns how many were not set.
func (s byteSet) add(lo, hi int64) (newly int64) {
	for i := lo; i < hi; {
		k, upto := i/64, min(hi, (i/64+1)*64)
		m := ^uint64(0) << (i % 64)
		if upto%64 != 0 {
			m &= 1<<(upto%64) - 1
		}
		newly += int64(bits.OnesCount64(m &^ s[k]))
		s[k] |= m
		i = upto
	}
	return newly
}

// blockSizes are blocks of each granule, full and short (the last block of
// a file: a short last granule).
var blockSizes = []int64{1, 100, testBS, 3*4096 + 100, 256 << 10, 1<<20 + 4095, 16 << 20, 16<<20 - 5000}

// TestReadInFullExactly: whatever the order the reads take a block's bytes
// in (reverse, interleaved, overlapping, unaligned, read twice in part), the
// block is read in full (consumed) exactly once the last byte no read took is
// read, and that one read is told so. Counting the bytes read made a block
// whose first half was read twice read in full with its second half unread.
func TestReadInFullExactly(t *testing.T) {
	for name, order := range readOrders {
		for _, n := range blockSizes {
			t.Run(fmt.Sprintf("%s, %d bytes", name, n), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(n), 75))
				b := &block{data: make([]byte, n)}
				read := make(byteSet, (n+63)/64)
				left := n
				for i, s := range order(n, r) {
					left -= read.add(s.lo, s.hi)
					last := b.serve(s.lo, s.hi)
					if left == 0 && !b.consumed() || left > 0 && b.consumed() {
						t.Fatalf("after read %d [%d, %d): %d bytes never read, consumed() %v", i, s.lo, s.hi, left, b.consumed())
					}
					if last && left > 0 {
						t.Fatalf("read %d [%d, %d) told it read the block in full with %d bytes unread", i, s.lo, s.hi, left)
					}
					if left == 0 {
						require.True(t, last, "read %d [%d, %d) took the last unread byte and was not told", i, s.lo, s.hi)
						assert.False(t, b.serve(0, n), "a block read in full is not read in full again")
						return
					}
				}
				t.Fatalf("the order left %d bytes unread", left)
			})
		}
	}
}

// TestReadInFullErrsOnlyTowardsUnread: a granule read in more disjoint
// pieces than are kept (maxSpans) is not judged read in full once its
// bytes all were: the judgment errs only that way.
func TestReadInFullErrsOnlyTowardsUnread(t *testing.T) {
	const n = 16 << 20 // 4 KiB granules
	b := &block{data: make([]byte, n)}
	assert.False(t, b.serve(4096, n))
	for off := int64(0); off < 4096; off += 2 { // every other byte of granule 0
		assert.False(t, b.serve(off, off+1))
		assert.False(t, b.consumed())
	}
	for off := int64(1); off < 4096; off += 2 {
		assert.False(t, b.serve(off, off+1))
	}
	assert.False(t, b.consumed(), "too many pieces: judged read in part")
	assert.True(t, b.serve(0, 4096), "a read covering the granule whole counts")
	assert.True(t, b.consumed())
}

// TestReadInFullConcurrently: readers taking a block's bytes at once, in
// random pieces, each all of them: the block is read in full once they
// are done, and exactly one read was told it made it so.
func TestReadInFullConcurrently(t *testing.T) {
	for _, n := range []int64{testBS, 1<<20 + 4095, 16 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := &block{data: make([]byte, n)}
			var told atomic.Int32
			var wg sync.WaitGroup
			for g := range 6 {
				r := rand.New(rand.NewPCG(uint64(g), uint64(n)))
				order := unalignedCuts
				if g%2 == 0 {
					order = readOrders["reverse in 128 KiB reads"]
				}
				p := order(n, r)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, s := range p {
						if b.serve(s.lo, s.hi) {
							told.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			assert.True(t, b.consumed())
			assert.EqualValues(t, 1, told.Load(), "reads told they read the block in full")
		})
	}
}

// TestStagingKeepsBlocksReadTwiceInPart: in the staging ring, a block whose
// first half was read twice is not let go as read in full, neither by
// spillRead (a stream's fill taking a read block's buffer) nor before an
// unread block used less recently (evictLocked); a block read in full is.
func TestStagingKeepsBlocksReadTwiceInPart(t *testing.T) {
	blk := func(idx int64) *block {
		b := &block{id: 1, idx: idx, data: make([]byte, testBS)}
		b.refs.Store(1)
		return b
	}
	s := newStaging(2)
	s.limit = 8
	s.acct = &buffers{size: testBS, limit: 8 * testBS} // spillRead hands blocks to the cache
	defer s.clear()
	unread, twice, read := blk(1), blk(2), blk(3)
	for _, b := range []*block{unread, twice, read} {
		s.put(b, nil)
	}
	s.put(blk(4), nil)
	s.touch(twice) // unread is now the least recently used
	for range 2 {
		assert.False(t, twice.serve(0, testBS/4))
		assert.False(t, twice.serve(testBS/4, testBS/2))
	}
	assert.True(t, read.serve(0, testBS))
	require.False(t, twice.consumed(), "half of it read twice")

	got := s.spillRead(1)
	require.NotNil(t, got)
	assert.Equal(t, read.idx, got.idx, "spillRead gives up the block read in full")
	got.release()
	assert.Nil(t, s.spillRead(1), "and no other: none is read in full")

	got = s.evictLocked()
	assert.Equal(t, unread.idx, got.idx, "the least recently used block leaves first")
	got.release()
	assert.NotNil(t, s.get(1, twice.idx), "the block read twice in part stays")
}

// TestBlocksReadTwiceInPartStay: a cache-level run of the defect: the first
// half of each of 10 blocks is read by two handles (each byte of it twice),
// then 30 other blocks of the file in full (more than the cache holds), then
// the other halves: every block is fetched once. Counted in bytes, the 10
// blocks were read in full after the first halves: reuseRead and the ring
// let them go first, and their second halves fetched them again.
func TestBlocksReadTwiceInPartStay(t *testing.T) {
	const blocks, partly = 40, 10
	size := int64(blocks) * testBS
	src := &slowSource{memSource: newMemSource(size, 75), delay: 50 * time.Microsecond}
	c := newTestCache(t, objectStoreOptions())
	h, h2 := c.Open(1, src, size), c.Open(1, src, size)
	defer h.Close()
	defer h2.Close()
	const piece = testBS / 8
	half := func(h *Handle, from, to int64) {
		for b := range int64(partly) {
			b = partly - 1 - b // last block first: read-ahead stays out of it
			for p := from; p < to; p++ {
				checkRead(t, h, src.data, b*testBS+p*piece, piece)
			}
		}
	}
	half(h, 0, 4)
	half(h2, 0, 4)
	for b := range int64(partly) {
		assert.False(t, h.wasReadFull(b) || h2.wasReadFull(b), "block %d: half of it read twice", b)
	}
	for off := int64(partly) * testBS; off < size; off += piece {
		checkRead(t, h, src.data, off, piece)
	}
	half(h, 4, 8)
	c.Wait()
	for b := range int64(partly) {
		assert.True(t, h.wasReadFull(b), "block %d: the read of its last bytes made it read in full", b)
	}
	st := c.Stats()
	assert.Empty(t, src.fetchedTwice(), "blocks fetched more than once; stats %+v", st)
	assert.EqualValues(t, blocks, st.Fills)
}

// BenchmarkServe is the cost of recording one FUSE read (128 KiB, through
// the page cache: whole granules) of 16 MiB blocks, each read once in
// order, and beside it the parent's count of bytes (one atomic add).
func BenchmarkServe(b *testing.B) {
	const n, req = 16 << 20, 128 << 10
	b.Run("granules", func(b *testing.B) {
		blk := &block{data: make([]byte, n)}
		for i := range b.N {
			off := int64(i%(n/req)) * req
			if off == 0 {
				blk = &block{data: blk.data}
			}
			blk.serve(off, off+req)
		}
	})
	b.Run("granules, a block read again, in parallel", func(b *testing.B) {
		blk := &block{data: make([]byte, n)}
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				off := next.Add(req) % n
				blk.serve(off, off+req)
			}
		})
	})
	b.Run("bytes counted (the parent)", func(b *testing.B) {
		var served atomic.Int64
		for range b.N {
			served.Add(req)
		}
	})
}

// FuzzReadInFull: any block length and reads at any offsets: a block is
// never read in full with a byte unread, the read that made it so is told
// once, and with no more reads than a granule keeps pieces (maxSpans), it
// is read in full as soon as every byte was read.
func FuzzReadInFull(f *testing.F) {
	f.Add(uint32(100), []byte{0, 0, 50, 0, 25, 0, 50, 0, 49, 0, 51, 0})
	f.Add(uint32(16<<20-5000), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(uint32(3*4096+100), []byte{255, 255, 255, 255, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, size uint32, reads []byte) {
		n := 1 + int64(size)%(32<<20)
		var s servedSet // of a block of n bytes (the block itself is not needed)
		read := make(byteSet, (n+63)/64)
		left, told := n, 0
		for i := 0; i+4 <= len(reads); i += 4 {
			// Offsets from the start or back from the end, lengths up to 64 KiB.
			off := int64(uint32(reads[i])|uint32(reads[i+1])<<8) * 97 % n
			if reads[i]&1 != 0 {
				off = n - 1 - off
			}
			end := min(n, off+1+int64(uint32(reads[i+2])|uint32(reads[i+3])<<8))
			left -= read.add(off, end)
			if s.add(off, end, n) {
				told++
			}
			if s.full(n) && left > 0 {
				t.Fatalf("read in full with %d bytes unread", left)
			}
			if left == 0 && i/4 < maxSpans && !s.full(n) {
				t.Fatalf("every byte read in %d reads and not read in full", i/4+1)
			}
		}
		if told > 1 || (told == 1) != s.full(n) {
			t.Fatalf("%d reads told they read the block in full; consumed %v", told, s.full(n))
		}
	})
}
