package gcs_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/gcs"
	"github.com/ckptfs/ckptfs/layout/source/gcs/gcstest"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestEmulator: the cases every store passes (objstoretest.Run) against
// fake-gcs-server, through STORAGE_EMULATOR_HOST.
func TestEmulator(t *testing.T) {
	objstoretest.RunEmulator(t, objstoretest.Emulated[*gcstest.Server]{
		Scheme: "gs",
		Shared: gcstest.Shared,
		Start:  gcstest.Start,
		Bucket: func(t testing.TB, srv *gcstest.Server, name string) { srv.Bucket(t, name) },
		Open: func(url string, l objstore.Limits) (*objstore.Tree, error) {
			return gcs.Open(context.Background(), url, gcs.Options{Limits: l})
		},
		Proxy: func(t *testing.T, srv *gcstest.Server) *objstoretest.Proxy {
			p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{TargetHost: true})
			t.Setenv("STORAGE_EMULATOR_HOST", p.Host) // srv.Client, which puts, goes on reaching the server
			return p
		},
	})
}

// TestEndpointAnonymous: with STORAGE_EMULATOR_HOST unset, --endpoint and
// --no-sign-request reach a server anonymously; without credentials
// anywhere, a signed client fails the open in one line that points at
// --no-sign-request.
func TestEndpointAnonymous(t *testing.T) {
	srv := gcstest.Shared(t)
	srv.Bucket(t, "public")
	require.NoError(t, srv.Put("public", "run/shard", []byte("bytes")))
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	tree, err := gcs.Open(context.Background(), "gs://public/run", gcs.Options{Endpoint: srv.Endpoint, Anonymous: true})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "bytes", string(buf))

	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	_, err = gcs.Open(context.Background(), "gs://public/run", gcs.Options{Endpoint: srv.Endpoint})
	require.ErrorIs(t, err, gcs.ErrNoCredentials)
	assert.Contains(t, err.Error(), "--no-sign-request")
	assert.NotContains(t, err.Error(), "\n")
}

// TestGenerationIgnored: a server that answers a read of the generation
// opened with the bytes of the one that replaced it (a proxy rewrites the
// generation asked for) fails the read with ErrChanged naming both, never
// serving the new bytes.
func TestGenerationIgnored(t *testing.T) {
	srv := gcstest.Shared(t)
	srv.Bucket(t, "ckpts")
	old := bytes.Repeat([]byte("old!"), 16<<10)
	require.NoError(t, srv.Put("ckpts", "run/shard", old))
	var latest atomic.Int64 // the generation the proxy asks for instead, once set
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{TargetHost: true})
	p.SetFault(func(r *http.Request) objstoretest.Fault {
		if q := r.URL.Query(); q.Has("generation") && latest.Load() != 0 {
			q.Set("generation", strconv.FormatInt(latest.Load(), 10))
			r.URL.RawQuery = q.Encode()
		}
		return objstoretest.Fault{}
	})
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	tree, err := gcs.Open(context.Background(), "gs://ckpts/run", gcs.Options{Endpoint: p.URL, Anonymous: true})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	require.NoError(t, srv.Put("ckpts", "run/shard", bytes.Repeat([]byte("new!"), 16<<10)))
	attrs, err := srv.Client.Bucket("ckpts").Object("run/shard").Attrs(context.Background())
	require.NoError(t, err)
	latest.Store(attrs.Generation)
	buf := make([]byte, 32<<10)
	_, err = f.ReadAt(buf, 0)
	require.ErrorIs(t, err, source.ErrChanged)
	assert.Contains(t, err.Error(), fmt.Sprintf("generation %d, not %s", attrs.Generation, f.Info().Version))
	objstoretest.RequireEIO(t, err, "gs://ckpts/run/shard")
	assert.False(t, bytes.Contains(buf, []byte("new!")), "bytes of another generation were served")
}

// TestContentEncodingGzip: an object stored with Content-Encoding: gzip is
// read as the bytes stored, at any range, its size the stored one: GCS
// would otherwise decompress it for a client that does not accept gzip
// (decompressive transcoding), ignoring the range.
func TestContentEncodingGzip(t *testing.T) {
	srv := gcstest.Shared(t)
	srv.Bucket(t, "ckpts")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(bytes.Repeat([]byte("compressible tensor bytes "), 64<<10))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	stored := gz.Bytes()
	w := srv.Client.Bucket("ckpts").Object("run/shard.gz").NewWriter(context.Background())
	w.ContentEncoding = "gzip"
	_, err = w.Write(stored)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	tree, err := gcs.Open(context.Background(), "gs://ckpts/run", gcs.Options{})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard.gz")
	require.NoError(t, err)
	require.Equal(t, int64(len(stored)), f.Info().Size)
	for _, r := range [][2]int{{0, len(stored)}, {0, 100}, {len(stored) / 3, len(stored) / 2}} {
		buf := make([]byte, r[1])
		n, err := f.ReadAt(buf, int64(r[0]))
		require.NoError(t, err, "%d bytes at %d", r[1], r[0])
		require.Equal(t, r[1], n)
		require.True(t, bytes.Equal(stored[r[0]:r[0]+r[1]], buf), "%d bytes at %d: not the bytes stored", r[1], r[0])
	}
}
