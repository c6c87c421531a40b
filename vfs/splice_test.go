package vfs

import (
	"bytes"
	"log"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink safe for go-fuse's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestLargeReadsDoNotTrySplice reads a file through the mount in 1 MiB
// O_DIRECT reads, which the kernel passes on as 1 MiB FUSE reads. go-fuse
// used to try to splice each reply through a pipe (which only helps replies
// backed by a file descriptor; ours are bytes in memory), found that a 1 MiB
// reply plus its header does not fit the 1 MiB pipe, and logged
// "trySplice: splice: want N bytes, max pipe size M" for every such read.
func TestLargeReadsDoNotTrySplice(t *testing.T) {
	src := t.TempDir()
	data := make([]byte, 4<<20)
	rand.New(rand.NewSource(1)).Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(src, "blob.bin"), data, 0o644))

	var logs lockedBuffer
	log.SetOutput(&logs) // go-fuse logs to the standard logger
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	mnt := testMount(t, newFS(t, src))

	f, err := os.OpenFile(filepath.Join(mnt, "blob.bin"), os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20) // large allocations are page aligned, as O_DIRECT wants
	for off := 0; off < len(data); off += len(buf) {
		n, err := f.ReadAt(buf, int64(off))
		require.NoError(t, err)
		require.Equal(t, len(buf), n)
		require.True(t, bytes.Equal(data[off:off+n], buf), "bytes at %d", off)
	}
	assert.False(t, strings.Contains(logs.String(), "trySplice"), "go-fuse logged:\n%s", logs.String())
}
