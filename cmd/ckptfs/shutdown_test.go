package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stallingStore is an S3 endpoint holding one object, bkt/run/a, that stops
// answering (holds every request open) once down is set.
type stallingStore struct {
	down atomic.Bool
}

func (s *stallingStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.down.Load() {
		<-r.Context().Done()
		return
	}
	const list = `<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>run/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>false</IsTruncated>
<Contents><Key>run/a</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>"e"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>`
	if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "2" {
		w.Header().Set("Content-Type", "application/xml")
		fmt.Fprint(w, list)
		return
	}
	http.NotFound(w, r)
}

// TestSignalDuringAnOutage: SIGTERM ends a mount of a store that stopped
// answering within a few seconds, though a lookup is waiting on the store
// (it would wait --max-attempts × --read-timeout and more).
func TestSignalDuringAnOutage(t *testing.T) {
	store := &stallingStore{}
	srv := httptest.NewServer(store)
	t.Cleanup(srv.Close)
	exe, err := os.Executable()
	require.NoError(t, err)
	mnt := t.TempDir()
	var out logBuffer
	// Run as ckptfs (TestMain), in the foreground.
	cmd := &exec.Cmd{Path: exe, Args: []string{"ckptfs", "mount", "--cache-size", "16MiB", "--endpoint", srv.URL, "s3://bkt/run", mnt},
		Stdout: &out, Stderr: &out}
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true")
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		lazyUnmount(mnt)
	})
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true
		default:
			return isMounted(t, mnt)
		}
	}, 30*time.Second, 10*time.Millisecond)
	require.True(t, isMounted(t, mnt), "%s", &out)
	_, err = os.Stat(filepath.Join(mnt, ".ckptfs"))
	require.NoError(t, err)

	store.down.Store(true)
	go os.Stat(filepath.Join(mnt, "b")) // waits on the store: a HEAD that never answers
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		t.Logf("exited after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10 s after SIGTERM:\n%s", &out)
	}
	require.Less(t, time.Since(start), 5*time.Second, "%s", &out)
	require.False(t, isMounted(t, mnt), "%s", &out)
}
