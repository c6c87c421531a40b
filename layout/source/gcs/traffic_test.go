package gcs_test

import (
	"context"
	"io"
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/gcs"
	"github.com/ckptfs/ckptfs/layout/source/gcs/gcstest"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// TestTraffic: what reads cost against fake-gcs-server, counted by a proxy
// in front of it (objstoretest.RunTraffic): a listing at open and one of
// the directory, then one ranged GET of the opened generation per request,
// no metadata call per read, connections reused.
func TestTraffic(t *testing.T) {
	srv := gcstest.Shared(t)
	srv.Bucket(t, "ckpts")
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{TargetHost: true})
	t.Setenv("STORAGE_EMULATOR_HOST", p.Host) // srv.Client, which puts, goes on reaching the server
	objstoretest.RunTraffic(t, p,
		func(key string, data []byte) error { return srv.Put("ckpts", "run/"+key, data) },
		func(l objstore.Limits) (*objstore.Tree, error) {
			return gcs.Open(context.Background(), "gs://ckpts/run", gcs.Options{Limits: l})
		})
}

// BenchmarkRanged: ranged reads through the tree against the SDK's own
// ranged reads of the same objects, on fake-gcs-server
// (objstoretest.BenchRanged).
func BenchmarkRanged(b *testing.B) {
	srv := gcstest.Shared(b)
	srv.Bucket(b, "ckpts")
	bkt := srv.Client.Bucket("ckpts")
	objstoretest.BenchRanged(b,
		func(key string, data []byte) error { return srv.Put("ckpts", "run/"+key, data) },
		func(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
			return bkt.Object("run/"+key).ReadCompressed(true).NewRangeReader(ctx, off, n)
		},
		func(l objstore.Limits) (*objstore.Tree, error) {
			return gcs.Open(context.Background(), "gs://ckpts/run", gcs.Options{Limits: l})
		})
}
