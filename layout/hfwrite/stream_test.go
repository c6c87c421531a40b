package hfwrite

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
)

// queued registers and queues a write, as File.writeAt does.
func queued(t *testing.T, s *stream, p []byte, off int64) bool {
	t.Helper()
	require.NoError(t, s.begin(off, int64(len(p))))
	if s.queue(p, off) {
		return true
	}
	s.end(off, int64(len(p)), 0)
	return false
}

func TestWriteBehindWritesInOrderAndReportsEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool")
	fd, err := os.Create(path)
	require.NoError(t, err)
	defer fd.Close()
	w := newStream(fd, NewLimits())
	require.False(t, queued(t, w, []byte("x"), 0), "no resharder serves the file: the caller writes")
	w.serve()

	// Overlapping writes land in the order they were queued.
	require.True(t, queued(t, w, bytes.Repeat([]byte("a"), 100), 0))
	require.True(t, queued(t, w, bytes.Repeat([]byte("b"), 50), 25))
	// A write larger than a buffer is not queued: the caller writes it.
	require.False(t, queued(t, w, make([]byte, behindBufSize+1), 0))
	require.NoError(t, w.drain())

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	want := append(append(bytes.Repeat([]byte("a"), 25), bytes.Repeat([]byte("b"), 50)...), bytes.Repeat([]byte("a"), 25)...)
	assert.Equal(t, want, b)
	assert.Equal(t, []span{{0, 100}}, w.done, "what landed counts as written")
	assert.Empty(t, w.inflight, "and no longer as under way")
}

// The resharder writes the queue while it waits for bytes; a write finds
// no buffer once every one is queued, and is written by its caller, after
// the queue (which the caller then writes itself).
func TestWriteBehindIsWrittenByTheResharderOrTheWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool")
	fd, err := os.Create(path)
	require.NoError(t, err)
	defer fd.Close()
	w := newStream(fd, NewLimits())
	w.serve()

	waited := make(chan error)
	go func() { waited <- w.wait(3 * behindBufSize) }()
	for i := range 3 {
		require.True(t, queued(t, w, bytes.Repeat([]byte{byte('a' + i)}, behindBufSize), int64(i*behindBufSize)))
	}
	require.NoError(t, <-waited, "the waiter wrote what it waited for")
	w.mu.Lock()
	assert.Empty(t, w.pending)
	assert.Equal(t, []span{{0, 3 * behindBufSize}}, w.done)
	w.mu.Unlock()

	// Nobody waits now: the queue fills every buffer, then the writer
	// writes.
	for i := range behindQueued {
		require.True(t, queued(t, w, []byte{byte('A' + i)}, int64(i)))
	}
	require.False(t, queued(t, w, []byte("z"), 0), "no buffer is free")
	require.NoError(t, w.drain(), "the caller writes the queue")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "ABCDEFGH", string(b[:behindQueued]))
	assert.Equal(t, bytes.Repeat([]byte("c"), 10), b[3*behindBufSize-10:])

	// A write queued as the resharder ends is written by it.
	require.True(t, queued(t, w, []byte("end"), 0))
	w.unserve()
	w.mu.Lock()
	assert.Empty(t, w.pending)
	assert.Empty(t, w.inflight)
	w.mu.Unlock()
	require.False(t, queued(t, w, []byte("x"), 0), "not served now")
}

func TestWriteBehindKeepsTheFirstErrorForLater(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	fd, err := os.Open(path) // read-only: every write fails
	require.NoError(t, err)
	defer fd.Close()
	w := newStream(fd, NewLimits())
	w.serve()

	require.True(t, queued(t, w, []byte("x"), 0))
	err = w.drain()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a write that returned failed")
	assert.Equal(t, err, w.failed())
	assert.Empty(t, w.done, "nothing was written")
	assert.Empty(t, w.inflight, "the write is over")
	assert.Equal(t, err, w.begin(1, 1), "the next write fails")
}

// A file's queued writes are in the spool before anything reads it or its
// size, and a failed one fails the next write and the commit.
func TestFileReadsItsOwnQueuedWrites(t *testing.T) {
	s, _ := newSession(t)
	h, err := s.Create("notes.txt")
	require.NoError(t, err)
	data := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB in 1 MiB writes
	for off := 0; off < len(data); off += behindBufSize {
		_, err := h.WriteAt(data[off:off+behindBufSize], int64(off))
		require.NoError(t, err)
	}
	size, err := h.File().Size()
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), size)
	back := make([]byte, len(data))
	_, err = h.ReadAt(back, 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, back))
	h.Release()
}

func TestFileFailsWritesAndCommitAfterAQueuedWriteFailed(t *testing.T) {
	s, reps := newSession(t)
	h, err := s.Create("notes.txt")
	require.NoError(t, err)
	f := h.File()
	// The spool's descriptor stands in for one whose writes fail (a full
	// disk): its queue writes through a read-only one.
	ro, err := s.root.Open(f.spool)
	require.NoError(t, err)
	defer ro.Close()
	f.stream.fd = ro

	_, err = h.WriteAt([]byte("queued"), 0)
	require.NoError(t, err, "the failure comes after the write returned")
	err = h.Written()
	require.Error(t, err, "fsync's report")
	assert.ErrorIs(t, err, syscall.EBADF, "the cause is kept for the errno")
	_, err = h.WriteAt([]byte("more"), 6)
	require.Error(t, err)
	err = h.Flush()
	require.ErrorIs(t, err, ErrCommit)
	assert.Contains(t, err.Error(), "a write that returned failed")
	h.Release()
	require.Len(t, reps.list(), 1)
	assert.Error(t, reps.list()[0].Err)
	assert.Empty(t, listed(t, s, "").stored, "nothing was stored")
}

func TestWriteBehindLooksAtFreeSpacePer16MiB(t *testing.T) {
	fd, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	require.NoError(t, err)
	defer fd.Close()
	w := newStream(fd, NewLimits())
	// $TMPDIR has more than behindMinFree + behindRecheck free here.
	require.True(t, w.reserve(1<<20))
	assert.Equal(t, int64(behindRecheck-1<<20), w.room, "one look covers the next 16 MiB")
	require.True(t, w.reserve(behindRecheck-1<<20))
	assert.Zero(t, w.room)
	require.True(t, w.reserve(1), "used up: it looks again")
	assert.Equal(t, int64(behindRecheck-1), w.room)
}

// More files written at once than a Limits has write-behind buffers and
// eager reshards: every write lands (queued, or written by its caller when
// no buffer is free), every file commits, and the checkpoint holds every
// tensor byte for byte.
func TestManyFilesWrittenAtOnce(t *testing.T) {
	const files = 2*behindQueued + 2
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 3}})
	require.NoError(t, err)
	want := map[string][]byte{}
	var wg sync.WaitGroup
	for i := range files {
		fill := func(ti safetensors.TensorInfo) []byte {
			b := make([]byte, ti.Size())
			for j := range b {
				b[j] = byte(i*31 + j*7 + j/251)
			}
			return b
		}
		data, tensors := sttest.Build(t, nil, fill,
			sttest.Spec{Name: fmt.Sprintf("f%d.embed", i), DType: safetensors.BF16, Shape: []int64{1031, 256}},
			sttest.Spec{Name: fmt.Sprintf("f%d.norm", i), DType: safetensors.F32, Shape: []int64{256}})
		maps.Copy(want, tensors)
		f := create(t, s, fmt.Sprintf("model-%02d.safetensors", i))
		wg.Go(func() {
			piece := 4096 << (i % 3) // 4, 8 and 16 KiB writes
			for off := 0; off < len(data); off += piece {
				_, err := f.WriteAt(data[off:min(off+piece, len(data))], int64(off))
				assert.NoError(t, err)
			}
			assert.NoError(t, f.Commit())
		})
	}
	wg.Wait()
	require.NoError(t, s.Close())

	c, err := layout.Open(dir)
	require.NoError(t, err)
	v, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	defer v.Close()
	got := map[string][]byte{}
	for _, vf := range v.Files {
		if !strings.HasSuffix(vf.Name, ".safetensors") {
			continue
		}
		b := make([]byte, vf.Size)
		_, err := vf.ReadAt(b, 0)
		require.True(t, err == nil || errors.Is(err, io.EOF), "%v", err)
		h, err := safetensors.ReadHeader(bytes.NewReader(b), int64(len(b)))
		require.NoError(t, err)
		for _, ti := range h.Tensors {
			got[ti.Name] = b[h.DataStart+ti.Begin : h.DataStart+ti.End]
		}
	}
	require.Len(t, got, len(want))
	for name, w := range want {
		require.True(t, bytes.Equal(w, got[name]), name)
	}
}

// failed is the error of a queued write that failed, if any.
func (s *stream) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
