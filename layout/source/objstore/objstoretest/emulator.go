package objstoretest

import (
	"fmt"
	"testing"

	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Emulator is a store's server started by the tests (gcstest.Server,
// azuretest.Server): objects by bucket, and its process.
type Emulator interface {
	Put(bucket, key string, data []byte) error
	Delete(bucket, key string) error
	Process() *Process
}

// Emulated describes how the suite reaches one store's emulator.
type Emulated[E Emulator] struct {
	Scheme string                                 // of the tree URLs: "gs", "az"
	Shared func(t testing.TB) E                   // the server the package's tests share (Servers.Shared)
	Start  func(t testing.TB) E                   // a fresh server, stopped at the end of t
	Bucket func(t testing.TB, srv E, name string) // makes an empty bucket (a shared server's removed at the end of t)
	// Open opens the tree at url as the store's package does.
	Open func(url string, l objstore.Limits) (*objstore.Tree, error)
	// Proxy starts a proxy in front of srv and points the store's standard
	// chain at it for t (Store.Proxy).
	Proxy func(t *testing.T, srv E) *Proxy
}

// RunEmulator runs Run against e: the package's shared server, a bucket
// of its own for each case, and a server of its own for a case that stops
// it.
func RunEmulator[E Emulator](t *testing.T, e Emulated[E]) {
	shared := e.Shared(t)
	n := 0
	Run(t, func(t *testing.T, own bool) Store {
		srv := shared
		if own {
			srv = e.Start(t)
		}
		n++
		bucket := fmt.Sprintf("ckpts%d", n)
		e.Bucket(t, srv, bucket)
		return emulatedStore[E]{e: e, srv: srv, bucket: bucket}
	})
}

// emulatedStore is a bucket of an emulator, as Run sees a store.
type emulatedStore[E Emulator] struct {
	e      Emulated[E]
	srv    E
	bucket string
}

func (s emulatedStore[E]) URL(prefix string) string {
	return s.e.Scheme + "://" + s.bucket + "/" + prefix
}
func (s emulatedStore[E]) Put(key string, data []byte) error { return s.srv.Put(s.bucket, key, data) }
func (s emulatedStore[E]) Delete(key string) error           { return s.srv.Delete(s.bucket, key) }
func (s emulatedStore[E]) Process() *Process                 { return s.srv.Process() }
func (s emulatedStore[E]) Proxy(t *testing.T) *Proxy         { return s.e.Proxy(t, s.srv) }
func (s emulatedStore[E]) Open(url string, l objstore.Limits) (*objstore.Tree, error) {
	return s.e.Open(url, l)
}
