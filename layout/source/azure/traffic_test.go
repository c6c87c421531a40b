package azure_test

import (
	"context"
	"io"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"

	"github.com/ckptfs/ckptfs/layout/source/azure"
	"github.com/ckptfs/ckptfs/layout/source/azure/azuretest"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestTraffic: what reads cost against Azurite, counted by a proxy in front
// of it (objstoretest.RunTraffic): a listing at open and one of the
// directory, then one ranged GET If-Match the opened ETag per request, no
// GetBlobProperties per read, connections reused.
func TestTraffic(t *testing.T) {
	srv := azuretest.Shared(t)
	srv.Container(t, "ckpts")
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{})
	t.Setenv("AZURE_STORAGE_KEY", azuretest.Key)
	objstoretest.RunTraffic(t, p,
		func(key string, data []byte) error { return srv.Put("ckpts", "run/"+key, data) },
		func(l objstore.Limits) (*objstore.Tree, error) {
			return azure.Open(context.Background(), "az://ckpts/run", azure.Options{Limits: l,
				Account: azuretest.Account, Endpoint: p.URL + "/" + azuretest.Account})
		})
}

// BenchmarkRanged: ranged reads through the tree against the SDK's own
// ranged reads of the same blobs, on Azurite (objstoretest.BenchRanged).
func BenchmarkRanged(b *testing.B) {
	srv := azuretest.Shared(b)
	srv.Container(b, "ckpts")
	objstoretest.BenchRanged(b,
		func(key string, data []byte) error { return srv.Put("ckpts", "run/"+key, data) },
		func(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
			r, err := srv.Client.DownloadStream(ctx, "ckpts", "run/"+key, &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: n}})
			if err != nil {
				return nil, err
			}
			return r.Body, nil
		},
		func(l objstore.Limits) (*objstore.Tree, error) {
			return azure.Open(context.Background(), "az://ckpts/run", azure.Options{Limits: l})
		})
}
