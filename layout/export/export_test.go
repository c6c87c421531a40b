package export

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
)

// gateSource serves zeros, but a read at or past from waits until release
// is closed, telling entered first.
type gateSource struct {
	size, from int64
	entered    chan struct{}
	release    chan struct{}
	once       sync.Once
}

func newGateSource(size, from int64) *gateSource {
	return &gateSource{size: size, from: from, entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *gateSource) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > s.from {
		s.once.Do(func() { close(s.entered) })
		<-s.release
	}
	clear(p)
	return len(p), nil
}

func (s *gateSource) String() string { return "gate" }

// gatedView is a view of one 1 MiB tensor whose bytes past 256 KiB wait for
// the gate.
func gatedView(t *testing.T) (*view.View, *gateSource) {
	t.Helper()
	const n = 1 << 18 // float32 elements
	src := newGateSource(4*n, 1<<18)
	tn := &ckpt.Tensor{Name: "w", DType: safetensors.F32, Shape: []int64{n},
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: []int64{0}, Sizes: []int64{n}, Source: src})}
	v, err := view.Plan(treetest.NewCheckpoint(t, t.TempDir(), tn), view.Options{})
	require.NoError(t, err)
	return v, src
}

func tempDirsOf(t *testing.T, out string) []string {
	t.Helper()
	parent, prefix := tempPrefix(out)
	m, err := filepath.Glob(filepath.Join(parent, prefix+"*"))
	require.NoError(t, err)
	return m
}

func TestExportCanceledRemovesTemp(t *testing.T) {
	v, src := gatedView(t)
	defer close(src.release)
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Write(ctx, v, out, Options{BlockSize: 64 << 10, Workers: 2}) }()

	<-src.entered // mid-export: the first blocks are written, a read hangs
	require.Len(t, tempDirsOf(t, out), 1)
	cancel()
	select {
	case err := <-done:
		assert.Equal(t, context.Canceled, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Export did not return after cancel while a read hangs")
	}
	assert.Empty(t, tempDirsOf(t, out), "temporary directory removed")
	assert.NoDirExists(t, out)

	// Canceled before it starts: nothing is created.
	assert.Equal(t, context.Canceled, Write(ctx, v, out, Options{}))
	assert.Empty(t, tempDirsOf(t, out))
}

// staleTemp makes a temporary directory of out as an export killed at some
// point would leave it.
func staleTemp(t *testing.T, out, suffix string, marker bool, age time.Duration) string {
	t.Helper()
	parent, prefix := tempPrefix(out)
	dir := filepath.Join(parent, prefix+suffix)
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), make([]byte, 1<<16), 0o644))
	if marker {
		require.NoError(t, os.WriteFile(filepath.Join(dir, exportMarker), nil, 0o600))
	}
	old := time.Now().Add(-age)
	require.NoError(t, os.Chtimes(dir, old, old))
	return dir
}

func TestExportSweepsStaleTemps(t *testing.T) {
	v, err := view.Plan(treetest.NewCheckpoint(t, t.TempDir(), treetest.Scalar("w")), view.Options{})
	require.NoError(t, err)
	root := t.TempDir()
	out := filepath.Join(root, "out")

	killed := staleTemp(t, out, "1", true, 0)
	unmarkedOld := staleTemp(t, out, "2", false, 2*staleUnmarked)
	unmarkedNew := staleTemp(t, out, "3", false, 0) // an export between mkdir and its marker
	running := staleTemp(t, out, "4", true, time.Hour)
	lock, err := os.Open(filepath.Join(running, exportMarker)) // as a running export holds it
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	otherOut := staleTemp(t, filepath.Join(root, "other"), "5", true, time.Hour)
	elsewhere := t.TempDir()
	_, prefix := tempPrefix(out)
	link := filepath.Join(root, prefix+"6")
	require.NoError(t, os.Symlink(elsewhere, link))

	require.NoError(t, Write(context.Background(), v, out, Options{}))

	assert.NoDirExists(t, killed)
	assert.NoDirExists(t, unmarkedOld)
	assert.DirExists(t, unmarkedNew)
	assert.DirExists(t, running)
	assert.DirExists(t, otherOut)
	assert.DirExists(t, elsewhere, "a symlink is not followed")
	_, err = os.Lstat(link)
	assert.NoError(t, err, "a symlink is not ours")
	assert.NoFileExists(t, filepath.Join(out, exportMarker))
	assert.NoFileExists(t, filepath.Join(out, exportMarker+".new"))
	assert.FileExists(t, filepath.Join(out, "model.safetensors"))
}

// TestConcurrentExportsToOneOut: an export that starts while another to the
// same OUT runs leaves the other's temporary directory alone; the first to
// finish wins, and the other fails cleanly.
func TestConcurrentExportsToOneOut(t *testing.T) {
	slow, src := gatedView(t)
	fast, err := view.Plan(treetest.NewCheckpoint(t, t.TempDir(), treetest.Scalar("w")), view.Options{})
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "out")

	done := make(chan error, 1)
	go func() { done <- Write(context.Background(), slow, out, Options{BlockSize: 64 << 10}) }()
	<-src.entered
	require.Len(t, tempDirsOf(t, out), 1)
	require.NoError(t, Write(context.Background(), fast, out, Options{}))
	assert.Len(t, tempDirsOf(t, out), 1, "the running export's directory survived the sweep")

	close(src.release)
	err = <-done
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrExist) || errors.Is(err, syscall.ENOTEMPTY), "%v", err)
	assert.Empty(t, tempDirsOf(t, out))
	assert.FileExists(t, filepath.Join(out, "model.safetensors"))
}

// TestExportMakesMissingParents: OUT's missing parents are made, as mkdir
// -p would (issue 34.5: export into a missing parent failed).
func TestExportMakesMissingParents(t *testing.T) {
	v, src := gatedView(t)
	close(src.release)
	out := filepath.Join(t.TempDir(), "models", "run1", "step_100")
	require.NoError(t, Write(context.Background(), v, out, Options{}))
	ents, err := os.ReadDir(out)
	require.NoError(t, err)
	require.NotEmpty(t, ents)
	require.Empty(t, tempDirsOf(t, out))
}
