// Package s3test starts a real S3-compatible server for tests on
// 127.0.0.1, with credentials for it in the environment: moto's standalone
// server (PyPI moto[server], installed in the e2e virtual environment;
// without it a test is skipped, unless CKPTFS_REQUIRE_PYTHON=1, which makes
// it fail, as make test sets) or versitygw (StartGateway), a Go S3 gateway
// that checks signatures and bucket policies. Proxy sits between a client
// and either, recording requests and injecting faults.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/procfs"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// Server is a running moto server or versitygw.
type Server struct {
	// Endpoint is its URL: http://127.0.0.1:PORT.
	Endpoint string
	// Client talks to it, for setting up buckets and objects.
	Client *awss3.Client
	cmd    *exec.Cmd

	// versitygw only (StartGateway): its data directory and region.
	dir, region string
}

// Python finds a Python that has moto's server: $CKPTFS_PYTHON, else the
// e2e virtual environment of the module (skipping or failing t as
// testenv.Python does).
func Python(t testing.TB) string {
	t.Helper()
	return testenv.Python(t, "moto.server")
}

// Start starts a server for the test, stopped at its end, and sets the
// AWS_* environment (test credentials, region, AWS_ENDPOINT_URL) so that
// clients built from the standard chain reach it.
func Start(t *testing.T) *Server {
	t.Helper()
	py := Python(t)
	port := freePort(t)
	cmd := exec.Command(py, "-m", "moto.server", "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	serve(t, "moto server", cmd, s.Endpoint+"/moto-api/")
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
		"AWS_ENDPOINT_URL": s.Endpoint, "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	t.Setenv("AWS_SESSION_TOKEN", "")
	s.Client = awss3.New(awss3.Options{
		BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true, Region: "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("testing", "testing", ""),
	})
	return s
}

// Signal sends sig to the server process (SIGSTOP stops it answering,
// SIGCONT resumes it).
func (s *Server) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGSTOP {
		return
	}
	// A stop takes each thread as it next leaves the kernel: wait until the
	// whole process is stopped, or a request sent now may still be served.
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := procfs.NewProc(s.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.Stat(); err == nil && st.State == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not stop")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bucket creates a bucket.
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateBucket(context.Background(), &awss3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatal(err)
	}
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
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s.Put(t, bucket, prefix+"/"+filepath.ToSlash(rel), data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// freePort is a TCP port of 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// serve starts cmd, a server of what (for messages), killed at the end of
// the test (and with the test process), and waits until url gets an HTTP
// answer (any status: a 403 to an anonymous request is a server up). Its
// output is logged when the test failed.
func serve(t testing.TB, what string, cmd *exec.Cmd, url string) {
	t.Helper()
	log := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", what, tail(log.Bytes(), 4000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s did not answer: %v", what, url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
