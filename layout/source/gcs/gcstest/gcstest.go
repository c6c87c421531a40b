// Package gcstest starts fake-gcs-server, a GCS emulator written in Go, on
// 127.0.0.1 for tests (in memory), with STORAGE_EMULATOR_HOST pointing at
// it: $CKPTFS_FAKE_GCS, else .tools/bin/fake-gcs-server of the module (make
// tools installs it). Without it a test is skipped, unless
// CKPTFS_REQUIRE_SYSTEM=1 or $CKPTFS_FAKE_GCS is set, which make it fail.
package gcstest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"testing"

	"cloud.google.com/go/storage"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// Server is a running fake-gcs-server.
type Server struct {
	// Endpoint is its URL: http://127.0.0.1:PORT.
	Endpoint string
	// Client talks to it, for setting up buckets and objects.
	Client *storage.Client
	proc   *objstoretest.Process
}

// Start starts a server for the test, stopped at its end, and sets
// STORAGE_EMULATOR_HOST to it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := objstoretest.Tool(t, "CKPTFS_FAKE_GCS", "bin/fake-gcs-server")
	port := objstoretest.FreePort(t)
	host := fmt.Sprintf("127.0.0.1:%d", port)
	s := &Server{Endpoint: "http://" + host}
	cmd := exec.Command(bin, "-scheme", "http", "-host", "127.0.0.1", "-port", fmt.Sprint(port),
		"-backend", "memory", "-public-host", host, "-external-url", s.Endpoint, "-log-level", "error")
	s.proc = objstoretest.Serve(t, "fake-gcs-server", cmd, s.Endpoint+"/storage/v1/b")
	t.Setenv("STORAGE_EMULATOR_HOST", host)
	c, err := storage.NewClient(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s.Client = c
	return s
}

// Process is the server's process, to kill or freeze.
func (s *Server) Process() *objstoretest.Process { return s.proc }

// Bucket creates a bucket.
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	if err := s.Client.Bucket(name).Create(context.Background(), "ckptfs-test", nil); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// Put writes an object.
func (s *Server) Put(bucket, key string, data []byte) error {
	w := s.Client.Bucket(bucket).Object(key).NewWriter(context.Background())
	if _, err := io.Copy(w, bytes.NewReader(data)); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// Delete removes an object.
func (s *Server) Delete(bucket, key string) error {
	return s.Client.Bucket(bucket).Object(key).Delete(context.Background())
}

// Upload copies the local directory dir to the bucket under prefix.
func (s *Server) Upload(t testing.TB, bucket, prefix, dir string) {
	t.Helper()
	objstoretest.UploadDir(t, prefix, dir, func(key string, data []byte) error {
		return s.Put(bucket, key, data)
	})
}
