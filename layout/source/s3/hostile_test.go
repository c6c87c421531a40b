package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/s3"
)

// fakeStore is an S3-compatible store of one object, s3://bkt/ckpt/shard,
// whose ranged GETs are answered by serve; LIST and HEAD answer as S3 does.
// It needs no Python, so these tests always run.
type fakeStore struct {
	url   string
	data  []byte
	gets  atomic.Int64 // ranged GETs of the object
	serve func(w http.ResponseWriter, r *http.Request, first, last int64)
}

const fakeETag = `"v1"`

func startFakeStore(t *testing.T, size int, serve func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64)) *fakeStore {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "", "AWS_REGION": "us-east-1",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	s := &fakeStore{data: bytes.Repeat([]byte("old!"), size/4)}
	s.serve = func(w http.ResponseWriter, r *http.Request, first, last int64) { serve(s, w, r, first, last) }
	mtime := time.Now().UTC().Format(http.TimeFormat)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/bkt" || r.URL.Path == "/bkt/":
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">`+
				`<Name>bkt</Name><Prefix>ckpt/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>`+
				`<Contents><Key>ckpt/shard</Key><Size>%d</Size><ETag>&quot;v1&quot;</ETag><LastModified>2024-01-01T00:00:00.000Z</LastModified></Contents>`+
				`</ListBucketResult>`, len(s.data))
		case r.URL.Path != "/bkt/ckpt/shard":
			http.NotFound(w, r)
		case r.Method == http.MethodHead:
			w.Header().Set("ETag", fakeETag)
			w.Header().Set("Last-Modified", mtime)
			w.Header().Set("Content-Length", fmt.Sprint(len(s.data)))
		default:
			var first, last int64
			if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &first, &last); err != nil {
				http.Error(w, "want a Range", http.StatusBadRequest)
				return
			}
			s.gets.Add(1)
			s.serve(w, r, first, last)
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// respond answers a ranged GET with these headers and body.
func respond(w http.ResponseWriter, status int, etag, contentRange string, body []byte) {
	w.Header().Set("ETag", etag)
	if contentRange != "" {
		w.Header().Set("Content-Range", contentRange)
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// honest answers as S3 does: 412 unless If-Match is the ETag, else 206.
func honest(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
	if r.Header.Get("If-Match") != fakeETag {
		w.WriteHeader(http.StatusPreconditionFailed)
		return
	}
	respond(w, http.StatusPartialContent, fakeETag, fmt.Sprintf("bytes %d-%d/%d", first, last, len(s.data)), s.data[first:last+1])
}

// trickle sends the bytes of a well-formed response one at a time, every
// 200 ms (headers too, when headers is set), until the client goes away.
func trickle(headers bool) func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
	return func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
		head := fmt.Sprintf("HTTP/1.1 206 Partial Content\r\nETag: %s\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n",
			fakeETag, first, last, len(s.data), last-first+1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		out := []byte(head)
		if !headers {
			buf.WriteString(head)
			out = nil
		}
		out = append(out, s.data[first:last+1]...)
		for _, b := range out {
			buf.WriteByte(b)
			if buf.Flush() != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// requireEIO asserts that err names the object on one line and maps to
// EIO as vfs.mapErr does: ErrChanged is EIO; anything matching no sentinel
// of its table and no errno is EIO too (never EINTR for a deadline, ENOENT,
// or the errno of a connection).
func requireEIO(t *testing.T, err error, url string) {
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

// TestHostileStore: a store that ignores If-Match or Range, sends wrong
// headers, cuts or trickles bodies fails the read with an error that maps to
// EIO, after at most MaxAttempts attempts of bounded time, and never with
// bytes of another version. Each case is a read of 32 KiB (past the small
// read windows) at 4096 with ReadTimeout 1 s and MaxAttempts 2: an
// attempt's deadline is 1 s + 32 KiB at the default 256 KiB/s.
func TestHostileStore(t *testing.T) {
	const (
		size = 64 << 10
		off  = 4096
		n    = 32 << 10
	)
	type serveFunc = func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64)
	replaced := func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
		// Same size, new bytes, new ETag, If-Match ignored.
		respond(w, http.StatusPartialContent, `"v2"`, fmt.Sprintf("bytes %d-%d/%d", first, last, size),
			bytes.Repeat([]byte("new!"), size/4)[first:last+1])
	}
	ranged := func(cr func(first, last int64) string, body func(s *fakeStore, first, last int64) []byte) serveFunc {
		return func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
			respond(w, http.StatusPartialContent, fakeETag, cr(first, last), body(s, first, last))
		}
	}
	asked := func(s *fakeStore, first, last int64) []byte { return s.data[first : last+1] }
	for _, tc := range []struct {
		name     string
		serve    serveFunc
		want     error // nil: the read succeeds
		cause    string
		gets     int64         // GETs of the object
		min, max time.Duration // how long the read takes
	}{
		{name: "honest", serve: honest, gets: 1, max: time.Second},
		{name: "If-Match ignored, object replaced", serve: replaced, want: source.ErrChanged, cause: `ETag "v2", not "v1"`, gets: 1, max: time.Second},
		{name: "Range ignored", serve: func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
			respond(w, http.StatusOK, fakeETag, "", s.data)
		}, want: source.ErrChanged, cause: "Content-Range \"\"", gets: 1, max: time.Second},
		{name: "Content-Range start", serve: ranged(func(first, last int64) string {
			return fmt.Sprintf("bytes %d-%d/%d", first+4, last+4, size)
		}, func(s *fakeStore, first, last int64) []byte { return s.data[first+4 : last+5] }),
			want: source.ErrChanged, cause: "Content-Range", gets: 1, max: time.Second},
		{name: "Content-Range end", serve: ranged(func(first, last int64) string {
			return fmt.Sprintf("bytes %d-%d/%d", first, last+4, size)
		}, asked), want: source.ErrChanged, cause: "Content-Range", gets: 1, max: time.Second},
		{name: "Content-Range total", serve: ranged(func(first, last int64) string {
			return fmt.Sprintf("bytes %d-%d/%d", first, last, size+4)
		}, asked), want: source.ErrChanged, cause: "Content-Range", gets: 1, max: time.Second},
		{name: "Content-Range unknown total", serve: ranged(func(first, last int64) string {
			return fmt.Sprintf("bytes %d-%d/*", first, last)
		}, asked), want: source.ErrChanged, cause: "Content-Range", gets: 1, max: time.Second},
		{name: "short Content-Length", serve: ranged(func(first, last int64) string {
			return fmt.Sprintf("bytes %d-%d/%d", first, last, size)
		}, func(s *fakeStore, first, last int64) []byte { return s.data[first:last] }),
			want: source.ErrChanged, cause: "Content-Length", gets: 1, max: time.Second},
		{name: "body cut every time", serve: func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
			w.Header().Set("ETag", fakeETag)
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, size))
			w.Header().Set("Content-Length", fmt.Sprint(last-first+1))
			w.Write(s.data[first : first+(last-first+1)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}, want: s3.ErrRequest, cause: "response body cut", gets: 2, max: time.Second},
		{name: "body trickles", serve: trickle(false), want: s3.ErrRequest, cause: "attempt deadline 1.125s passed",
			gets: 2, min: 2 * 1125 * time.Millisecond, max: 2*1125*time.Millisecond + 2*time.Second},
		{name: "headers trickle", serve: trickle(true), want: s3.ErrRequest, cause: "no response within the attempt deadline 1.125s",
			gets: 2, min: 2 * 1125 * time.Millisecond, max: 2*1125*time.Millisecond + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := startFakeStore(t, size, tc.serve)
			tree, err := s3.Open(context.Background(), "s3://bkt/ckpt", s3.Options{Endpoint: store.url, MaxAttempts: 2, ReadTimeout: time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { tree.Close() })
			f, err := tree.Open("shard")
			require.NoError(t, err)
			buf := make([]byte, n)
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := f.ReadAt(buf, off)
				done <- err
			}()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("read still going after 10s")
			}
			took := time.Since(start)
			assert.Equal(t, tc.gets, store.gets.Load(), "GETs")
			assert.GreaterOrEqual(t, took, tc.min)
			assert.Less(t, took, tc.max)
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, store.data[off:off+n], buf)
				return
			}
			requireEIO(t, err, "s3://bkt/ckpt/shard")
			require.ErrorIs(t, err, tc.want)
			if tc.want == s3.ErrRequest {
				assert.NotErrorIs(t, err, source.ErrChanged)
			}
			assert.Contains(t, err.Error(), tc.cause)
			assert.False(t, bytes.Contains(buf, []byte("new!")), "bytes of another version were served")
			assert.Equal(t, int64(1), tree.Stats().Errors)
			t.Log(err)
		})
	}
}

// TestReplacedIfMatchIgnored is TestObjectReplaced on a store that ignores
// If-Match: small reads (the windows) and large ones alike fail with
// ErrChanged once the object is replaced, and bytes fetched before stay
// the old version's.
func TestReplacedIfMatchIgnored(t *testing.T) {
	var replaced atomic.Bool
	store := startFakeStore(t, 256<<10, func(s *fakeStore, w http.ResponseWriter, r *http.Request, first, last int64) {
		data, etag := s.data, fakeETag
		if replaced.Load() {
			data, etag = bytes.Repeat([]byte("new!"), len(s.data)/4), `"v2"`
		}
		respond(w, http.StatusPartialContent, etag, fmt.Sprintf("bytes %d-%d/%d", first, last, len(data)), data[first:last+1])
	})
	tree, err := s3.Open(context.Background(), "s3://bkt/ckpt", s3.Options{Endpoint: store.url})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "old!old!", string(buf))

	replaced.Store(true)
	_, err = f.ReadAt(buf, 8) // in the window already fetched
	require.NoError(t, err)
	assert.Equal(t, "old!old!", string(buf))
	for _, read := range []struct{ off, n int64 }{{100_000, 8}, {100_000, 8}, {128 << 10, 100 << 10}} {
		buf := make([]byte, read.n)
		_, err = f.ReadAt(buf, read.off)
		requireEIO(t, err, "s3://bkt/ckpt/shard")
		require.ErrorIs(t, err, source.ErrChanged, "read at %d", read.off)
		assert.NotContains(t, string(buf), "new!")
	}
	assert.Equal(t, int64(4), store.gets.Load(), "a mismatch is not retried")
}
