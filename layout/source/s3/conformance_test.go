package s3_test

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"strings"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// TestEmulator: the cases every store passes (objstoretest.Run) against
// versitygw, started by the test, reached through AWS_ENDPOINT_URL as
// StartGateway sets it (a server of a case's own sets it for that case).
func TestEmulator(t *testing.T) {
	objstoretest.RunEmulator(t, objstoretest.Emulated[gateway]{
		Scheme: "s3",
		Shared: startGateway,
		Start:  startGateway,
		Bucket: func(t testing.TB, g gateway, name string) { g.srv.Bucket(t, name) },
		Open: func(url string, l objstore.Limits) (*objstore.Tree, error) {
			return s3.Open(context.Background(), url, s3.Options{MaxAttempts: l.MaxAttempts, ReadTimeout: l.ReadTimeout,
				MinRate: l.MinRate, ListTTL: l.ListTTL, ObserveRequest: l.ObserveRequest, MinRequest: l.MinRequest,
				AheadMemory: l.AheadMemory})
		},
		Proxy: func(t *testing.T, g gateway) *objstoretest.Proxy {
			p := objstoretest.StartProxy(t, g.srv.Endpoint, objstoretest.ProxyOptions{})
			t.Setenv("AWS_ENDPOINT_URL", p.URL)
			return p
		},
	})
}

// startGateway starts a versitygw of the test's own: one starts in a
// fraction of a second.
func startGateway(t testing.TB) gateway {
	return gateway{s3test.StartGateway(t, s3test.GatewayOptions{})}
}

// gateway is a versitygw as objstoretest.Emulator sees a server: errors
// returned, not failed on.
type gateway struct{ srv *s3test.Server }

// Put refuses a key that versitygw's posix backend keeps under another
// name, as a store that cannot keep it: it stores a key as a file path,
// cleaned ("run//x" and "run/./x" as "run/x", "run/../x" as "x", seen on
// 1.8.0), and the suite would take the cleaned key's name for one the tree
// made up.
func (g gateway) Put(bucket, key string, data []byte) error {
	if k := strings.TrimSuffix(key, "/"); path.Clean(k) != k {
		return fmt.Errorf("versitygw's posix backend would keep %q as %q", key, path.Clean(k))
	}
	_, err := g.srv.Client.PutObject(context.Background(), &awss3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)})
	return err
}

func (g gateway) Delete(bucket, key string) error {
	_, err := g.srv.Client.DeleteObject(context.Background(), &awss3.DeleteObjectInput{Bucket: &bucket, Key: &key})
	return err
}

func (g gateway) Process() *objstoretest.Process { return g.srv.Process() }
