package s3_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// noCredentials leaves the standard chain nothing: no keys in the
// environment, no files, no instance metadata (StartGateway disables it).
func noCredentials(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
}

func readAll(t *testing.T, tree *s3.Tree, name string) []byte {
	t.Helper()
	f, err := tree.Open(name)
	require.NoError(t, err)
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, f.Info().Size))
	require.NoError(t, err)
	return b
}

// TestNoSignRequest: a public bucket (a policy granting "*" list and get) on
// a real gateway reads unsigned, without any credentials; without
// NoSignRequest and without credentials, Open fails at once with one line
// that names the missing credentials and the way to read a public bucket.
func TestNoSignRequest(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{})
	g.Bucket(t, "public")
	g.Put(t, "public", "ckpt/shard", []byte("public bytes"))
	g.PublicRead(t, "public")
	g.Bucket(t, "private")
	g.Put(t, "private", "ckpt/shard", []byte("private bytes"))
	noCredentials(t)

	_, err := s3.Open(context.Background(), "s3://public/ckpt", s3.Options{})
	require.ErrorIs(t, err, s3.ErrNoCredentials)
	assert.NotContains(t, err.Error(), "\n")
	assert.Contains(t, err.Error(), "s3://public/ckpt")
	assert.Contains(t, err.Error(), "--no-sign-request")
	t.Log(err)

	tree, err := s3.Open(context.Background(), "s3://public/ckpt", s3.Options{NoSignRequest: true})
	require.NoError(t, err)
	defer tree.Close()
	assert.Equal(t, "public bytes", string(readAll(t, tree, "shard")))

	// Unsigned is anonymous: a private bucket refuses it (no credentials
	// are sent, nor looked up).
	_, err = s3.Open(context.Background(), "s3://private/ckpt", s3.Options{NoSignRequest: true})
	require.ErrorIs(t, err, s3.ErrRequest)
	assert.Contains(t, err.Error(), "AccessDenied")
}

// TestRequesterPays: a requester-pays bucket (the proxy answers a request
// without x-amz-request-payer: requester with S3's 403 AccessDenied, as
// S3 does) reads with the option, every request (list, head, ranged get)
// carrying the header signed; without it, Open fails at once with one
// line naming the bucket and the refusal, and no request carries it.
func TestRequesterPays(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{})
	g.Bucket(t, "pays")
	g.Put(t, "pays", "ckpt/shard", []byte("billed to the reader"))
	for _, pays := range []bool{true, false} {
		proxy := objstoretest.StartProxy(t, g.Endpoint, objstoretest.ProxyOptions{})
		proxy.SetFault(func(r *http.Request) objstoretest.Fault {
			if r.Header.Get("X-Amz-Request-Payer") != "requester" {
				return objstoretest.Fault{Status: http.StatusForbidden, Code: "AccessDenied"}
			}
			return objstoretest.Fault{}
		})
		tree, err := s3.Open(context.Background(), "s3://pays/ckpt", s3.Options{Endpoint: proxy.URL, RequesterPays: pays,
			ListTTL: time.Nanosecond})
		reqs := proxy.Requests()
		require.NotEmpty(t, reqs)
		if !pays {
			require.ErrorIs(t, err, s3.ErrRequest)
			require.ErrorIs(t, err, source.ErrDenied)
			assert.NotContains(t, err.Error(), "\n")
			assert.Contains(t, err.Error(), "s3://pays/ckpt")
			assert.Contains(t, err.Error(), "AccessDenied")
			assert.Contains(t, err.Error(), "--requester-pays")
			t.Log(err)
			for _, r := range reqs {
				assert.Empty(t, r.Header.Get("X-Amz-Request-Payer"), r.Method+" "+r.Path)
			}
			continue
		}
		require.NoError(t, err)
		names, err := tree.ReadDir(".")
		require.NoError(t, err)
		require.Len(t, names, 1)
		// The listing has expired (ListTTL): this stat asks the store again.
		_, err = tree.Stat("shard")
		require.NoError(t, err)
		assert.Equal(t, "billed to the reader", string(readAll(t, tree, "shard")))
		tree.Close()
		methods := map[string]bool{}
		for _, r := range proxy.Requests() {
			methods[r.Method] = true
			assert.Equal(t, "requester", r.Header.Get("X-Amz-Request-Payer"), r.Method+" "+r.Path)
			assert.Contains(t, signedHeaders(r.Header), "x-amz-request-payer", r.Method+" "+r.Path)
		}
		assert.Equal(t, map[string]bool{http.MethodGet: true, http.MethodHead: true}, methods)
	}
}

// signedHeaders is the SignedHeaders list of a SigV4 Authorization header.
func signedHeaders(h http.Header) []string {
	_, rest, _ := strings.Cut(h.Get("Authorization"), "SignedHeaders=")
	list, _, _ := strings.Cut(rest, ",")
	return strings.Split(list, ";")
}

// TestRegion: a gateway in eu-west-3 refuses requests signed for the
// default region; Options.Region signs for its own (the credential scope of
// every request names it).
func TestRegion(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{Region: "eu-west-3"})
	g.Bucket(t, "regional")
	g.Put(t, "regional", "ckpt/shard", []byte("in paris"))
	t.Setenv("AWS_REGION", "")
	proxy := objstoretest.StartProxy(t, g.Endpoint, objstoretest.ProxyOptions{})

	_, err := s3.Open(context.Background(), "s3://regional/ckpt", s3.Options{Endpoint: proxy.URL})
	require.ErrorIs(t, err, s3.ErrRequest)
	t.Log(err)

	proxy = objstoretest.StartProxy(t, g.Endpoint, objstoretest.ProxyOptions{})
	tree, err := s3.Open(context.Background(), "s3://regional/ckpt", s3.Options{Endpoint: proxy.URL, Region: "eu-west-3"})
	require.NoError(t, err)
	defer tree.Close()
	assert.Equal(t, "in paris", string(readAll(t, tree, "shard")))
	reqs := proxy.Requests()
	require.NotEmpty(t, reqs)
	for _, r := range reqs {
		assert.Contains(t, r.Header.Get("Authorization"), "/eu-west-3/s3/aws4_request", r.Method+" "+r.Path)
	}
}

// TestProfile: Options.Profile reads keys and region of a named profile
// from the files AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE name; the
// default profile there holds keys the gateway refuses.
func TestProfile(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{Region: "ap-south-1"})
	g.Bucket(t, "profiled")
	g.Put(t, "profiled", "ckpt/shard", []byte("by profile"))
	noCredentials(t)
	t.Setenv("AWS_REGION", "")
	dir := t.TempDir()
	config, creds := filepath.Join(dir, "config"), filepath.Join(dir, "credentials")
	require.NoError(t, os.WriteFile(config, []byte("[default]\nregion = ap-south-1\n\n[profile training]\nregion = ap-south-1\n"), 0o600))
	require.NoError(t, os.WriteFile(creds, []byte("[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n"+
		"[training]\naws_access_key_id = "+s3test.GatewayAccessKey+"\naws_secret_access_key = "+s3test.GatewaySecretKey+"\n"), 0o600))
	t.Setenv("AWS_CONFIG_FILE", config)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)

	_, err := s3.Open(context.Background(), "s3://profiled/ckpt", s3.Options{})
	require.ErrorIs(t, err, s3.ErrRequest, "the default profile's keys")

	tree, err := s3.Open(context.Background(), "s3://profiled/ckpt", s3.Options{Profile: "training"})
	require.NoError(t, err)
	defer tree.Close()
	assert.Equal(t, "by profile", string(readAll(t, tree, "shard")))

	_, err = s3.Open(context.Background(), "s3://profiled/ckpt", s3.Options{Profile: "missing"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing")
	assert.NotErrorIs(t, err, source.ErrChanged)
}
