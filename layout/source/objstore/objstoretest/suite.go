package objstoretest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Store is a running server of one store for the suite with an empty
// bucket of its own.
type Store interface {
	// URL is the tree URL of prefix in the bucket: "gs://bucket/prefix".
	URL(prefix string) string
	// Put writes an object; Delete removes one.
	Put(key string, data []byte) error
	Delete(key string) error
	// Open opens the tree at url as the store's package does.
	Open(url string, l objstore.Limits) (*objstore.Tree, error)
	// Process is the server, to kill or freeze.
	Process() *Process
	// Proxy starts a proxy in front of the server, which the trees opened
	// from now on in t reach it through (Put and Delete do not).
	Proxy(t *testing.T) *Proxy
}

// Run runs the cases every store passes: listings as directories, hostile
// keys confined, byte-exact ranged reads, an object read in order in few
// requests (streams), a replaced or deleted object
// failing with ErrChanged and never its new bytes, a missing name ENOENT,
// a denied read or lookup failing as denied (not as an outage), a burst of
// 5xx shorter than the attempts retried through, and a body that trickles
// or a killed or frozen server failing a read with EIO within the bound.
// start makes an empty bucket on a server the cases share, or, when own is
// set, on a server of its own (which the case kills or freezes).
func Run(t *testing.T, start func(t *testing.T, own bool) Store) {
	t.Run("listing and confinement", func(t *testing.T) {
		s := start(t, false)
		for key, data := range map[string]string{
			"secret":                  "outside",
			"run-other/x":             "outside",
			"run/a.json":              `{"a":1}`,
			"run/step_1/.metadata":    "meta",
			"run/step_1/__0_0.distcp": "shard0",
			"run/step_1/sub/deep":     "deep",
			"run/both":                "an object",
		} {
			put(t, s, key, []byte(data))
		}
		// An object that is also a prefix: a store over a file system
		// (versitygw's posix backend) refuses the second key.
		putMaybe(t, s, "run/both/child", []byte("and a prefix"))
		// Keys no name can reach: a store may refuse some of them; those
		// it keeps must not show.
		for _, key := range []string{"run/../secret", "run//empty-segment", "run/./dot"} {
			putMaybe(t, s, key, []byte("hostile"))
		}
		// A directory marker is empty (a store may refuse one with data).
		putMaybe(t, s, "run/marker/", nil)
		tree, err := s.Open(s.URL("run"), objstore.Limits{})
		require.NoError(t, err)
		defer tree.Close()
		ents, err := tree.ReadDir(".")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"a.json": "file", "step_1": "dir", "both": "file", "marker": "dir"}, names(ents))
		ents, err = tree.ReadDir("step_1")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{".metadata": "file", "__0_0.distcp": "file", "sub": "dir"}, names(ents))
		ents, err = tree.ReadDir("marker")
		require.NoError(t, err)
		assert.Empty(t, ents, "a directory marker object is no file")
		assert.Equal(t, "shard0", string(readAll(t, tree, "step_1/__0_0.distcp")))
		for _, name := range []string{"../secret", "/secret", "step_1/../../secret", "..", "../run-other/x"} {
			_, err := tree.Open(name)
			assert.Error(t, err, name)
			_, err = tree.Stat(name)
			assert.Error(t, err, name)
		}
		info, err := tree.Stat("step_1")
		require.NoError(t, err)
		assert.True(t, info.IsDir())
	})

	t.Run("ranged reads byte-exact", func(t *testing.T) {
		s := start(t, false)
		data := make([]byte, 3<<20+17)
		for i := range data {
			data[i] = byte(rand.N(256))
		}
		put(t, s, "ckpt/shard", data)
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{})
		require.NoError(t, err)
		defer tree.Close()
		f, err := tree.Open("shard")
		require.NoError(t, err)
		require.Equal(t, int64(len(data)), f.Info().Size)
		for _, r := range [][2]int{{0, 8}, {100, 16 << 10}, {65530, 20}, {1 << 20, 1 << 20}, {len(data) - 5, 5}, {0, len(data)}} {
			buf := make([]byte, r[1])
			n, err := f.ReadAt(buf, int64(r[0]))
			require.NoError(t, err, r)
			require.Equal(t, r[1], n)
			require.True(t, bytes.Equal(data[r[0]:r[0]+r[1]], buf), "bytes %v", r)
		}
		n, err := f.ReadAt(make([]byte, 10), int64(len(data)-3))
		assert.Equal(t, 3, n)
		assert.Error(t, err, "EOF past the end")
		assert.Greater(t, tree.Stats().Requests, int64(0))
	})

	for _, tc := range []struct {
		name   string
		change func(t *testing.T, s Store)
	}{
		{"replaced mid-read", func(t *testing.T, s Store) { put(t, s, "ckpt/shard", bytes.Repeat([]byte("new!"), 64<<10)) }},
		{"deleted mid-read", func(t *testing.T, s Store) { require.NoError(t, s.Delete("ckpt/shard")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, false)
			old := bytes.Repeat([]byte("old!"), 64<<10)
			put(t, s, "ckpt/shard", old)
			tree, err := s.Open(s.URL("ckpt"), objstore.Limits{})
			require.NoError(t, err)
			defer tree.Close()
			f, err := tree.Open("shard")
			require.NoError(t, err)
			buf := make([]byte, 64<<10)
			_, err = f.ReadAt(buf, 0)
			require.NoError(t, err)
			tc.change(t, s)
			clear(buf)
			_, err = f.ReadAt(buf, 128<<10)
			require.ErrorIs(t, err, source.ErrChanged)
			RequireEIO(t, err, s.URL("ckpt/shard"))
			assert.False(t, bytes.Contains(buf, []byte("new!")), "bytes of another version were served")
		})
	}

	// An object read in order in blocks, as the block cache fills them:
	// N blocks in requests of k blocks cost at most ceil(N/k)+1 requests
	// (the first read, under a stream's least, is its own), each byte
	// fetched once, byte-exact.
	t.Run("streamed sequential read", func(t *testing.T) {
		const size, block, req = 24<<20 + 4321, 1 << 20, 8 << 20
		s := start(t, false)
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i*13 + i>>11)
		}
		put(t, s, "ckpt/shard", data)
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{MinRequest: req, AheadMemory: 4 * req})
		require.NoError(t, err)
		defer tree.Close()
		f, err := tree.Open("shard")
		require.NoError(t, err)
		before := tree.Stats()
		buf := make([]byte, block)
		for off := 0; off < size; off += block {
			n, err := f.ReadAt(buf, int64(off))
			if n < block {
				require.ErrorIs(t, err, io.EOF)
			} else {
				require.NoError(t, err)
			}
			require.True(t, bytes.Equal(data[off:off+n], buf[:n]), "block at %d", off)
		}
		require.Eventually(t, func() bool { return tree.Stats().BytesFetched-before.BytesFetched >= size },
			30*time.Second, 10*time.Millisecond, "bytes counted as the requests end")
		st := tree.Stats()
		blocks, k := (size+block-1)/block, req/block
		assert.LessOrEqual(t, st.Requests-before.Requests, int64((blocks+k-1)/k+1), "requests")
		assert.Equal(t, int64(size), st.BytesFetched-before.BytesFetched, "bytes fetched")
	})

	t.Run("missing", func(t *testing.T) {
		s := start(t, false)
		put(t, s, "ckpt/shard", []byte("x"))
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{})
		require.NoError(t, err)
		defer tree.Close()
		for _, name := range []string{"nope", "shard/below", "dir/nope"} {
			_, err = tree.Open(name)
			require.ErrorIs(t, err, fs.ErrNotExist, name)
			assert.Contains(t, err.Error(), s.URL("ckpt/"+name))
		}
		_, err = tree.ReadDir("nope")
		require.ErrorIs(t, err, fs.ErrNotExist)
		_, err = s.Open(s.URL("nothing-here"), objstore.Limits{})
		require.ErrorIs(t, err, fs.ErrNotExist, "an empty prefix is a missing directory")
	})

	// A proxy answers 403 (a bucket policy's denial), then one 503 and the
	// store's answers: a read and a lookup of an object opened before fail
	// as denied, with EIO, neither unavailable (an outage, which would fail
	// every other name too) nor ENOENT; the read is then retried through
	// the 503, byte-exact.
	t.Run("denied, and a 5xx burst retried", func(t *testing.T) {
		s := start(t, false)
		data := bytes.Repeat([]byte("old!"), 32<<10)
		put(t, s, "ckpt/shard", data)
		p := s.Proxy(t)
		// ListTTL: a lookup asks the store, not the open's listing.
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{MaxAttempts: 2, ListTTL: time.Nanosecond})
		require.NoError(t, err)
		defer tree.Close()
		f, err := tree.Open("shard")
		require.NoError(t, err)
		p.SetFault(func(*http.Request) Fault { return Fault{Status: http.StatusForbidden, Code: "AccessDenied"} })
		buf := make([]byte, 32<<10)
		_, err = f.ReadAt(buf, 4096)
		for name, err := range map[string]error{"shard": err, "other": second(tree.Stat("other"))} {
			t.Log(err)
			require.ErrorIs(t, err, source.ErrDenied, name)
			require.False(t, source.IsUnavailable(err), "a denial is no outage: %v", err)
			RequireEIO(t, err, s.URL("ckpt/"+name))
		}
		burst := 1
		p.SetFault(func(*http.Request) Fault {
			if burst > 0 {
				burst-- // under the proxy's lock
				return Fault{Status: http.StatusServiceUnavailable}
			}
			return Fault{}
		})
		clear(buf)
		_, err = f.ReadAt(buf, 4096)
		require.NoError(t, err, "one 503 in 2 attempts")
		require.Equal(t, data[4096:4096+len(buf)], buf)
		require.Zero(t, burst, "the 503 was sent")
	})

	// A body that trickles (4 KiB/s, under MinRate) through a proxy: the
	// read of an object opened before fails within the bound, each attempt
	// cut at its deadline, as unavailable, with EIO.
	t.Run("slow body", func(t *testing.T) {
		s := start(t, false)
		put(t, s, "ckpt/shard", bytes.Repeat([]byte("old!"), 32<<10))
		p := s.Proxy(t)
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{MaxAttempts: faultAttempts, ReadTimeout: faultTimeout})
		require.NoError(t, err)
		defer tree.Close()
		f, err := tree.Open("shard")
		require.NoError(t, err)
		p.SetFault(func(*http.Request) Fault { return Fault{Rate: 4 << 10} })
		readFailsInBound(t, f, s.URL("ckpt/shard"), faultAttempts*faultTimeout)
	})

	// One server of its own, frozen (SIGSTOP), resumed, then killed: the
	// read of an object opened before each fault fails within the bound
	// (readFailsInBound), as a lookup does; once resumed, the same handle
	// reads again.
	t.Run("frozen, resumed, killed", func(t *testing.T) {
		s := start(t, true)
		data := bytes.Repeat([]byte("old!"), 32<<10)
		put(t, s, "ckpt/shard", data)
		tree, err := s.Open(s.URL("ckpt"), objstore.Limits{MaxAttempts: faultAttempts, ReadTimeout: faultTimeout})
		require.NoError(t, err)
		defer tree.Close()
		f, err := tree.Open("shard")
		require.NoError(t, err)
		p := s.Process()
		failsInBound := func(min time.Duration) {
			t.Helper()
			readFailsInBound(t, f, s.URL("ckpt/shard"), min)
			// A lookup fails as a read does: EIO, never ENOENT.
			_, err = tree.Stat("other")
			require.ErrorIs(t, err, objstore.ErrRequest)
			RequireEIO(t, err, s.URL("ckpt/other"))
			require.True(t, source.IsUnavailable(err), "a store that does not answer is unavailable: %v", err)
			require.False(t, errors.Is(err, source.ErrDenied))
		}

		p.Signal(t, syscall.SIGSTOP)
		failsInBound(faultAttempts * faultTimeout)
		p.Signal(t, syscall.SIGCONT)
		buf := make([]byte, faultRead)
		_, err = f.ReadAt(buf, 4096)
		require.NoError(t, err, "the store is back")
		require.Equal(t, data[4096:4096+faultRead], buf)
		p.Kill(t)
		failsInBound(0)
	})
}

// The faults' reads: 32 KiB (past the small-read windows) with
// MaxAttempts 2 and ReadTimeout 1 s.
const faultAttempts, faultTimeout, faultRead = 2, time.Second, 32 << 10

// readFailsInBound reads faultRead bytes at 4096 of f (the object at url)
// and requires the read to fail with EIO as unavailable, after min and
// within the bound: every attempt up to its deadline, plus backoff and
// slack.
func readFailsInBound(t *testing.T, f source.File, url string, min time.Duration) {
	t.Helper()
	bound := faultAttempts*(faultTimeout+time.Duration(faultRead)*time.Second/objstore.DefaultMinRate) + 2*time.Second
	took, err := TimedRead(t, f, make([]byte, faultRead), 4096, bound)
	assert.GreaterOrEqual(t, took, min)
	assert.Less(t, took, bound)
	require.ErrorIs(t, err, objstore.ErrRequest)
	RequireEIO(t, err, url)
	require.True(t, source.IsUnavailable(err), "a store that does not answer is unavailable: %v", err)
}

func second[T any](_ T, err error) error { return err }

func put(t *testing.T, s Store, key string, data []byte) {
	t.Helper()
	require.NoError(t, s.Put(key, data), "put %s", key)
}

// putMaybe writes a key a store may refuse.
func putMaybe(t *testing.T, s Store, key string, data []byte) {
	if err := s.Put(key, data); err != nil {
		t.Logf("the store refused key %q: %v", key, err)
	}
}

func names(ents []source.Info) map[string]string {
	out := map[string]string{}
	for _, e := range ents {
		kind := "file"
		if e.IsDir() {
			kind = "dir"
		}
		out[e.Name] = kind
	}
	return out
}

func readAll(t *testing.T, tree source.Tree, name string) []byte {
	t.Helper()
	f, err := tree.Open(name)
	require.NoError(t, err)
	buf := make([]byte, f.Info().Size)
	n, err := f.ReadAt(buf, 0)
	require.NoError(t, err)
	return buf[:n]
}

// TimedRead reads p at off of f and returns how long it took and the read's
// error; the test fails at once when the read is still going 5 s after
// bound.
func TimedRead(t *testing.T, f source.File, p []byte, off int64, bound time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(p, off)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(bound + 5*time.Second):
		t.Fatalf("read still going after %v", bound+5*time.Second)
	}
	took := time.Since(start)
	t.Logf("%v after %v (bound %v)", err, took, bound)
	return took, err
}

// RequireEIO asserts that err names the object on one line and maps to
// EIO as vfs.mapErr does: ErrChanged is EIO; anything matching no sentinel
// of its table and no errno is EIO too (never EINTR for a deadline, ENOENT,
// or the errno of a connection).
func RequireEIO(t *testing.T, err error, url string) {
	t.Helper()
	require.Error(t, err)
	assert.Contains(t, err.Error(), url)
	assert.NotContains(t, err.Error(), "\n")
	if errors.Is(err, source.ErrChanged) {
		return
	}
	var errno syscall.Errno
	for _, sentinel := range []error{context.Canceled, context.DeadlineExceeded, fs.ErrNotExist, fs.ErrExist, fs.ErrPermission} {
		assert.NotErrorIs(t, err, sentinel)
	}
	assert.False(t, errors.As(err, &errno), "errno %v in %v", errno, err)
}
