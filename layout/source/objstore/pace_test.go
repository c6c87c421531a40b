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
