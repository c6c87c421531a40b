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
	"strings"
	"testing"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// Server is a running fake-gcs-server.
type Server struct {
	// Endpoint is its URL: http://127.0.0.1:PORT.
	Endpoint string
	// Client talks to it, for setting up buckets and objects.
	Client *storage.Client
	proc   *objstoretest.Process
	shared bool // Shared's: buckets are removed at the end of their test
}

var servers = objstoretest.Servers[*Server]{Run: start, Env: (*Server).setEnv}

// Start starts a server for the test, stopped at its end, and sets
// STORAGE_EMULATOR_HOST to it.
func Start(t testing.TB) *Server { return servers.Start(t) }

// Shared is the fake-gcs-server that the package's tests share, with
// STORAGE_EMULATOR_HOST set for t as Start sets it (objstoretest.Servers;
// the package's TestMain calls objstoretest.Main). A test makes buckets of
// its own on it, and does not kill or freeze it.
func Shared(t testing.TB) *Server { return servers.Shared(t) }

// start runs fake-gcs-server, started by serve.
func start(t testing.TB, serve objstoretest.ServeFunc, shared bool) *Server {
	t.Helper()
	bin := objstoretest.Tool(t, "CKPTFS_FAKE_GCS", "bin/fake-gcs-server")
	port := objstoretest.FreePort(t)
	host := fmt.Sprintf("127.0.0.1:%d", port)
	s := &Server{Endpoint: "http://" + host, shared: shared}
	cmd := exec.Command(bin, "-scheme", "http", "-host", "127.0.0.1", "-port", fmt.Sprint(port),
		"-backend", "memory", "-public-host", host, "-external-url", s.Endpoint, "-log-level", "error")
	s.proc = serve(t, "fake-gcs-server", cmd, s.Endpoint+"/storage/v1/b")
	// The client reaches the server whatever STORAGE_EMULATOR_HOST a test
	// sets later (a proxy's): it reads the variable once, here.
	s.setEnv(t)
	c, err := storage.NewClient(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !shared {
		t.Cleanup(func() { c.Close() })
	}
	s.Client = c
	return s
}

// setEnv points the standard chain at s for t.
func (s *Server) setEnv(t testing.TB) {
	t.Helper()
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(s.Endpoint, "http://"))
}

// Process is the server's process, to kill or freeze.
func (s *Server) Process() *objstoretest.Process { return s.proc }

// Bucket creates a bucket; on a Shared server, removed with its objects at
// the end of the test.
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	b := s.Client.Bucket(name)
	if err := b.Create(context.Background(), "ckptfs-test", nil); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
	if !s.shared {
		return
	}
	t.Cleanup(func() {
		ctx := context.Background()
		objs := b.Objects(ctx, nil)
		for {
			o, err := objs.Next()
			if err == iterator.Done {
				break
			}
			if err == nil {
				err = b.Object(o.Name).Delete(ctx)
			}
			if err != nil {
				t.Errorf("empty bucket %s: %v", name, err)
				return
			}
		}
		if err := b.Delete(ctx); err != nil {
			t.Errorf("delete bucket %s: %v", name, err)
		}
	})
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
