package objstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// shardsStore is the shard objects of a checkpoint in memory, "p/0" ...,
// their reads counted and each answered after delay.
type shardsStore struct {
	objs  map[string][]byte
	delay time.Duration
	count *Counters
}

func (s *shardsStore) Head(_ context.Context, key string) (Object, error) {
	s.count.Requests.Add(1)
	if d, ok := s.objs[key]; ok {
		return Object{Key: key, Size: int64(len(d)), Version: "v1"}, nil
	}
	return Object{}, ErrNotFound
}

func (s *shardsStore) List(_ context.Context, prefix string, _ bool, _ int, _ string) (Page, error) {
	s.count.Requests.Add(1)
	var p Page
	for k := range len(s.objs) {
		key := fmt.Sprintf("p/%d", k)
		p.Objects = append(p.Objects, Object{Key: key, Size: int64(len(s.objs[key])), Version: "v1"})
	}
	return p, nil
}

func (s *shardsStore) Read(_ context.Context, obj Object, w io.Writer, off, n int64) (int64, error) {
	s.count.Requests.Add(1)
	time.Sleep(s.delay)
	return CopyBody(w, bytes.NewReader(s.objs[obj.Key][off:off+n]), n)
}

// TestAheadStateDictOrderFetchesEachByteOnce replays the reads a loader
// that faults tensors in its state dict's order makes of a DCP
// checkpoint's shard objects (from_pretrained through mmap): each tensor
// is a part in each of 4 objects, the view's blocks over it are filled a
// few at once, and the tensors come in an order that jumps back and
// forth in every object (issue 36). Each byte is fetched about once: a
// stream does not read far ahead of a reader that left it, nor fetch what
// reads were already given. (The parent read its share of memory ahead of
// each jump, dropped it unread when memory ran short, and streamed over
// plain reads' bytes: 1.05-1.51x in three runs.)
func TestAheadStateDictOrderFetchesEachByteOnce(t *testing.T) {
	const (
		objects, block, req, memory = 4, 1 << 20, 8 << 20, 16 << 20
		fills                       = 4 // blocks filled at once
	)
	// Tensor parts in each object, in file order (MiB), and the order a
	// loader reads them in: the large embedding and head at the ends of
	// the file, read first and last, the layers' in between out of order.
	sizes := []float64{6, 0.01, 2.5, 4, 4, 4, 2.5, 0.01, 1, 1, 1, 6}
	order := []int{0, 8, 10, 3, 9, 2, 5, 1, 4, 6, 7, 11}
	var offs []int64
	var size int64
	for _, m := range sizes {
		offs = append(offs, size)
		size += int64(m * (1 << 20))
	}
	st := &shardsStore{objs: map[string][]byte{}, delay: 2 * time.Millisecond, count: new(Counters)}
	pattern := make([]byte, 1<<20+7) // a prime length: no two places of an object alike
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>13)
	}
	for k := range objects {
		d := make([]byte, size)
		for at := 0; at < len(d); at += len(pattern) {
			copy(d[at:], pattern[k*31:])
			copy(d[min(len(d), at+len(pattern)-k*31):], pattern[:k*31])
		}
		st.objs[fmt.Sprintf("p/%d", k)] = d
	}
	tree, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "p"}, st,
		Limits{MinRequest: req, AheadMemory: memory}, st.count)
	require.NoError(t, err)
	defer tree.Close()
	files := make([]source.File, objects)
	for k := range files {
		files[k], err = tree.Open(fmt.Sprint(k))
		require.NoError(t, err)
	}

	type read struct {
		obj      int
		off, end int64
	}
	reads := make(chan read)
	var wg sync.WaitGroup
	for range fills {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range reads {
				p := make([]byte, r.end-r.off)
				_, err := files[r.obj].ReadAt(p, r.off)
				assert.NoError(t, err)
				assert.True(t, bytes.Equal(st.objs[fmt.Sprintf("p/%d", r.obj)][r.off:r.end], p), "object %d at %d", r.obj, r.off)
			}
		}()
	}
	for _, i := range order {
		end := offs[i] + int64(sizes[i]*(1<<20))
		for k := range objects {
			for off := offs[i]; off < end; off += block {
				reads <- read{k, off, min(end, off+block)}
			}
		}
	}
	close(reads)
	wg.Wait()
	checkHeld(t, tree.ahead)
	fetched, total := st.count.Bytes.Load(), int64(objects)*size
	t.Logf("fetched %.3fx, %d requests", float64(fetched)/float64(total), st.count.Requests.Load())
	assert.LessOrEqual(t, float64(fetched), 1.05*float64(total), "bytes fetched")
}

// pausedAt waits until the stream of f that starts at 0 waits for its
// readers with its body read to arrived; it returns the body's bytes the
// store delivered.
func pausedAt(t *testing.T, tree *Tree, m *memStore, f source.File, arrived int64) int64 {
	t.Helper()
	require.Eventually(t, func() bool {
		tree.ahead.mu.Lock()
		defer tree.ahead.mu.Unlock()
		for _, s := range f.(*file).streams {
			if s.start == 0 {
				return s.paused && s.arrived == arrived
			}
		}
		return false
	}, 30*time.Second, time.Millisecond, "the stream paused at %d", arrived)
	return m.gate.delivered.Load()
}

// Fills that come ahead of a stream's body (the block cache's read-ahead:
// two at once, one past the frontier) stop its read-ahead: the body stays
// in the connection until the next fill lends it its buffer, and no byte
// goes through a piece. A lone reader that lends at the frontier, one read
// at a time, keeps the read-ahead.
func TestAheadFillsAheadOfTheBodyStopItsReadAhead(t *testing.T) {
	const size, req, block = 16 << 20, 16 << 20, 1 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	m.gate = newGate()
	p0, p1 := make([]byte, block), make([]byte, block)
	d0 := readAsync(f, p0, 0)
	waitLends(t, tree, f, 1)
	d1 := readAsync(f, p1, block) // past the frontier, beside the first
	waitLends(t, tree, f, 2)
	m.gate.openTo(size)
	require.NoError(t, <-d0)
	require.NoError(t, <-d1)
	require.Equal(t, m.data[:2*block], append(p0, p1...))
	assert.Equal(t, int64(2*block), pausedAt(t, tree, m, f, 2*block), "body read past the fills waiting")
	// Its request still runs: the bytes it read are counted as they came.
	assert.Equal(t, int64(2*block), m.count.Bytes.Load(), "bytes fetched while the stream waits")
	// The next fills, one at a time: each lends, none copies.
	for off := int64(2 * block); off < 6*block; off += block {
		_, err := f.ReadAt(p0, off)
		require.NoError(t, err)
		require.Equal(t, m.data[off:off+block], p0, "at %d", off)
		assert.Equal(t, off+block, pausedAt(t, tree, m, f, off+block), "body read past the fill at %d", off)
	}
	a := tree.ahead
	assert.Equal(t, int64(6*block), a.lentBytes.Load(), "bytes read straight into the fills' buffers")
	assert.Zero(t, a.copiedBytes.Load(), "bytes copied out of pieces")
	a.mu.Lock()
	assert.Zero(t, a.used+a.freeN, "piece buffers taken")
	a.mu.Unlock()
	assert.Equal(t, int64(1), m.count.Requests.Load())

	// A lone reader: the same first read, alone, then the body goes on
	// ahead of it (aheadFirst).
	tree, m, f = aheadTree(t, size, req, 4*req)
	m.gate = newGate()
	d0 = readAsync(f, p0, 0)
	waitLends(t, tree, f, 1)
	m.gate.openTo(size)
	require.NoError(t, <-d0)
	require.Equal(t, m.data[:block], p0)
	assert.Equal(t, int64(block+aheadFirst), pausedAt(t, tree, m, f, block+aheadFirst), "a lone reader's read-ahead")
	_, err := f.ReadAt(p0, block)
	require.NoError(t, err)
	require.Equal(t, m.data[block:2*block], p0)
	assert.Equal(t, int64(block), tree.ahead.copiedBytes.Load(), "its next read, from a piece")
}
