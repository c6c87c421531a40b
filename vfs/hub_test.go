package vfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const hubCommit = "0123456789abcdef0123456789abcdef01234567"

// hubSnapshot lays testdata/<name>/ckpt out as the snapshot hubCommit of
// the repo folder models--org--<repo> of the HF hub cache hub, as
// huggingface_hub does (blobs/<etag>; snapshots/<commit>/<file> ->
// ../../blobs/<etag>; refs/main; see layout/hub_test.go). It returns the
// snapshot directory.
func hubSnapshot(t *testing.T, hub, repo, name string) string {
	t.Helper()
	folder := filepath.Join(hub, "models--org--"+repo)
	snap := filepath.Join(folder, "snapshots", hubCommit)
	for _, d := range []string{filepath.Join(folder, "blobs"), filepath.Join(folder, "refs"), snap} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	src := filepath.Join(fixture(t, name), "ckpt")
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		etag := hex.EncodeToString(sum[:])
		require.NoError(t, os.WriteFile(filepath.Join(folder, "blobs", etag), data, 0o644))
		require.NoError(t, os.Symlink("../../blobs/"+etag, filepath.Join(snap, e.Name())))
	}
	require.NoError(t, os.WriteFile(filepath.Join(folder, "refs", "main"), []byte(hubCommit), 0o644))
	return snap
}

// A mount of an HF hub cache snapshot directory serves the snapshot's view
// (its files are links into the repo's blobs/), byte for byte the view of
// the files copied out; a link that leaves the repo folder is refused.
func TestMountHubSnapshot(t *testing.T) {
	ref := exported(t, filepath.Join(fixture(t, "plain_hf_single"), "ckpt"))
	hub := filepath.Join(t.TempDir(), "hub")
	snap := hubSnapshot(t, hub, "tiny", "plain_hf_single")
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			mnt := testMount(t, newFS(t, snap, readMode(mode.direct)))
			names := listDir(t, mnt)
			assert.NotContains(t, names, errorName)
			for _, f := range listDir(t, ref) {
				want, err := os.ReadFile(filepath.Join(ref, f))
				require.NoError(t, err)
				got, err := os.ReadFile(filepath.Join(mnt, f))
				require.NoError(t, err, f)
				require.True(t, bytes.Equal(want, got), f)
			}
		})
	}

	t.Run("repo folder", func(t *testing.T) {
		// Shown as it is on disk: snapshots/<commit>/ are the checkpoints,
		// refs/ and blobs/ plain files.
		mnt := testMount(t, newFS(t, filepath.Dir(filepath.Dir(snap))))
		got, err := os.ReadFile(filepath.Join(mnt, "snapshots", hubCommit, "model.safetensors"))
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join(ref, "model.safetensors"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))
		main, err := os.ReadFile(filepath.Join(mnt, "refs", "main"))
		require.NoError(t, err)
		assert.Equal(t, hubCommit, string(main))
	})

	t.Run("link to another repo's blob", func(t *testing.T) {
		other := hubSnapshot(t, hub, "other", "plain_hf_single")
		blob, err := os.Readlink(filepath.Join(other, "model.safetensors"))
		require.NoError(t, err)
		evil := filepath.Join(hub, "models--org--evil", "snapshots", hubCommit)
		require.NoError(t, os.MkdirAll(evil, 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(hub, "models--org--evil", "blobs"), 0o755))
		require.NoError(t, os.Symlink("../../../models--org--other/blobs/"+filepath.Base(blob), filepath.Join(evil, "model.safetensors")))
		mnt := testMount(t, newFS(t, evil))
		text, err := os.ReadFile(filepath.Join(mnt, errorName))
		require.NoError(t, err)
		assert.Contains(t, string(text), "path escapes the source tree")
		assert.Contains(t, string(text), "model.safetensors")
	})

	t.Run("writable mount stays confined to the directory", func(t *testing.T) {
		mnt := testMount(t, newFS(t, snap, func(o *Options) { o.Writable = true }))
		assert.Contains(t, listDir(t, mnt), errorName)
	})
}
