package hfwrite

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfdir"
)

// The rules of a write session, as a file system shows them, without a
// mount (the package doc lists them; vfs's mount tests are the end-to-end
// net).

// reports collects what OnCommit is told.
type reports struct {
	mu  sync.Mutex
	all []Report
}

func (r *reports) add(rep Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rep)
}

func (r *reports) list() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Report(nil), r.all...)
}

func newSession(t *testing.T) (*Session, *reports) {
	t.Helper()
	r := &reports{}
	s, err := createSession(filepath.Join(t.TempDir(), "ckpt"), Options{Target: dcpwrite.Target{WorldSize: 2}, OnCommit: r.add})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, r
}

// names lists what the directory shows, by kind.
type names struct{ writing, view, stored, dirs []string }

func listed(t *testing.T, s *Session, only string) names {
	t.Helper()
	l, err := s.Entries(only)
	require.NoError(t, err)
	defer l.View.Release()
	var n names
	for _, f := range l.Writing {
		n.writing = append(n.writing, f.Name())
	}
	if l.View != nil {
		require.NoError(t, l.View.Err)
		for _, f := range l.View.Files {
			n.view = append(n.view, f.Name)
		}
	}
	n.stored, n.dirs = l.Stored, l.Dirs
	return n
}

// write creates name and writes data through one handle, without closing.
func write(t *testing.T, s *Session, name string, data []byte) *Handle {
	t.Helper()
	h, err := s.Create(name)
	require.NoError(t, err)
	_, err = h.WriteAt(data, 0)
	require.NoError(t, err)
	return h
}

func TestSessionCloseCommits(t *testing.T) {
	s, reps := newSession(t)
	require.NoError(t, os.Mkdir(filepath.Join(s.Path(), "sub"), 0o755))
	assert.Equal(t, names{dirs: []string{"sub"}}, listed(t, s, ""))

	// A new file shows under its name while it is written.
	h := write(t, s, "a.safetensors", st(t, map[string]int64{"x": 5}))
	assert.Equal(t, names{writing: []string{"a.safetensors"}, dirs: []string{"sub"}}, listed(t, s, ""))
	assert.Equal(t, names{writing: []string{"a.safetensors"}}, listed(t, s, "a.safetensors"))
	_, err := s.Create("a.safetensors")
	assert.ErrorIs(t, err, ErrBusy)
	_, err = s.Open("a.safetensors", true)
	assert.ErrorIs(t, err, ErrBusy)

	// A flush of a handle that did not write does not commit (a shell's
	// `>` dups and closes before the command writes); the flush of the
	// handle that wrote does, and returns the result.
	reader, err := h.File().Open(false, false)
	require.NoError(t, err)
	require.NoError(t, reader.Flush())
	reader.Release()
	assert.Equal(t, 0, s.Tensors())
	require.NoError(t, h.Flush())
	h.Release()
	assert.Equal(t, 1, s.Tensors())
	assert.Equal(t, names{view: []string{"model.safetensors", hfdir.SafetensorsIndex}, dirs: []string{"sub"}}, listed(t, s, ""))
	_, err = h.File().Open(true, false)
	assert.ErrorIs(t, err, ErrStale, "committed: look the name up again")
	rep := reps.list()
	require.Len(t, rep, 1)
	assert.NoError(t, rep[0].Err)
	assert.Equal(t, filepath.Join(s.Path(), "a.safetensors"), rep[0].Path)

	// A stored file is written as-is, at the last release when no handle
	// that wrote was flushed.
	h = write(t, s, "config.json", []byte(`{"a": 1}`))
	h.Release()
	assert.Equal(t, names{view: []string{"model.safetensors", hfdir.SafetensorsIndex, "config.json"}, dirs: []string{"sub"}}, listed(t, s, ""))
	assert.Len(t, reps.list(), 2)
}

func TestSessionEmptyTensorFile(t *testing.T) {
	s, reps := newSession(t)
	// touch, `: >`: created, never written. close(2) cannot tell this from
	// the close of a dup before the writes, so the last release drops it.
	h, err := s.Create("model.safetensors")
	require.NoError(t, err)
	require.NoError(t, h.Flush())
	h.Release()
	rep := reps.list()
	require.Len(t, rep, 1)
	assert.ErrorIs(t, rep[0].Err, ErrEmpty)
	assert.ErrorIs(t, rep[0].Err, ErrCommit)
	assert.Equal(t, names{}, listed(t, s, ""))
	_, err = os.Stat(filepath.Join(s.Path(), ".metadata"))
	assert.ErrorIs(t, err, fs.ErrNotExist)

	// A handle that wrote and truncated to 0: close reports it.
	h = write(t, s, "model.safetensors", []byte("x"))
	require.NoError(t, h.Truncate(0))
	assert.ErrorIs(t, h.Flush(), ErrEmpty)
	h.Release()

	// An empty stored file is a file like any other.
	h, err = s.Create("empty.txt")
	require.NoError(t, err)
	h.Release()
	assert.Equal(t, names{stored: []string{"empty.txt"}}, listed(t, s, ""))
}

// TestSessionOneWriter: a file has one handle open for writing at a time
// (issue 22: two writers' data were committed as one file at the first
// close). Readers are not writers.
func TestSessionOneWriter(t *testing.T) {
	s, reps := newSession(t)
	h := write(t, s, "a.safetensors", []byte("x"))
	f := h.File()
	_, err := f.Open(true, false)
	assert.ErrorIs(t, err, ErrBusy)
	_, err = f.Open(true, true)
	assert.ErrorIs(t, err, ErrBusy)
	size, err := f.Size()
	require.NoError(t, err)
	assert.Equal(t, int64(1), size, "a refused O_TRUNC truncates nothing")
	r, err := f.Open(false, false)
	require.NoError(t, err)
	_, err = r.WriteAt([]byte("y"), 0)
	assert.ErrorIs(t, err, syscall.EBADF)
	assert.ErrorIs(t, r.Truncate(0), syscall.EBADF)
	r.Release()
	h.Release()

	// A writer closed without writing (touch) whose release is on its way:
	// the next writer waits for it. A reader keeps the file open past it.
	c, err := s.Create("b.json")
	require.NoError(t, err)
	f = c.File()
	r, err = f.Open(false, false)
	require.NoError(t, err)
	require.NoError(t, c.Flush())
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Release()
	}()
	w, err := f.Open(true, false)
	require.NoError(t, err)
	_, err = w.WriteAt([]byte("{}"), 0)
	require.NoError(t, err)

	// A writer that wrote is busy at once; one closed without writing and
	// never released, once the wait is over.
	start := time.Now()
	_, err = f.Open(true, false)
	assert.ErrorIs(t, err, ErrBusy)
	assert.Less(t, time.Since(start), releaseWait)
	require.NoError(t, w.Flush())
	w.Release()
	r.Release()
	got, err := os.ReadFile(filepath.Join(s.Path(), "b.json"))
	require.NoError(t, err)
	assert.Equal(t, "{}", string(got))
	d, err := s.Create("d.json")
	require.NoError(t, err)
	require.NoError(t, d.Flush())
	_, err = d.File().Open(true, false)
	assert.ErrorIs(t, err, ErrBusy)
	assert.GreaterOrEqual(t, time.Since(start), releaseWait)

	// The last release commits: an open waiting for it finds the file done.
	go func() {
		time.Sleep(20 * time.Millisecond)
		d.Release()
	}()
	_, err = d.File().Open(true, false)
	assert.ErrorIs(t, err, ErrStale)
	_, err = os.Stat(filepath.Join(s.Path(), "d.json"))
	require.NoError(t, err)
	assert.Len(t, reps.list(), 3, "a.safetensors (not safetensors), b.json, d.json")
}

func TestSessionRewriteStored(t *testing.T) {
	s, _ := newSession(t)
	h := write(t, s, "notes.txt", []byte("one"))
	require.NoError(t, h.Flush())
	h.Release()

	// Opened for writing and not changed: dropped, the stored file stays.
	h, err := s.Open("notes.txt", false)
	require.NoError(t, err)
	assert.Equal(t, names{stored: []string{"notes.txt"}}, listed(t, s, ""), "a rewrite leaves the name showing the stored file")
	_, err = s.Open("notes.txt", false)
	assert.ErrorIs(t, err, ErrBusy)
	buf := make([]byte, 3)
	_, err = h.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "one", string(buf), "the spool starts as a copy")
	h.Release()
	assert.Equal(t, uint64(1), s.Generation())

	// Written at 3: appended to the copy.
	h, err = s.Open("notes.txt", false)
	require.NoError(t, err)
	_, err = h.WriteAt([]byte("two"), 3)
	require.NoError(t, err)
	require.NoError(t, h.Flush())
	h.Release()
	got, err := os.ReadFile(filepath.Join(s.Path(), "notes.txt"))
	require.NoError(t, err)
	assert.Equal(t, "onetwo", string(got))

	// O_TRUNC: starts empty, and counts as a change.
	h, err = s.Open("notes.txt", true)
	require.NoError(t, err)
	h.Release()
	got, err = os.ReadFile(filepath.Join(s.Path(), "notes.txt"))
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestSessionRemoveRenameTruncate(t *testing.T) {
	s, _ := newSession(t)
	data := st(t, map[string]int64{"x": 5})
	h := write(t, s, "a.safetensors", data)
	require.NoError(t, h.Flush())
	h.Release()
	h = write(t, s, "config.json", []byte("{}"))
	require.NoError(t, h.Flush())
	h.Release()

	for _, tc := range []struct {
		name string
		err  error
	}{
		{"model.safetensors", ErrCommitted},
		{hfdir.SafetensorsIndex, ErrCommitted},
		{"a.safetensors", fs.ErrNotExist}, // committed into the view's files, not shown
		{"missing.txt", fs.ErrNotExist},
		{".metadata", fs.ErrNotExist}, // hidden
		{"__0_0.distcp", fs.ErrNotExist},
	} {
		assert.ErrorIs(t, s.Remove(tc.name), tc.err, "remove %s", tc.name)
		assert.ErrorIs(t, s.Rename(tc.name, "b.txt", false), tc.err, "rename %s", tc.name)
	}
	assert.ErrorIs(t, s.Rename("config.json", hfdir.SafetensorsIndex, true), fs.ErrExist)
	assert.ErrorIs(t, s.Rename("config.json", ".metadata", false), ErrReserved)
	_, err := s.Truncate("config.json", 0)
	assert.ErrorIs(t, err, ErrReadOnly)
	_, err = s.Truncate("model.safetensors", 0)
	assert.ErrorIs(t, err, ErrReadOnly)

	// A file being written: renamed, truncated by name, removed (its
	// writer's close then fails).
	w := write(t, s, ".tmp1", []byte("partial"))
	require.NoError(t, s.Rename(".tmp1", "b.bin", false))
	assert.Equal(t, []string{"b.bin"}, listed(t, s, "").writing)
	busy := write(t, s, "c.bin", nil)
	assert.ErrorIs(t, s.Rename("b.bin", "c.bin", false), ErrBusy)
	assert.ErrorIs(t, s.Rename("config.json", "c.bin", false), ErrBusy)
	_, err = s.Truncate("b.bin", 2)
	require.NoError(t, err)
	size, err := w.File().Size()
	require.NoError(t, err)
	assert.Equal(t, int64(2), size)
	require.NoError(t, s.Remove("b.bin"))
	assert.ErrorIs(t, w.Flush(), ErrCommit)
	w.Release()
	busy.Release()

	// Stored files: renamed, removed.
	require.NoError(t, s.Rename("config.json", "config2.json", false))
	require.NoError(t, s.Remove("config2.json"))
	assert.Equal(t, names{view: []string{"model.safetensors", hfdir.SafetensorsIndex}, stored: []string{"c.bin"}}, listed(t, s, ""))

	// A temp file renamed when complete is committed by the rename, which
	// reports the result; a stored file renamed to a tensor file name too.
	w = write(t, s, ".tmp2", st(t, map[string]int64{"y": 2}))
	require.NoError(t, s.Rename(".tmp2", "b.safetensors", false))
	done, err := w.File().Done()
	assert.True(t, done)
	assert.NoError(t, err)
	w.Release()
	w = write(t, s, ".tmp3", st(t, map[string]int64{"x": 2}))
	assert.ErrorIs(t, s.Rename(".tmp3", "c.safetensors", false), ErrCommit, "x is committed already")
	w.Release()
	h = write(t, s, "d.tmp", st(t, map[string]int64{"d": 1}))
	require.NoError(t, h.Flush())
	h.Release()
	require.NoError(t, s.Rename("d.tmp", "d.safetensors", false))
	assert.Equal(t, 3, s.Tensors())
	assert.Equal(t, names{view: []string{"model.safetensors", hfdir.SafetensorsIndex}, stored: []string{"c.bin"}}, listed(t, s, ""))
}

// TestSessionViewLifetime: a view is built once per change, and an
// outdated one stays readable while a reader holds it, then is closed.
func TestSessionViewLifetime(t *testing.T) {
	s, _ := newSession(t)
	l, err := s.Entries("")
	require.NoError(t, err)
	assert.Nil(t, l.View, "nothing committed: no view")

	h := write(t, s, "a.safetensors", st(t, map[string]int64{"x": 5}))
	require.NoError(t, h.Flush())
	h.Release()
	l, err = s.Entries("")
	require.NoError(t, err)
	v1 := l.View
	l, err = s.Entries("model.safetensors")
	require.NoError(t, err)
	assert.Same(t, v1, l.View, "no change, no new view")
	l.View.Release()

	require.NoError(t, v1.Acquire()) // a reader opens a file of it
	v1.Release()                     // the listing is done with it
	h = write(t, s, "b.safetensors", st(t, map[string]int64{"y": 5}))
	require.NoError(t, h.Flush())
	h.Release()
	l, err = s.Entries("")
	require.NoError(t, err)
	v2 := l.View
	assert.NotSame(t, v1, v2)
	assert.Greater(t, v2.Serial, v1.Serial)

	// The reader of v1 still reads it.
	f := v1.File("model.safetensors")
	require.NotNil(t, f)
	buf := make([]byte, f.Size)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	v1.Release()
	assert.ErrorIs(t, v1.Acquire(), ErrStale, "closed with its last reader")
	_, err = f.ReadAt(buf, 0)
	assert.Error(t, err, "its shard files are closed")
	require.NoError(t, v2.Acquire())
	v2.Release()
	v2.Release()
}

func TestSessionClose(t *testing.T) {
	s, reps := newSession(t)
	h := write(t, s, "a.safetensors", st(t, map[string]int64{"x": 5}))
	require.NoError(t, s.Close())
	done, err := h.File().Done()
	assert.True(t, done)
	assert.True(t, errors.Is(err, ErrCommit))
	assert.ErrorIs(t, h.Flush(), ErrCommit)
	h.Release()
	assert.Empty(t, reps.list(), "a dropped file is not a commit")
	_, err = os.Stat(filepath.Join(s.Path(), SpoolDir))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = s.Create("b.safetensors")
	assert.Error(t, err)
}
