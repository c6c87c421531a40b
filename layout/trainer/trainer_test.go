package trainer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/view"
)

// folder is a Trainer checkpoint-1/ with DeepSpeed: the fixture's
// engine.save_checkpoint directory (latest, global_step1/) and the model's
// config.json beside them.
func folder(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "checkpoint-1")
	treetest.CopyFixture(t, "deepspeed_zero2_llama", dir)
	b, err := os.ReadFile(treetest.Testdata("deepspeed_zero2_llama", "hf_config", "config.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "trainer_state.json"), []byte("{}"), 0o644))
	return dir
}

func open(dir string) (*ckpt.Checkpoint, error) { return treetest.OpenLocal(dir, OpenTree) }

// TestFolder: the folder is the view of what `latest` names, with the
// folder's config.json.
func TestFolder(t *testing.T) {
	dir := folder(t)
	require.True(t, treetest.Detect(t, Reader, dir))
	c, err := open(dir)
	require.NoError(t, err)
	v, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	defer v.Close()
	assert.Len(t, v.Tensors, 21)
	require.NotNil(t, v.Lookup("config.json"))
	assert.Equal(t, filepath.Join(dir, "config.json"), v.Lookup("config.json").Path)
}

// TestHostile: a `latest` that names anything but a directory of the
// folder holding a DeepSpeed checkpoint is refused in one line naming it.
func TestHostile(t *testing.T) {
	outside := t.TempDir()
	treetest.CopyFixture(t, "deepspeed_zero2_llama", outside)
	for _, tc := range []struct {
		name   string
		latest string
		edit   func(t *testing.T, dir string)
		err    string
	}{
		{"a path outside", "../x", nil, `names "../x", not a directory of`},
		{"an absolute path", filepath.Join(outside, "global_step1"), nil, "not a directory of"},
		{"a path inside", "global_step1/../global_step1", nil, "not a directory of"},
		{"empty", "\n", nil, `names "", not a directory`},
		{"a missing tag", "global_step7", nil, `names "global_step7", which is not a directory of`},
		{"a file", "trainer_state.json", nil, "which is not a directory of"},
		{"a link out of the folder", "global_step9", func(t *testing.T, dir string) {
			require.NoError(t, os.Symlink(filepath.Join(outside, "global_step1"), filepath.Join(dir, "global_step9")))
		}, `names "global_step9", which is not a directory of`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := folder(t)
			require.NoError(t, os.WriteFile(filepath.Join(dir, LatestFile), []byte(tc.latest), 0o644))
			if tc.edit != nil {
				tc.edit(t, dir)
			}
			require.True(t, treetest.Detect(t, Reader, dir), "refused by Open, not passed through")
			c, err := open(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.Contains(t, err.Error(), filepath.Join(dir, LatestFile))
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
	// A latest beside no DeepSpeed checkpoint is not this format; one
	// longer than a tag is not read.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, LatestFile), []byte("step_1"), 0o644))
	require.False(t, treetest.Detect(t, Reader, dir))
	dir = folder(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, LatestFile), []byte(strings.Repeat("g", maxLatest+1)), 0o644))
	require.False(t, treetest.Detect(t, Reader, dir))
}
