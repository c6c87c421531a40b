package azure_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/azure"
	"github.com/ckptfs/ckptfs/layout/source/azure/azuretest"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// store is a bucket of its own on a running Azurite.
type store struct {
	*azuretest.Server
	bucket string
}

func (s store) URL(prefix string) string          { return "az://" + s.bucket + "/" + prefix }
func (s store) Put(key string, data []byte) error { return s.Server.Put(s.bucket, key, data) }
func (s store) Delete(key string) error           { return s.Server.Delete(s.bucket, key) }
func (s store) Process() *objstoretest.Process    { return s.Server.Process() }
func (s store) Open(url string, l objstore.Limits) (*objstore.Tree, error) {
	return azure.Open(context.Background(), url, azure.Options{Limits: l})
}

// TestEmulator: the cases every store passes (objstoretest.Run) against
// Azurite, through AZURE_STORAGE_CONNECTION_STRING; one server for the cases that do not stop it.
func TestEmulator(t *testing.T) {
	shared := azuretest.Start(t)
	n := 0
	objstoretest.Run(t, func(t *testing.T, own bool) objstoretest.Store {
		srv := shared
		if own {
			srv = azuretest.Start(t)
		}
		n++
		bucket := fmt.Sprintf("ckpts%d", n)
		srv.Container(t, bucket)
		return store{srv, bucket}
	})
}
