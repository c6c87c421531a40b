package trainer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

// fsdpFolder is a copy of the fixture's Trainer checkpoint-1/ with FSDP.
func fsdpFolder(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "checkpoint-1")
	require.NoError(t, os.CopyFS(dir, os.DirFS(treetest.Testdata("trainer_fsdp_llama", "ckpt", "checkpoint-1"))))
	return dir
}

func openFSDP(dir string) (*ckpt.Checkpoint, error) {
	return treetest.OpenLocal(dir, func(d source.Tree) (*ckpt.Checkpoint, error) { return OpenFSDP(d, ckpt.OpenOptions{}) })
}

// TestFSDPFolder: the folder is the view of pytorch_model_fsdp_0/ (the
// model under "model", byte for byte save_pretrained's tensors) with the
// folder's config.json.
func TestFSDPFolder(t *testing.T) {
	dir := fsdpFolder(t)
	require.True(t, treetest.Detect(t, FSDPReader, dir))
	require.False(t, treetest.Detect(t, Reader, dir), "no latest: not DeepSpeed's")
	c, err := openFSDP(dir)
	require.NoError(t, err)
	assert.Equal(t, ckpt.FormatTrainerFSDP, c.Format)
	v, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	defer v.Close()
	require.NotNil(t, v.Lookup("config.json"))
	assert.Equal(t, filepath.Join(dir, "config.json"), v.Lookup("config.json").Path)
	want := sttest.FileTensors(t, treetest.Testdata("trainer_fsdp_llama", "expected.safetensors"))
	require.Len(t, v.Tensors, len(want))
	for _, p := range v.Tensors {
		w, ok := want[p.Name]
		require.True(t, ok, p.Name)
		got := make([]byte, p.Size)
		_, err := v.Lookup(p.File).ReadAt(got, p.Offset)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(w, got), p.Name)
	}
}

// TestFSDPHostile: a pytorch_model_fsdp_0 that is no directory of the
// folder holding a DCP is refused in one line naming it.
func TestFSDPHostile(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, model string)
		err  string
	}{
		{"a file", func(t *testing.T, model string) {
			require.NoError(t, os.RemoveAll(model))
			require.NoError(t, os.WriteFile(model, []byte("x"), 0o644))
		}, "is not a directory of"},
		{"a link out of the folder", func(t *testing.T, model string) {
			require.NoError(t, os.Rename(model, filepath.Join(outside, "m")))
			require.NoError(t, os.Symlink(filepath.Join(outside, "m"), model))
		}, "is not a directory of"},
		{"no .metadata", func(t *testing.T, model string) {
			require.NoError(t, os.Remove(filepath.Join(model, ".metadata")))
		}, "holds no .metadata: not the sharded model accelerate saves"},
		{"a cut .metadata", func(t *testing.T, model string) {
			require.NoError(t, os.Truncate(filepath.Join(model, ".metadata"), 100))
		}, ".metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fsdpFolder(t)
			tc.edit(t, filepath.Join(dir, FSDPModelDir))
			require.True(t, treetest.Detect(t, FSDPReader, dir), "refused by Open, not passed through")
			c, err := openFSDP(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.Contains(t, err.Error(), filepath.Join(dir, FSDPModelDir))
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
	require.False(t, treetest.Detect(t, FSDPReader, t.TempDir()))
}
