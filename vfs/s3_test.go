package vfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// TestTreeMount mounts fixtures uploaded to a real S3-compatible server:
// every view file equals the export of the local checkpoint, the stats show
// the requests, and an object replaced under the mount gives EIO.
func TestTreeMount(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "ckpts")
	cases := []string{"fsdp2_4ranks", "hf_sharded"}
	for _, name := range cases {
		srv.Upload(t, "ckpts", "run/"+name, filepath.Join(fixture(t, name), "ckpt"))
	}
	tree, err := s3.Open(context.Background(), "s3://ckpts/run", s3.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	// DirectReads is for local sources: a remote one is read through the
	// block cache all the same.
	fsys := newFS(t, "", func(o *Options) { o.Tree = tree; o.DirectReads = true })
	mnt := testMount(t, fsys)
	require.Equal(t, append([]string{statsName}, cases...), listDir(t, mnt))
	for _, name := range cases {
		requireSameFiles(t, exported(t, filepath.Join(fixture(t, name), "ckpt")), filepath.Join(mnt, name))
	}
	b, err := os.ReadFile(filepath.Join(mnt, statsName))
	require.NoError(t, err)
	var st Stats
	require.NoError(t, json.Unmarshal(b, &st))
	require.Equal(t, "s3://ckpts/run", st.Source)
	require.NotNil(t, st.SourceIO)
	require.Positive(t, st.SourceIO.Requests)
	require.Positive(t, st.SourceIO.BytesFetched)
	require.Zero(t, st.SourceIO.Errors)
	require.Positive(t, st.Cache.Fills)
}

// TestTreeObjectReplaced: an object replaced under a mount fails the reads
// of a handle opened before (uncached blocks) and every later open with
// EIO, never serving a mix.
func TestTreeObjectReplaced(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "ckpts")
	dir := filepath.Join(fixture(t, "fsdp2_4ranks"), "ckpt")
	srv.Upload(t, "ckpts", "run/step", dir)
	tree, err := s3.Open(context.Background(), "s3://ckpts/run", s3.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	mnt := testMount(t, newFS(t, "", func(o *Options) { o.Tree = tree }))
	f, err := os.Open(filepath.Join(mnt, "step", "model.safetensors"))
	require.NoError(t, err)
	defer f.Close()

	fi, err := os.Stat(filepath.Join(dir, "__1_0.distcp"))
	require.NoError(t, err)
	srv.Put(t, "ckpts", "run/step/__1_0.distcp", bytes.Repeat([]byte{0x5a}, int(fi.Size())))
	_, err = io.ReadAll(f)
	require.True(t, errors.Is(err, syscall.EIO), "read after the object changed: %v", err)
	time.Sleep(s3.DefaultListTTL) // past the listing that answered the first open
	_, err = os.ReadFile(filepath.Join(mnt, "step", "model.safetensors"))
	require.True(t, errors.Is(err, syscall.EIO), "open after the object changed: %v", err)
}

// TestTreeReadOnly: a tree other than a local directory cannot be
// mounted writable; a directory of a local tree can.
func TestTreeReadOnly(t *testing.T) {
	local, err := source.OpenLocal(fixture(t, "sample"))
	require.NoError(t, err)
	defer local.Close()
	sub, err := source.Sub(local, "ckpt")
	require.NoError(t, err)
	c := newFS(t, fixture(t, "sample")).opts.Cache
	notLocal := struct{ source.Tree }{sub} // as an object store's tree: not a source.Local
	_, err = New(Options{Tree: notLocal, Cache: c, Writable: true})
	require.ErrorContains(t, err, "writable mount needs a local directory")
	w, err := New(Options{Tree: sub, Cache: c, Writable: true})
	require.NoError(t, err)
	w.Close()
	fsys, err := New(Options{Tree: sub, Cache: c})
	require.NoError(t, err)
	defer fsys.Close()
	require.Nil(t, fsys.Stats().SourceIO, "a local tree counts no traffic")
}

// TestTreeMountGatewayFrozen: a real S3-compatible server (s3test) frozen (SIGSTOP)
// under a mount. A read of a view file opened before fails with EIO within
// one block's retry budget (not twice it: the kernel's second read of the
// failed page is answered from the failure), and a lookup of a name not
// seen before fails with EIO (never ENOENT) within a listing's budget.
func TestTreeMountGatewayFrozen(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "ckpts")
	srv.Upload(t, "ckpts", "run/step", filepath.Join(fixture(t, "fsdp2_4ranks"), "ckpt"))
	opts := s3.Options{MaxAttempts: 2, ReadTimeout: time.Second, MinRate: 1 << 30}
	tree, err := s3.Open(context.Background(), "s3://ckpts/run", opts)
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	fsys := newFS(t, "", func(o *Options) { o.Tree = tree; o.ReadDeadline = opts.Budget(1 << 20) })
	mnt := testMount(t, fsys)
	f, err := os.Open(filepath.Join(mnt, "step", "model.safetensors"))
	require.NoError(t, err)
	defer f.Close()

	srv.Signal(t, syscall.SIGSTOP)
	defer srv.Signal(t, syscall.SIGCONT)
	budget := opts.Budget(1 << 20)
	start := time.Now()
	_, err = f.ReadAt(make([]byte, 4096), 0)
	took := time.Since(start)
	require.True(t, errors.Is(err, syscall.EIO), "read of a frozen gateway: %v", err)
	require.Less(t, took, budget+time.Second, "the read failed within one block's budget (%v)", budget)

	time.Sleep(s3.DefaultListTTL) // past the listing the open was answered from
	start = time.Now()
	_, err = os.Stat(filepath.Join(mnt, "not-seen-before"))
	took = time.Since(start)
	require.True(t, errors.Is(err, syscall.EIO), "lookup at a frozen gateway: %v", err)
	// One listing's budget: the formats' detection stops at the first
	// failure instead of waiting it out once per format (11 times before).
	require.Less(t, took, opts.Budget(1<<20)+time.Second, "the lookup failed within one request's budget")
	require.Positive(t, fsys.Stats().LookupErrors)
}

// TestDeniedPrefixIsNoOutage: a real S3 server behind a proxy that denies
// one prefix (403, as a bucket policy does): a view under it fails, and
// lookups of other names still ask the store and get its answers at once;
// the same prefix answering 503 (the store not answering) is an outage, and
// other names then fail at once without asking (vfs/outage.go).
func TestDeniedPrefixIsNoOutage(t *testing.T) {
	srv := s3test.Shared(t)
	srv.Bucket(t, "ckpts")
	srv.Upload(t, "ckpts", "run/open", filepath.Join(fixture(t, "fsdp2_4ranks"), "ckpt"))
	srv.Upload(t, "ckpts", "run/secret", filepath.Join(fixture(t, "fsdp2_4ranks"), "ckpt"))
	p := objstoretest.StartProxy(t, srv.Endpoint, objstoretest.ProxyOptions{})
	var status atomic.Int32
	var faulty atomic.Value // the prefix the fault applies to
	faulty.Store("run/secret")
	p.SetFault(func(r *http.Request) objstoretest.Fault {
		prefix := faulty.Load().(string)
		if strings.Contains(r.URL.Path, "/"+prefix) || strings.HasPrefix(r.URL.Query().Get("prefix"), prefix) {
			return objstoretest.Fault{Status: int(status.Load())}
		}
		return objstoretest.Fault{}
	})
	tree, err := s3.Open(context.Background(), "s3://ckpts/run", s3.Options{Endpoint: p.URL, MaxAttempts: 2, ReadTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	logs := &logLines{}
	fsys := newFS(t, "", func(o *Options) {
		o.Tree = tree
		o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil))
	})
	fsys.tree.(*outageTree).retry = time.Hour // an outage lasts the rest of the test
	mnt := testMount(t, fsys)

	// The denial shows at the first request under the prefix: the
	// .metadata GET of the view's open (the names came with the open's
	// listing of run/, which the store allows), shown as the checkpoint's
	// error file.
	status.Store(http.StatusForbidden)
	msg, err := os.ReadFile(filepath.Join(mnt, "secret", "CKPTFS_ERROR.txt"))
	require.NoError(t, err, "the denied checkpoint's error file")
	require.Contains(t, string(msg), "403")
	asked := len(p.Requests())
	_, err = os.Stat(filepath.Join(mnt, "open", "model.safetensors"))
	require.NoError(t, err, "a prefix the store allows, right after a denial")
	_, err = os.Stat(filepath.Join(mnt, "nothing-here"))
	require.True(t, errors.Is(err, syscall.ENOENT), "a missing name, right after a denial: %v", err)
	require.Greater(t, len(p.Requests()), asked, "the other lookups asked the store")
	require.NotContains(t, strings.Join(logs.lines(), "\n"), "source failing")

	// The store answering 503 under run/, its listing included, once the
	// open's listing is stale.
	status.Store(http.StatusServiceUnavailable)
	faulty.Store("run/")
	time.Sleep(s3.DefaultListTTL)
	_, err = os.ReadDir(filepath.Join(mnt, "secret"))
	require.True(t, errors.Is(err, syscall.EIO), "listing the unavailable prefix gave %v", err)
	require.Contains(t, strings.Join(logs.lines(), "\n"), "source failing")
	asked = len(p.Requests())
	took, err := timed(func() error { _, err := os.Stat(filepath.Join(mnt, "also-nothing")); return err })
	require.True(t, errors.Is(err, syscall.EIO), "another name during the outage: %v", err)
	require.Less(t, took, time.Second, "failed at once")
	require.Equal(t, asked, len(p.Requests()), "the store was not asked during the outage")
}
