package stages

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// stepDir lays out step_N/ with one torch-written DCP fixture per stage.
func stepDir(t *testing.T, stages map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "step_3")
	for stage, fixture := range stages {
		src := filepath.Join("..", "..", "testdata", fixture, "ckpt")
		require.NoError(t, os.CopyFS(filepath.Join(dir, stage), os.DirFS(src)))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "train_state.pt"), []byte("x"), 0o644))
	return dir
}

func TestStagesMerge(t *testing.T) {
	dir := stepDir(t, map[string]string{"pp0": "fsdp2_4ranks", "pp1": "tp_shard1"})
	require.True(t, treetest.Detect(t, Reader, dir))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ckpt.FormatStages, c.Format)
	var names []string
	for _, tn := range c.Tensors {
		names = append(names, tn.Name)
	}
	assert.Equal(t, []string{"emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "norm.weight", "norm.bias",
		"col_6x12", "col_4x10", "col_3x2", "row_7x3", "row_8", "rep_2x3", "plain_5"}, names)
	assert.Len(t, c.Parts, 2)
	assert.True(t, Reader.Internal("pp1"))
	assert.False(t, Reader.Internal("train_state.pt"))

	// the stages' bytes are served from their own shard files
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			_, err := treetest.ReadChunk(t, tn, ch)
			require.NoError(t, err, tn.Name)
		}
	}
}

func TestStagesErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stages map[string]string
		err    string
	}{
		{"a gap", map[string]string{"pp0": "fsdp2_4ranks", "pp2": "tp_shard1"}, "pipeline stage pp1 is missing (found pp0, pp2)"},
		{"overlap", map[string]string{"pp0": "fsdp2_4ranks", "pp1": "fsdp2_3ranks"}, `tensor "emb.weight" is saved by both pp0 and pp1`},
		{"a stage that is not DCP", map[string]string{"pp0": "fsdp2_4ranks", "pp1": "hf_sharded"}, "pp1/.metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(stepDir(t, tc.stages))
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
		})
	}
	// A stage that cannot be read is an error naming it, never a model of
	// the other stages.
	outside := stepDir(t, map[string]string{"pp0": "tp_shard1"})
	for _, tc := range []struct {
		name string
		make func(path string) error
		err  string
	}{
		{"a regular file", func(p string) error { return os.WriteFile(p, []byte("x"), 0o644) }, "pp1 is a regular file"},
		{"a link out of the source", func(p string) error { return os.Symlink(outside, p) }, "pp1 is a link that dangles or leads out"},
		{"a dangling link", func(p string) error { return os.Symlink("nowhere", p) }, "pp1 is a link that dangles or leads out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := stepDir(t, map[string]string{"pp0": "fsdp2_4ranks"})
			require.NoError(t, tc.make(filepath.Join(dir, "pp1")))
			_, err := Open(dir)
			assert.ErrorContains(t, err, tc.err)
		})
	}
	// No pp0: still this format, and Open says what is missing.
	dir := stepDir(t, map[string]string{"pp1": "fsdp2_4ranks"})
	assert.True(t, treetest.Detect(t, Reader, dir))
	_, err := Open(dir)
	assert.ErrorContains(t, err, "pipeline stage pp0 is missing (found pp1)")
	assert.False(t, treetest.Detect(t, Reader, t.TempDir()))
}
