package layout

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/layout/view"
)

// copyFixture copies testdata/<name>/ckpt to dir.
// Nothing outside the checkpoint (or --root) is read: a sidecar linked to a
// secret is not shown, a shard linked outside is an error, and links that
// stay inside (an HF hub cache's snapshots/ → blobs/) work.
func TestSymlinksStayInside(t *testing.T) {
	top := t.TempDir()
	secret := filepath.Join(top, "secret.json")
	require.NoError(t, os.WriteFile(secret, []byte(`{"secret": true}`), 0o600))

	t.Run("sidecar linked outside is not shown", func(t *testing.T) {
		ck := filepath.Join(top, "sidecar")
		treetest.CopyFixture(t, "sample", ck)
		require.NoError(t, os.Remove(filepath.Join(ck, "config.json")))
		require.NoError(t, os.Symlink(secret, filepath.Join(ck, "config.json")))
		require.NoError(t, os.Symlink("../secret.json", filepath.Join(ck, "tokenizer.json")))
		c, err := Open(ck)
		require.NoError(t, err)
		v, err := view.Plan(c, view.Options{})
		require.NoError(t, err)
		defer v.Close()
		assert.Nil(t, v.Lookup("config.json"))
		assert.Nil(t, v.Lookup("tokenizer.json"))
		out := filepath.Join(top, "sidecar-out")
		require.NoError(t, export.Write(context.Background(), v, out, export.Options{}))
		_, err = os.Stat(filepath.Join(out, "config.json"))
		assert.True(t, os.IsNotExist(err))
	})

	t.Run("shard linked outside is an error", func(t *testing.T) {
		ck := filepath.Join(top, "shard")
		treetest.CopyFixture(t, "fsdp2_4ranks", ck)
		moved := filepath.Join(top, "__0_0.distcp")
		require.NoError(t, os.Rename(filepath.Join(ck, "__0_0.distcp"), moved))
		require.NoError(t, os.Symlink(moved, filepath.Join(ck, "__0_0.distcp")))
		_, err := Open(ck)
		require.Error(t, err)
		assert.ErrorContains(t, err, "path escapes the source tree")
	})

	t.Run("hub cache: snapshots link into blobs inside --root", func(t *testing.T) {
		hub := filepath.Join(top, "hub")
		snap := filepath.Join(hub, "snapshots", "abc")
		blobs := filepath.Join(hub, "blobs")
		treetest.CopyFixture(t, "hf_sharded", snap)
		require.NoError(t, os.MkdirAll(blobs, 0o755))
		ents, err := os.ReadDir(snap)
		require.NoError(t, err)
		for i, e := range ents {
			blob := filepath.Join(blobs, "sha"+string(rune('a'+i)))
			require.NoError(t, os.Rename(filepath.Join(snap, e.Name()), blob))
			require.NoError(t, os.Symlink(filepath.Join("..", "..", "blobs", filepath.Base(blob)), filepath.Join(snap, e.Name())))
		}
		c, err := OpenAt(context.Background(), filepath.Join(hub, "snapshots", "abc"), hub, open.Options{})
		require.NoError(t, err)
		defer c.Close()
		assert.NotEmpty(t, c.Tensors)
		v, err := view.Plan(c, view.Options{})
		require.NoError(t, err)
		require.NoError(t, export.Write(context.Background(), v, filepath.Join(top, "hub-out"), export.Options{}))

		// Confined to the snapshot itself, the links lead outside.
		_, err = Open(snap)
		assert.ErrorContains(t, err, "path escapes the source tree")
	})
}
