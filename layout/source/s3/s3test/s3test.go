// Package s3test starts a real S3-compatible server for tests on
// 127.0.0.1, with credentials for it in the environment: moto's standalone
// server (PyPI moto[server], installed in the e2e virtual environment;
// without it a test is skipped, unless CKPTFS_REQUIRE_PYTHON=1, which makes
// it fail, as make test sets) or versitygw (StartGateway), a Go S3 gateway
// that checks signatures and bucket policies. objstoretest.StartProxy
// sits between a client and either, recording requests and injecting
// faults.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// Server is a running moto server or versitygw.
type Server struct {
	// Endpoint is its URL: http://127.0.0.1:PORT.
	Endpoint string
	// Client talks to it, for setting up buckets and objects.
	Client *awss3.Client
	proc   *objstoretest.Process

	// versitygw only (StartGateway): its data directory and region.
	dir, region string
	shared      bool // Shared's: buckets are removed at the end of their test
}

// Python finds a Python that has moto's server: $CKPTFS_PYTHON, else the
// e2e virtual environment of the module (skipping or failing t as
// testenv.Python does).
func Python(t testing.TB) string {
	t.Helper()
	return testenv.Python(t, "moto.server")
}

var motos = objstoretest.Servers[*Server]{Run: startMoto, Env: (*Server).setEnv}

// Start starts a moto server for the test, stopped at its end, and sets
// the AWS_* environment (test credentials, region, AWS_ENDPOINT_URL) so
// that clients built from the standard chain reach it.
func Start(t *testing.T) *Server { return motos.Start(t) }

// Shared is the moto server that the package's tests share, with the
// environment set for t as Start sets it (objstoretest.Servers; the
// package's TestMain calls objstoretest.Main). A test makes buckets of its
// own on it, and does not kill or freeze it.
func Shared(t *testing.T) *Server { return motos.Shared(t) }

// startMoto runs moto's server, started by serve.
func startMoto(t testing.TB, serve objstoretest.ServeFunc, shared bool) *Server {
	t.Helper()
	py := Python(t)
	port := objstoretest.FreePort(t)
	cmd := exec.Command(py, "-m", "moto.server", "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), shared: shared}
	s.proc = serve(t, "moto server", cmd, s.Endpoint+"/moto-api/")
	s.Client = awss3.New(awss3.Options{
		BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true, Region: "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("testing", "testing", ""),
	})
	return s
}

// setEnv points the standard chain at a moto server for t.
func (s *Server) setEnv(t testing.TB) {
	t.Helper()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
		"AWS_ENDPOINT_URL": s.Endpoint, "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	t.Setenv("AWS_SESSION_TOKEN", "")
}

// Signal sends sig to the server process (SIGSTOP stops it answering,
// SIGCONT resumes it).
func (s *Server) Signal(t testing.TB, sig syscall.Signal) { s.proc.Signal(t, sig) }

// Process is the server's process, to freeze or kill.
func (s *Server) Process() *objstoretest.Process { return s.proc }

// Bucket creates a bucket; on a Shared server, removed with its objects
// at the end of the test.
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Client.CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatal(err)
	}
	if !s.shared {
		return
	}
	t.Cleanup(func() {
		pages := awss3.NewListObjectsV2Paginator(s.Client, &awss3.ListObjectsV2Input{Bucket: &name})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				t.Errorf("empty bucket %s: %v", name, err)
				return
			}
			for _, o := range page.Contents {
				if _, err := s.Client.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: &name, Key: o.Key}); err != nil {
					t.Errorf("empty bucket %s: %v", name, err)
					return
				}
			}
		}
		if _, err := s.Client.DeleteBucket(ctx, &awss3.DeleteBucketInput{Bucket: &name}); err != nil {
			t.Errorf("delete bucket %s: %v", name, err)
		}
	})
}

// Put writes an object and returns its ETag.
func (s *Server) Put(t testing.TB, bucket, key string, data []byte) string {
	t.Helper()
	out, err := s.Client.PutObject(context.Background(), &awss3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)})
	if err != nil {
		t.Fatalf("put s3://%s/%s: %v", bucket, key, err)
	}
	return aws.ToString(out.ETag)
}

// Delete removes an object.
func (s *Server) Delete(t testing.TB, bucket, key string) {
	t.Helper()
	if _, err := s.Client.DeleteObject(context.Background(), &awss3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
		t.Fatalf("delete s3://%s/%s: %v", bucket, key, err)
	}
}

// Upload copies the local directory dir to the bucket under prefix.
func (s *Server) Upload(t testing.TB, bucket, prefix, dir string) {
	t.Helper()
	objstoretest.UploadDir(t, prefix, dir, func(key string, data []byte) error {
		s.Put(t, bucket, key, data)
		return nil
	})
}
