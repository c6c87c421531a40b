package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		bucket string
		prefix string
		bad    bool
	}{
		{url: "s3://bucket", bucket: "bucket"},
		{url: "s3://bucket/", bucket: "bucket"},
		{url: "s3://my.bucket-1/runs/llama", bucket: "my.bucket-1", prefix: "runs/llama"},
		{url: "s3://bucket/runs/llama/", bucket: "bucket", prefix: "runs/llama"},
		{url: "s3://bucket/runs/../etc", bad: true},
		{url: "s3://bucket/runs//llama", bad: true},
		{url: "s3://bucket/./runs", bad: true},
		{url: "s3://bucket/..", bad: true},
		{url: "s3://bucket/.", bad: true},
		{url: "s3://bucket/./", bad: true},
		{url: "s3://bucket//", bad: true},
		{url: "s3://bucket/x//", bad: true},
		{url: "s3://Bucket/x", bad: true},
		{url: "s3://b/x", bad: true},
		{url: "s3:///x", bad: true},
		{url: "/local/dir", bad: true},
		{url: "gs://bucket/x", bad: true},
	} {
		t.Run(tc.url, func(t *testing.T) {
			loc, err := s3.ParseURL(tc.url)
			if tc.bad {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "s3:")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, s3.Location{Scheme: "s3://", Bucket: tc.bucket, Prefix: tc.prefix}, loc)
		})
	}
}

// world is a bucket laid out to test naming and confinement: the tree is
// s3://world/run; "secret" and "run-other/" lie outside it.
func world(t *testing.T) (*s3test.Server, *s3.Tree) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "world")
	for key, data := range map[string]string{
		"secret":                  "outside",
		"run-other/x":             "outside",
		"run/a.json":              `{"a":1}`,
		"run/step_1/.metadata":    "meta",
		"run/step_1/__0_0.distcp": "shard0",
		"run/step_1/sub/deep":     "deep",
		"run/../secret":           "a literal .. key",
		"run//empty-segment":      "x",
		"run/./dot":               "x",
		"run/marker/":             "",
		"run/marker/in":           "in",
		"run/both":                "an object",
		"run/both/child":          "and a prefix",
	} {
		srv.Put(t, "world", key, []byte(data))
	}
	tree, err := s3.Open(context.Background(), "s3://world/run", s3.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	return srv, tree
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

func TestListing(t *testing.T) {
	_, tree := world(t)
	for _, tc := range []struct {
		dir  string
		want map[string]string
	}{
		// "..", "." and the empty segment are keys no name can reach; the
		// object "both" hides the prefix "both/".
		{".", map[string]string{"a.json": "file", "step_1": "dir", "marker": "dir", "both": "file"}},
		{"step_1", map[string]string{".metadata": "file", "__0_0.distcp": "file", "sub": "dir"}},
		{"step_1/sub", map[string]string{"deep": "file"}},
		// The directory marker object "marker/" is not an entry of itself.
		{"marker", map[string]string{"in": "file"}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			ents, err := tree.ReadDir(tc.dir)
			require.NoError(t, err)
			assert.Equal(t, tc.want, names(ents))
			for _, e := range ents {
				info, err := tree.Stat(tc.dir + "/" + e.Name)
				require.NoError(t, err, e.Name)
				assert.Equal(t, e, info, "Stat agrees with ReadDir")
			}
		})
	}
	_, err := tree.ReadDir("nothing")
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

func TestConfined(t *testing.T) {
	_, tree := world(t)
	for _, name := range []string{"../secret", "../run-other/x", "/secret", "step_1/../../secret", "step_1/../../run-other/x"} {
		t.Run(name, func(t *testing.T) {
			_, err := tree.Open(name)
			assert.ErrorIs(t, err, source.ErrEscapes)
			_, err = tree.Stat(name)
			assert.ErrorIs(t, err, source.ErrEscapes)
			_, err = tree.ReadDir(name)
			assert.ErrorIs(t, err, source.ErrEscapes)
		})
	}
	// Inside the tree, the same names clean to keys under the prefix.
	b, err := source.ReadFile(tree, "step_1/sub/../.metadata", 100)
	require.NoError(t, err)
	assert.Equal(t, "meta", string(b))
	// A name that is a prefix is no file.
	_, err = tree.Open("step_1")
	assert.ErrorIs(t, err, source.ErrNotRegular)
	_, err = tree.Open("missing")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Equal(t, "s3://world/run/step_1/.metadata", tree.Path("step_1/.metadata"))
}

func TestStatFresh(t *testing.T) {
	_, tree := world(t)
	for _, tc := range []struct {
		name string
		dir  bool
		size int64
	}{
		{".", true, 0}, {"step_1", true, 0}, {"step_1/sub", true, 0}, {"a.json", false, 7}, {"both", false, 9},
	} {
		info, err := tree.Stat(tc.name)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.dir, info.IsDir(), tc.name)
		assert.Equal(t, tc.size, info.Size, tc.name)
		if !tc.dir {
			assert.NotEmpty(t, info.Version, tc.name)
		}
	}
	// HEAD and LIST give one Version: ckpt.File compares them.
	head, err := tree.Stat("a.json")
	require.NoError(t, err)
	ents, err := tree.ReadDir(".")
	require.NoError(t, err)
	for _, e := range ents {
		if e.Name == "a.json" {
			assert.Equal(t, head.Version, e.Version)
			assert.Equal(t, head.ID, e.ID)
		}
	}
	_, err = tree.Stat("step_1/missing")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = s3.Open(context.Background(), "s3://world/nothing-here", s3.Options{})
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = s3.Open(context.Background(), "s3://no-such-bucket/x", s3.Options{})
	require.Error(t, err)
	assert.NotErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), "s3://no-such-bucket/x")
}

func TestRangedReads(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "data")
	data := make([]byte, 3<<20+17)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	srv.Put(t, "data", "ckpt/shard", data)
	tree, err := s3.Open(context.Background(), "s3://data/ckpt", s3.Options{})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, int64(len(data)), f.Info().Size)
	before := tree.Stats()
	for _, tc := range []struct{ off, n int64 }{
		{0, 1}, {0, 8}, {5, 1 << 20}, {int64(len(data)) - 3, 3}, {1 << 20, 2 << 20}, {0, int64(len(data))},
	} {
		buf := make([]byte, tc.n)
		n, err := f.ReadAt(buf, tc.off)
		if tc.off+tc.n == int64(len(data)) && err == io.EOF {
			err = nil
		}
		require.NoError(t, err)
		require.Equal(t, int(tc.n), n)
		require.True(t, bytes.Equal(data[tc.off:tc.off+tc.n], buf), "bytes at %d+%d", tc.off, tc.n)
	}
	// Past the end: a short read and io.EOF, never a request for nothing.
	buf := make([]byte, 10)
	n, err := f.ReadAt(buf, int64(len(data))-4)
	assert.Equal(t, 4, n)
	assert.ErrorIs(t, err, io.EOF)
	_, err = f.ReadAt(buf, int64(len(data)))
	assert.ErrorIs(t, err, io.EOF)
	// Small reads share the 64 KiB window around them: the first two, and
	// the two at the end, are one request each; large reads are their own.
	after := tree.Stats()
	last := int64(len(data)) - int64(len(data))%(64<<10)
	assert.Equal(t, int64(5), after.Requests-before.Requests)
	assert.Equal(t, int64(0), after.Retries-before.Retries)
	assert.Equal(t, int64(0), after.Errors-before.Errors)
	assert.Equal(t, 64<<10+1<<20+(int64(len(data))-last)+2<<20+int64(len(data)), after.BytesFetched-before.BytesFetched)
}

// TestObjectReplaced: a file opened before its object is replaced fails
// every later read of bytes not fetched yet with ErrChanged, naming the
// object, and never returns new bytes for it; a reopen sees the new
// content.
func TestObjectReplaced(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "data")
	srv.Put(t, "data", "ckpt/shard", bytes.Repeat([]byte("old!"), 50_000))
	tree, err := s3.Open(context.Background(), "s3://data/ckpt", s3.Options{})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "old!old!", string(buf))

	srv.Put(t, "data", "ckpt/shard", bytes.Repeat([]byte("new!"), 50_000)) // same size
	_, err = f.ReadAt(buf, 8)                                              // in the window already fetched: the old version's bytes
	require.NoError(t, err)
	assert.Equal(t, "old!old!", string(buf))
	_, err = f.ReadAt(buf, 150_000) // not fetched yet

	require.ErrorIs(t, err, source.ErrChanged)
	assert.Contains(t, err.Error(), "s3://data/ckpt/shard")
	assert.NotContains(t, err.Error(), "\n")

	srv.Delete(t, "data", "ckpt/shard")
	_, err = f.ReadAt(buf, 100_000)
	require.ErrorIs(t, err, source.ErrChanged)
	assert.Contains(t, err.Error(), "vanished")

	srv.Put(t, "data", "ckpt/shard", bytes.Repeat([]byte("new!"), 50_000))
	tree2, err := s3.Open(context.Background(), "s3://data/ckpt", s3.Options{})
	require.NoError(t, err)
	defer tree2.Close()
	g, err := tree2.Open("shard")
	require.NoError(t, err)
	_, err = g.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "new!new!", string(buf))
	assert.NotEqual(t, f.Info().Version, g.Info().Version)
}

func TestErrorsCounted(t *testing.T) {
	srv, tree := world(t)
	f, err := tree.Open("a.json")
	require.NoError(t, err)
	srv.Delete(t, "world", "run/a.json")
	before := tree.Stats()
	_, err = f.ReadAt(make([]byte, 3), 0)
	require.True(t, errors.Is(err, source.ErrChanged))
	assert.Equal(t, before.Errors+1, tree.Stats().Errors)
}

// faultProxy forwards to the server, answering every third request with
// 503 SlowDown and cutting every third GET body halfway.
func faultProxy(t *testing.T, target string) (url string, faults, cuts *atomic.Int64) {
	var n atomic.Int64
	faults, cuts = new(atomic.Int64), new(atomic.Int64)
	p := objstoretest.StartProxy(t, target, objstoretest.ProxyOptions{})
	p.SetFault(func(r *http.Request) objstoretest.Fault {
		i := n.Add(1)
		switch {
		case i%3 == 0:
			faults.Add(1)
			return objstoretest.Fault{Status: http.StatusServiceUnavailable, Code: "SlowDown"}
		case i%3 == 1 && r.Method == http.MethodGet:
			faults.Add(1)
			cuts.Add(1)
			return objstoretest.Fault{Cut: true}
		}
		return objstoretest.Fault{}
	})
	return p.URL, faults, cuts
}

// TestRetries: throttling and cut connections are retried (the SDK retries
// a failed request, the tree resumes a cut body) and the bytes are exact.
func TestRetries(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "data")
	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	srv.Put(t, "data", "ckpt/shard", data)
	proxy, faults, cuts := faultProxy(t, srv.Endpoint)
	tree, err := s3.Open(context.Background(), "s3://data/ckpt", s3.Options{Endpoint: proxy, MaxAttempts: 10})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	for off := int64(0); off < int64(len(data)); off += 200_000 {
		buf := make([]byte, min(200_000, int64(len(data))-off))
		n, err := f.ReadAt(buf, off)
		if err == io.EOF {
			err = nil
		}
		require.NoError(t, err, "read at %d", off)
		require.Equal(t, len(buf), n)
		require.True(t, bytes.Equal(data[off:off+int64(n)], buf), "bytes at %d", off)
	}
	st := tree.Stats()
	assert.Greater(t, faults.Load(), int64(3))
	assert.Greater(t, cuts.Load(), int64(1), "GET bodies were cut")
	assert.GreaterOrEqual(t, st.Retries, faults.Load()-1, "every fault after the tree opened was retried")
	assert.Zero(t, st.Errors)
	assert.Equal(t, int64(len(data)), st.BytesFetched, "a cut body is resumed where it stopped, not fetched again")
}

// TestStatFromListing: Stat of the names of a directory that fits in a page
// costs one LIST per ListTTL, however many names, and no HEAD (a view
// file's open checks every shard it reads): none within ListTTL of the
// open, whose listing answers; and sees a replaced object.
func TestStatFromListing(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "data")
	for i := range 5 {
		srv.Put(t, "data", fmt.Sprintf("ckpt/__%d_0.distcp", i), []byte("shard"))
	}
	const ttl = 500 * time.Millisecond
	opened := time.Now()
	tree, err := s3.Open(context.Background(), "s3://data/ckpt", s3.Options{ListTTL: ttl})
	require.NoError(t, err)
	defer tree.Close()
	stat := func() map[string]string {
		versions := map[string]string{}
		for i := range 5 {
			info, err := tree.Stat(fmt.Sprintf("__%d_0.distcp", i))
			require.NoError(t, err)
			versions[info.Name] = info.Version
		}
		return versions
	}
	before := tree.Stats().Requests
	v1 := stat() // the prefix fits in a page: the open listed it, no HEAD
	if time.Since(opened) < ttl {
		assert.Equal(t, int64(0), tree.Stats().Requests-before, "the open's LIST for five names")
	} else { // a loaded machine: the open's listing went stale
		assert.Equal(t, int64(1), tree.Stats().Requests-before, "one LIST for five names")
	}
	srv.Put(t, "data", "ckpt/__3_0.distcp", []byte("other"))
	time.Sleep(ttl + 50*time.Millisecond)
	before = tree.Stats().Requests
	v2 := stat()
	assert.Equal(t, int64(1), tree.Stats().Requests-before, "one LIST for five names")
	assert.NotEqual(t, v1["__3_0.distcp"], v2["__3_0.distcp"])
	assert.Equal(t, v1["__0_0.distcp"], v2["__0_0.distcp"])
	_, err = tree.Stat("__9_0.distcp")
	assert.ErrorIs(t, err, fs.ErrNotExist)
}
