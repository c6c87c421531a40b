// Package azuretest starts Azurite, Microsoft's Azure Storage emulator (npm
// package azurite; its Blob service, in memory), on 127.0.0.1 for tests,
// with AZURE_STORAGE_CONNECTION_STRING naming it: $CKPTFS_AZURITE (its
// azurite-blob script), else .tools/azurite/node_modules/.bin/azurite-blob
// of the module (make tools installs it). Without it a test is skipped,
// unless CKPTFS_REQUIRE_SYSTEM=1 or $CKPTFS_AZURITE is set, which make it
// fail.
package azuretest

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// Azurite's well-known development account.
const (
	Account = "devstoreaccount1"
	Key     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Server is a running Azurite.
type Server struct {
	// Endpoint is the account's blob service URL:
	// http://127.0.0.1:PORT/devstoreaccount1.
	Endpoint string
	// ConnectionString names it with the account's key.
	ConnectionString string
	// Client talks to it, for setting up containers and blobs.
	Client *azblob.Client
	proc   *objstoretest.Process
	shared bool // Shared's: containers are removed at the end of their test
}

var servers = objstoretest.Servers[*Server]{Run: start, Env: (*Server).setEnv}

// Start starts Azurite's Blob service for the test, stopped at its end, and
// sets AZURE_STORAGE_CONNECTION_STRING to it (AZURE_STORAGE_ACCOUNT,
// _KEY and _SAS_TOKEN empty).
func Start(t testing.TB) *Server { return servers.Start(t) }

// Shared is the Azurite that the package's tests share, with the
// environment set for t as Start sets it (objstoretest.Servers; the
// package's TestMain calls objstoretest.Main). A test makes containers of
// its own on it, and does not kill or freeze it.
func Shared(t testing.TB) *Server { return servers.Shared(t) }

// start runs Azurite's Blob service, started by serve.
func start(t testing.TB, serve objstoretest.ServeFunc, shared bool) *Server {
	t.Helper()
	bin := objstoretest.Tool(t, "CKPTFS_AZURITE", "azurite/node_modules/.bin/azurite-blob")
	port := objstoretest.FreePort(t)
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/%s", port, Account), shared: shared}
	// Without --disableTelemetry, Azurite queues its telemetry for a
	// collector it cannot reach in a /tmp folder it leaves behind.
	cmd := exec.Command(bin, "--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(port), "--inMemoryPersistence",
		"--skipApiVersionCheck", "--disableProductStyleUrl", "--disableTelemetry", "--silent")
	s.proc = serve(t, "azurite", cmd, s.Endpoint+"?comp=list")
	s.ConnectionString = fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;", Account, Key, s.Endpoint)
	c, err := azblob.NewClientFromConnectionString(s.ConnectionString, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Client = c
	return s
}

// setEnv points the standard chain at s for t.
func (s *Server) setEnv(t testing.TB) {
	t.Helper()
	t.Setenv("AZURE_STORAGE_CONNECTION_STRING", s.ConnectionString)
	for _, k := range []string{"AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"} {
		t.Setenv(k, "")
	}
}

// Process is the server's process, to kill or freeze.
func (s *Server) Process() *objstoretest.Process { return s.proc }

// Container creates a container; on a Shared server, removed with its
// blobs at the end of the test.
func (s *Server) Container(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateContainer(context.Background(), name, nil); err != nil {
		t.Fatalf("create container %s: %v", name, err)
	}
	if s.shared {
		t.Cleanup(func() {
			if _, err := s.Client.DeleteContainer(context.Background(), name, nil); err != nil {
				t.Errorf("delete container %s: %v", name, err)
			}
		})
	}
}

// Put writes a blob.
func (s *Server) Put(container, key string, data []byte) error {
	_, err := s.Client.UploadBuffer(context.Background(), container, key, data, nil)
	return err
}

// Delete removes a blob.
func (s *Server) Delete(container, key string) error {
	_, err := s.Client.DeleteBlob(context.Background(), container, key, nil)
	return err
}

// Upload copies the local directory dir to the container under prefix.
func (s *Server) Upload(t testing.TB, container, prefix, dir string) {
	t.Helper()
	objstoretest.UploadDir(t, prefix, dir, func(key string, data []byte) error {
		return s.Put(container, key, data)
	})
}
