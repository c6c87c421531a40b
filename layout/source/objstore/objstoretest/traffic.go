package objstoretest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// RunTraffic checks what reading objects costs a store reached through p,
// counted by the proxy: a view's reads of several objects in turn, in 1 MiB
// reads, with streams (objstore.Limits.MinRequest), are one listing of the
// prefix at open (it answers the directory too) and one ranged, pinned GET per
// request's worth of each object, nothing else (no HEAD, no metadata call
// per read), over as many connections as objects read at once; read one
// request at a time, an object's reads reuse one connection. put writes an
// object under the tree's prefix; open opens the tree.
func RunTraffic(t *testing.T, p *Proxy, put func(key string, data []byte) error, open func(objstore.Limits) (*objstore.Tree, error)) {
	const objects, size, req = 4, 16 << 20, 4 << 20
	data := make([][]byte, objects)
	for i := range data {
		data[i] = make([]byte, size)
		rand.NewChaCha8([32]byte{byte(i)}).Read(data[i])
		if err := put(fmt.Sprintf("shard%d", i), data[i]); err != nil {
			t.Fatal(err)
		}
	}
	// ListTTL: no second listing however slow the test runs.
	read := func(t *testing.T, l objstore.Limits, n int) (ranged, lists int) {
		t.Helper()
		p.Reset()
		l.ListTTL = time.Hour
		tree, err := open(l)
		require.NoError(t, err)
		defer tree.Close()
		files := make([]source.File, n)
		for i := range files {
			files[i], err = tree.Open(fmt.Sprintf("shard%d", i))
			require.NoError(t, err)
		}
		buf := make([]byte, 1<<20)
		for off := 0; off < size; off += len(buf) {
			for i, f := range files {
				k, err := f.ReadAt(buf, int64(off))
				require.NoError(t, err)
				require.True(t, bytes.Equal(data[i][off:off+k], buf), "%s at %d", f.Info().Name, off)
			}
		}
		// A stream's bytes are counted when its request ends, after readers
		// had them.
		require.Eventually(t, func() bool { return tree.Stats().BytesFetched >= int64(n*size) },
			30*time.Second, 10*time.Millisecond, "bytes counted as the requests end")
		require.Equal(t, int64(n*size), tree.Stats().BytesFetched, "bytes fetched")
		for _, r := range p.Requests() {
			switch {
			case r.Method == http.MethodGet && r.Range != "":
				ranged++
				assert.True(t, r.IfMatch != "" || strings.Contains(r.Query, "generation="), "a read not pinned to the version opened: %+v", r)
			case r.Method == http.MethodGet && (strings.Contains(r.Query, "comp=list") || strings.HasSuffix(r.Path, "/o")):
				lists++
			default:
				t.Errorf("a request that is neither a ranged read nor a listing: %+v", r)
			}
		}
		return ranged, lists
	}
	t.Run("streamed, objects in turn", func(t *testing.T) {
		ranged, lists := read(t, objstore.Limits{MinRequest: req, AheadMemory: objects * req}, objects)
		assert.Equal(t, objects*size/req, ranged, "ranged GETs: one per request's worth of each object")
		assert.Equal(t, 1, lists, "listings: the prefix at open, which answers the directory too")
		assert.LessOrEqual(t, p.Conns(), objects+1, "connections: one per object read at once, and the listings'")
	})
	t.Run("one read at a time", func(t *testing.T) {
		ranged, lists := read(t, objstore.Limits{}, 1)
		assert.Equal(t, size>>20, ranged, "ranged GETs: one per read")
		assert.Equal(t, 1, lists, "listings: the prefix at open")
		// One connection, reused: a few more when a request is sent before
		// the last one's connection is back in the pool; a new one per
		// request when bodies are left unread or connections closed.
		assert.LessOrEqual(t, p.Conns(), 4, "connections for %d requests one after another", ranged+lists)
	})
}

// BenchRanged measures ranged reads of objects through a tree against the
// store's SDK alone, reading the same objects in the same ranges, as many
// in flight (1 and 8: a view read, and the block cache's fills): what the
// tree adds to what the store and its SDK cost. put writes an object under
// the tree's prefix; get is the SDK's plain ranged read of the object at
// key (the prefix's); open opens the tree with every read its own request.
func BenchRanged(b *testing.B, put func(key string, data []byte) error,
	get func(ctx context.Context, key string, off, n int64) (io.ReadCloser, error), open func(objstore.Limits) (*objstore.Tree, error)) {
	const objects, size, req = 4, 64 << 20, 16 << 20
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{}).Read(data)
	for i := range objects {
		if err := put(fmt.Sprintf("shard%d", i), data); err != nil {
			b.Fatal(err)
		}
	}
	tree, err := open(objstore.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer tree.Close()
	files := make([]source.File, objects)
	for i := range files {
		if files[i], err = tree.Open(fmt.Sprintf("shard%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	type job struct{ obj, off int }
	run := func(b *testing.B, workers int, read func(buf []byte, j job) error) {
		b.SetBytes(objects * size)
		for b.Loop() {
			jobs := make(chan job)
			var wg sync.WaitGroup
			var failed atomic.Pointer[error]
			for range workers {
				wg.Go(func() {
					buf := make([]byte, req)
					for j := range jobs {
						if err := read(buf, j); err != nil {
							failed.CompareAndSwap(nil, &err)
						}
					}
				})
			}
			for off := 0; off < size; off += req {
				for i := range objects {
					jobs <- job{i, off}
				}
			}
			close(jobs)
			wg.Wait()
			if err := failed.Load(); err != nil {
				b.Fatal(*err)
			}
		}
	}
	for _, workers := range []int{1, 8} {
		b.Run(fmt.Sprintf("sdk/x%d", workers), func(b *testing.B) {
			run(b, workers, func(buf []byte, j job) error {
				r, err := get(context.Background(), fmt.Sprintf("shard%d", j.obj), int64(j.off), req)
				if err != nil {
					return err
				}
				defer r.Close()
				_, err = io.ReadFull(r, buf)
				return err
			})
		})
		b.Run(fmt.Sprintf("tree/x%d", workers), func(b *testing.B) {
			run(b, workers, func(buf []byte, j job) error {
				_, err := files[j.obj].ReadAt(buf, int64(j.off))
				return err
			})
		})
	}
}
