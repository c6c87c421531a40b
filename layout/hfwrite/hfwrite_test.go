package hfwrite

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/writetest"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
)

// st returns a safetensors file of F32 tensors of the given lengths.
func st(t *testing.T, tensors map[string]int64) []byte {
	t.Helper()
	var specs []tspec
	for _, n := range slices.Sorted(maps.Keys(tensors)) {
		specs = append(specs, tspec{n, safetensors.F32, []int64{tensors[n]}})
	}
	return stFile(t, 1, specs...)
}

// create starts writing name in s.
func create(t *testing.T, s *Session, name string) *File {
	t.Helper()
	h, err := s.Create(name)
	require.NoError(t, err)
	return h.File()
}

func put(t *testing.T, s *Session, name string, data []byte) error {
	t.Helper()
	f := create(t, s, name)
	_, err := f.WriteAt(data, 0)
	require.NoError(t, err)
	return f.Commit()
}

func target(t dcpwrite.Target) Options { return Options{Target: t} }

// createSession opens path (creating it, not its parents, if missing) as a
// session's directory.
func createSession(path string, opts Options) (*Session, error) {
	root, err := writetest.MakeDir(path)
	if err != nil {
		return nil, err
	}
	return CreateIn(root, opts)
}

func TestKindOf(t *testing.T) {
	for name, want := range map[string]any{
		"model.safetensors":                 TensorFile,
		"model-00001-of-00002.safetensors":  TensorFile,
		"model.safetensors.index.json":      IndexFile,
		"model.fp16.safetensors.index.json": IndexFile,
		"config.json":                       SidecarFile,
		".tmpAbc":                           SidecarFile,
		".metadata":                         ErrReserved,
		".metadata.tmp":                     ErrReserved,
		"__0_0.distcp":                      ErrReserved,
		"__3.metadata":                      ErrReserved,
		"x.distcp":                          ErrReserved,
		SpoolDir:                            ErrReserved,
	} {
		k, err := KindOf(name)
		if e, ok := want.(error); ok {
			require.ErrorIs(t, err, e, name)
			continue
		}
		require.NoError(t, err, name)
		require.Equal(t, want, k, name)
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		_, err := KindOf(bad)
		require.Error(t, err, bad)
	}
	// NAME_MAX: refused where the name is created, not at the commit.
	_, err := KindOf(strings.Repeat("a", 250) + ".json")
	require.NoError(t, err)
	_, err = KindOf(strings.Repeat("a", 245) + ".safetensors")
	require.ErrorIs(t, err, syscall.ENAMETOOLONG)
	require.ErrorIs(t, CheckName(strings.Repeat("d", 256)), syscall.ENAMETOOLONG)
}

func TestSessionCommits(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	w, err := createSession(dir, target(dcpwrite.Target{WorldSize: 2, Prefix: "model"}))
	require.NoError(t, err)
	require.NoError(t, put(t, w, "config.json", []byte(`{}`)))
	require.Equal(t, 0, w.Tensors())
	require.NoError(t, put(t, w, "a.safetensors", st(t, map[string]int64{"x": 5, "y": 3})))
	require.Equal(t, 2, w.Tensors())
	require.Equal(t, uint64(2), w.Generation())

	// an index that agrees with what was received, listing one more
	idx := `{"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}`
	require.NoError(t, put(t, w, "model.safetensors.index.json", []byte(idx)))
	require.Equal(t, []string{"z"}, w.Pending())
	// later files are checked against it
	err = put(t, w, "c.safetensors", st(t, map[string]int64{"z": 2}))
	require.ErrorIs(t, err, ErrIndex)
	require.ErrorIs(t, err, ErrCommit)
	var ce *CommitError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "c.safetensors", ce.Name)
	// the temp-then-rename pattern: the name at commit time counts
	f := create(t, w, ".tmp123")
	_, err = f.WriteAt(st(t, map[string]int64{"z": 2}), 0)
	require.NoError(t, err)
	require.NoError(t, w.Rename(".tmp123", "b.safetensors", false))
	require.Equal(t, TensorFile, f.Kind())
	require.NoError(t, f.Commit())
	require.NoError(t, f.Commit(), "Commit runs once")
	require.Empty(t, w.Pending())
	_, err = f.WriteAt([]byte{1}, 0)
	require.ErrorIs(t, err, ErrDone)
	require.ErrorIs(t, f.rename("d.safetensors"), ErrDone)

	// a stored file renamed to a safetensors name is committed
	require.NoError(t, put(t, w, "e.tmp", st(t, map[string]int64{"e": 1})))
	err = w.Rename("e.tmp", "e.safetensors", false)
	require.ErrorIs(t, err, ErrIndex, "the index does not list e")
	_, err = os.Stat(filepath.Join(dir, "e.tmp"))
	require.NoError(t, err, "kept when not committed")
	require.NoError(t, w.Rename("config.json", "config2.json", false))

	_, err = w.Create(".metadata")
	require.ErrorIs(t, err, ErrReserved)
	require.NoError(t, w.Close())
	_, err = os.Stat(filepath.Join(dir, SpoolDir))
	require.True(t, errors.Is(err, os.ErrNotExist))

	c, err := treetest.OpenLocal(dir, torchdcp.Reader.Open)
	require.NoError(t, err)
	defer c.Close()
	var names []string
	for _, ct := range c.Tensors {
		names = append(names, ct.Name)
	}
	require.ElementsMatch(t, []string{"model.x", "model.y", "model.z"}, names)
	_, err = os.Stat(filepath.Join(dir, "config2.json"))
	require.NoError(t, err)
}

func TestAbortAndClose(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	w, err := createSession(dir, target(dcpwrite.Target{}))
	require.NoError(t, err)
	f := create(t, w, "a.safetensors")
	_, err = f.WriteAt(st(t, map[string]int64{"x": 5}), 0)
	require.NoError(t, err)
	f.Abort()
	require.ErrorIs(t, f.Commit(), ErrCommit)
	g := create(t, w, "b.safetensors")
	require.NoError(t, w.Close(), "drops g")
	done, err := g.Done()
	require.True(t, done)
	require.ErrorIs(t, err, ErrCommit)
	_, err = os.Stat(filepath.Join(dir, ".metadata"))
	require.True(t, errors.Is(err, os.ErrNotExist))
	_, err = w.Create("c.safetensors")
	require.Error(t, err)
}

// openDir opens path as a source.Dir, closed at the test's end.
func openDir(t *testing.T, path string) *source.Dir {
	t.Helper()
	d, err := source.OpenDir(path)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func TestCleanStale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	w, err := createSession(dir, target(dcpwrite.Target{}))
	require.NoError(t, err)
	f := create(t, w, "a.safetensors")
	_, err = f.WriteAt([]byte("partial"), 0)
	require.NoError(t, err)
	removed, err := CleanStale(openDir(t, dir))
	require.NoError(t, err)
	require.False(t, removed, "a live writer's spool stays")
	create(t, w, "b.safetensors")

	// a spool nobody holds: what a killed writer leaves
	dead := filepath.Join(t.TempDir(), "dead")
	require.NoError(t, os.MkdirAll(filepath.Join(dead, SpoolDir), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dead, SpoolDir, "1.part"), []byte("x"), 0o600))
	removed, err = CleanStale(openDir(t, dead))
	require.NoError(t, err)
	require.True(t, removed)
	_, err = os.Stat(filepath.Join(dead, SpoolDir))
	require.True(t, errors.Is(err, os.ErrNotExist))
	// Create cleans too
	require.NoError(t, os.MkdirAll(filepath.Join(dead, SpoolDir), 0o700))
	w2, err := createSession(dead, target(dcpwrite.Target{}))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dead, SpoolDir))
	require.True(t, errors.Is(err, os.ErrNotExist))
	require.NoError(t, w2.Close())
	require.NoError(t, w.Close())
}

// TestViewFromCommittedMetadata: the session's view, built from the
// metadata its commits wrote, serves the bytes of the view read back from
// disk, file for file.
func TestViewFromCommittedMetadata(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	w, err := createSession(dir, target(dcpwrite.Target{WorldSize: 2}))
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, put(t, w, "a.safetensors", st(t, map[string]int64{"x": 6, "y": 3})))
	require.NoError(t, put(t, w, "b.safetensors", st(t, map[string]int64{"z": 5})))
	require.NoError(t, put(t, w, "config.json", []byte(`{"model_type": "llama"}`)))

	l, err := w.Entries("")
	require.NoError(t, err)
	defer l.View.Release()
	require.NoError(t, l.View.Err)
	c, err := layout.Open(dir)
	require.NoError(t, err)
	want, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	defer want.Close()
	require.Len(t, l.View.Files, len(want.Files))
	for i, wf := range want.Files {
		gf := l.View.Files[i]
		require.Equal(t, wf.Name, gf.Name)
		require.Equal(t, wf.Size, gf.Size)
		wb, gb := make([]byte, wf.Size), make([]byte, gf.Size)
		_, err := wf.ReadAt(wb, 0)
		require.True(t, err == nil || errors.Is(err, io.EOF), "%v", err)
		_, err = gf.ReadAt(gb, 0)
		require.True(t, err == nil || errors.Is(err, io.EOF), "%v", err)
		require.True(t, bytes.Equal(wb, gb), wf.Name)
	}
}
