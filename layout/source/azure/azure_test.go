package azure_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/azure"
	"github.com/ckptfs/ckptfs/layout/source/azure/azuretest"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestEmulator: the cases every store passes (objstoretest.Run) against
// Azurite, through AZURE_STORAGE_CONNECTION_STRING.
func TestEmulator(t *testing.T) {
	objstoretest.RunEmulator(t, objstoretest.Emulated[*azuretest.Server]{
		Scheme: "az",
		Shared: azuretest.Shared,
		Start:  azuretest.Start,
		Bucket: func(t testing.TB, srv *azuretest.Server, name string) { srv.Container(t, name) },
		Open: func(url string, l objstore.Limits) (*objstore.Tree, error) {
			return azure.Open(context.Background(), url, azure.Options{Limits: l})
		},
		Proxy: func(t *testing.T, srv *azuretest.Server) *objstoretest.Proxy {
			p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{})
			t.Setenv("AZURE_STORAGE_CONNECTION_STRING", strings.Replace(srv.ConnectionString, srv.Endpoint, p.URL+"/"+azuretest.Account, 1))
			return p
		},
	})
}

// TestCredentials: the account is reached with its key
// (AZURE_STORAGE_KEY), with a read-and-list SAS token
// (AZURE_STORAGE_SAS_TOKEN) and from the connection string; anonymous
// requests to a private container, and a wrong key, fail the open with an
// error that is no ENOENT.
func TestCredentials(t *testing.T) {
	srv := azuretest.Shared(t)
	srv.Container(t, "private")
	require.NoError(t, srv.Put("private", "run/shard", []byte("bytes")))
	sasURL, err := srv.Client.ServiceClient().GetSASURL(sas.AccountResourceTypes{Container: true, Object: true},
		sas.AccountPermissions{Read: true, List: true}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	u, err := url.Parse(sasURL)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		env  map[string]string
		opts azure.Options
		ok   bool
	}{
		{"connection string", nil, azure.Options{}, true},
		{"key", map[string]string{"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_ACCOUNT": azuretest.Account, "AZURE_STORAGE_KEY": azuretest.Key},
			azure.Options{Endpoint: srv.Endpoint}, true},
		{"sas", map[string]string{"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_SAS_TOKEN": "?" + u.RawQuery},
			azure.Options{Account: azuretest.Account, Endpoint: srv.Endpoint}, true},
		{"anonymous", nil, azure.Options{Endpoint: srv.Endpoint, Anonymous: true}, false},
		{"wrong key", map[string]string{"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_KEY": "d3Jvbmc="},
			azure.Options{Account: azuretest.Account, Endpoint: srv.Endpoint}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tc.opts.MaxAttempts = 1
			tree, err := azure.Open(context.Background(), "az://private/run", tc.opts)
			if !tc.ok {
				require.Error(t, err)
				t.Log(err)
				require.NotErrorIs(t, err, fs.ErrNotExist)
				assert.Contains(t, err.Error(), "az://private/run")
				return
			}
			require.NoError(t, err)
			defer tree.Close()
			f, err := tree.Open("shard")
			require.NoError(t, err)
			buf := make([]byte, 5)
			_, err = f.ReadAt(buf, 0)
			require.NoError(t, err)
			assert.Equal(t, "bytes", string(buf))
		})
	}
	// A failed request names its URL without the SAS token's signature,
	// whether the store answered or could not be reached.
	t.Setenv("AZURE_STORAGE_CONNECTION_STRING", "")
	t.Setenv("AZURE_STORAGE_SAS_TOKEN", u.RawQuery)
	// Through a proxy, closed for the store that cannot be reached (the
	// shared server goes on serving).
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{})
	opts := azure.Options{Account: azuretest.Account, Endpoint: p.URL + "/" + azuretest.Account}
	opts.MaxAttempts = 1
	_, err = azure.Open(context.Background(), "az://nosuch/run", opts)
	require.Error(t, err)
	p.Close()
	_, err2 := azure.Open(context.Background(), "az://private/run", opts)
	require.Error(t, err2)
	for _, err := range []error{err, err2} {
		t.Log(err)
		assert.NotContains(t, err.Error(), "sig=")
		assert.NotContains(t, err.Error(), "\n")
	}
}

// TestIfMatchIgnored: a server that ignores If-Match (a proxy drops it;
// a SAS token signs no headers) and answers with the replaced blob's
// bytes fails the read with ErrChanged naming both ETags, never serving
// the new bytes.
func TestIfMatchIgnored(t *testing.T) {
	srv := azuretest.Shared(t)
	srv.Container(t, "ckpts")
	require.NoError(t, srv.Put("ckpts", "run/shard", bytes.Repeat([]byte("old!"), 16<<10)))
	sasURL, err := srv.Client.ServiceClient().GetSASURL(sas.AccountResourceTypes{Container: true, Object: true},
		sas.AccountPermissions{Read: true, List: true}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	u, err := url.Parse(sasURL)
	require.NoError(t, err)
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{})
	p.SetFault(func(r *http.Request) objstoretest.Fault {
		r.Header.Del("If-Match")
		return objstoretest.Fault{}
	})
	t.Setenv("AZURE_STORAGE_CONNECTION_STRING", "")
	t.Setenv("AZURE_STORAGE_SAS_TOKEN", u.RawQuery)
	tree, err := azure.Open(context.Background(), "az://ckpts/run", azure.Options{Account: azuretest.Account, Endpoint: p.URL + "/" + azuretest.Account})
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("shard")
	require.NoError(t, err)
	require.NoError(t, srv.Put("ckpts", "run/shard", bytes.Repeat([]byte("new!"), 16<<10)))
	buf := make([]byte, 32<<10)
	_, err = f.ReadAt(buf, 0)
	require.ErrorIs(t, err, source.ErrChanged)
	assert.Contains(t, err.Error(), "If-Match ignored")
	objstoretest.RequireEIO(t, err, "az://ckpts/run/shard")
	assert.False(t, bytes.Contains(buf, []byte("new!")), "bytes of another version were served")
}

// TestContentEncodingGzip: a blob stored with Content-Encoding: gzip (as
// azcopy --content-encoding or a web upload leaves it) is read as the bytes
// stored, at any range: Azure does not transcode, and the client must not
// decompress a range of it either.
func TestContentEncodingGzip(t *testing.T) {
	srv := azuretest.Shared(t)
	srv.Container(t, "ckpts")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(bytes.Repeat([]byte("compressible tensor bytes "), 64<<10))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	stored := gz.Bytes()
	enc := "gzip"
	_, err = srv.Client.UploadBuffer(context.Background(), "ckpts", "run/shard.gz", stored,
		&azblob.UploadBufferOptions{HTTPHeaders: &blob.HTTPHeaders{BlobContentEncoding: &enc}})
	require.NoError(t, err)
	tree, err := azure.Open(context.Background(), "az://ckpts/run", azure.Options{})
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
