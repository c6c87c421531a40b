package layout

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

const (
	hubCommit  = "0123456789abcdef0123456789abcdef01234567"
	hubCommit2 = "89abcdef0123456789abcdef0123456789abcdef"
)

// hubSnapshot lays the files of testdata/<name>/ckpt out in the HF hub
// cache hub as huggingface_hub 2.4 does (file_download.py:
// repo_folder_name, hf_hub_download → blobs/<etag>, _create_symlink →
// snapshots/<commit>/<file> as a relative link ../../blobs/<etag>,
// _cache_commit_hash_for_specific_revision → refs/main): the etag of an LFS
// file (safetensors) is its sha256, of any other its git blob sha1. It
// returns the repo folder and the snapshot directory.
func hubSnapshot(t *testing.T, hub, repoID, commit, name string) (repo, snap string) {
	t.Helper()
	repo = filepath.Join(hub, "models--"+strings.ReplaceAll(repoID, "/", "--"))
	snap = filepath.Join(repo, "snapshots", commit)
	for _, d := range []string{filepath.Join(repo, "blobs"), filepath.Join(repo, "refs"), snap} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	src := filepath.Join("..", "testdata", name, "ckpt")
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		var etag string
		if strings.HasSuffix(e.Name(), ".safetensors") {
			sum := sha256.Sum256(data)
			etag = hex.EncodeToString(sum[:])
		} else {
			sum := sha1.Sum(append([]byte(fmt.Sprintf("blob %d\x00", len(data))), data...))
			etag = hex.EncodeToString(sum[:])
		}
		require.NoError(t, os.WriteFile(filepath.Join(repo, "blobs", etag), data, 0o644))
		require.NoError(t, os.Symlink("../../blobs/"+etag, filepath.Join(snap, e.Name())))
	}
	require.NoError(t, os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(commit), 0o644))
	return repo, snap
}

// exportOf opens dir with Open and exports its view.
func exportOf(t *testing.T, dir string) string {
	t.Helper()
	c, err := Open(dir)
	require.NoError(t, err)
	v, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	defer v.Close()
	out := filepath.Join(t.TempDir(), "out")
	require.NoError(t, export.Write(context.Background(), v, out, export.Options{}))
	return out
}

// sameExport checks that the views of two directories have the same files
// with the same bytes.
func sameExport(t *testing.T, want, got string) {
	t.Helper()
	a, b := exportOf(t, want), exportOf(t, got)
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	require.Equal(t, names(a), names(b))
	for _, n := range names(a) {
		x, err := os.ReadFile(filepath.Join(a, n))
		require.NoError(t, err)
		y, err := os.ReadFile(filepath.Join(b, n))
		require.NoError(t, err)
		require.True(t, bytes.Equal(x, y), n)
	}
}

// A snapshot of an HF hub cache, the directory from_pretrained resolves
// to, opens on its own: its links into the repo's blobs/ are followed, and
// its view is byte for byte that of the files copied out.
func TestHubSnapshot(t *testing.T) {
	hub := filepath.Join(t.TempDir(), "hub")
	repo, snap := hubSnapshot(t, hub, "org/tiny", hubCommit, "plain_hf_single")
	plain := filepath.Join("..", "testdata", "plain_hf_single", "ckpt")

	t.Run("snapshot", func(t *testing.T) { sameExport(t, plain, snap) })
	t.Run("repo folder opens refs/main", func(t *testing.T) { sameExport(t, plain, repo) })
	t.Run("directory in a snapshot", func(t *testing.T) {
		_, deep := hubSnapshot(t, filepath.Join(t.TempDir(), "hub"), "org/deep", hubCommit, "plain_hf_single")
		sub := filepath.Join(deep, "checkpoint-500")
		require.NoError(t, os.Mkdir(sub, 0o755))
		for _, n := range []string{"config.json", "model.safetensors"} {
			target, err := os.Readlink(filepath.Join(deep, n))
			require.NoError(t, err)
			require.NoError(t, os.Symlink("../"+target, filepath.Join(sub, n)))
		}
		c, err := Open(sub)
		require.NoError(t, err)
		c.Close()
	})
	t.Run("through a symlinked cache dir", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "cache")
		require.NoError(t, os.Symlink(hub, link))
		sameExport(t, plain, filepath.Join(link, "models--org--tiny", "snapshots", hubCommit))
	})
	t.Run("view file is the blob", func(t *testing.T) {
		blob, err := os.ReadFile(filepath.Join(snap, "model.safetensors"))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(exportOf(t, snap), "model.safetensors"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(blob, got))
	})
}

// Hostile snapshots: every link that leaves the snapshot's own repo folder
// is refused as it was before, while the good snapshot beside it opens.
func TestHubSnapshotConfinedToRepo(t *testing.T) {
	top := t.TempDir()
	secret := filepath.Join(top, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("TOP-SECRET"), 0o600))
	hub := filepath.Join(top, "hub")
	repo, good := hubSnapshot(t, hub, "org/tiny", hubCommit, "plain_hf_single")
	other, _ := hubSnapshot(t, hub, "other/repo", hubCommit, "plain_hf_single")
	model, err := os.Readlink(filepath.Join(good, "model.safetensors"))
	require.NoError(t, err)
	blob := filepath.Base(model)

	// hostile makes a second snapshot of org/tiny whose model.safetensors
	// is target.
	hostile := func(t *testing.T, target string) string {
		snap := filepath.Join(repo, "snapshots", hubCommit2)
		require.NoError(t, os.RemoveAll(snap))
		require.NoError(t, os.MkdirAll(snap, 0o755))
		require.NoError(t, os.Symlink("../../blobs/"+blob, filepath.Join(snap, "config.json")))
		require.NoError(t, os.Symlink(target, filepath.Join(snap, "model.safetensors")))
		return snap
	}
	refused := func(t *testing.T, dir string) {
		t.Helper()
		c, err := Open(good)
		require.NoError(t, err, "the good snapshot opens")
		c.Close()
		_, err = Open(dir)
		require.Error(t, err)
		assert.ErrorIs(t, err, source.ErrEscapes)
		assert.NotContains(t, err.Error(), "TOP-SECRET")
	}

	t.Run("another repo's blob", func(t *testing.T) {
		refused(t, hostile(t, "../../../"+filepath.Base(other)+"/blobs/"+blob))
	})
	t.Run("absolute link to /etc/passwd", func(t *testing.T) {
		refused(t, hostile(t, "/etc/passwd"))
	})
	t.Run("absolute link to another repo's blob", func(t *testing.T) {
		refused(t, hostile(t, filepath.Join(other, "blobs", blob)))
	})
	t.Run("dot-dot beyond the repo", func(t *testing.T) {
		refused(t, hostile(t, "../../../../secret"))
	})
	t.Run("blob that links out", func(t *testing.T) {
		evil := filepath.Join(repo, "blobs", "evil")
		require.NoError(t, os.Symlink("../../../secret", evil))
		defer os.Remove(evil)
		refused(t, hostile(t, "../../blobs/evil"))
	})
	t.Run("blobs dir that links out is no repo", func(t *testing.T) {
		// blobs/ must be the repo's own directory: a repo folder whose
		// blobs/ is a link is not recognised (and its links then leave
		// the snapshot).
		fake := filepath.Join(top, "fake", "models--org--fake")
		snap := filepath.Join(fake, "snapshots", hubCommit)
		require.NoError(t, os.MkdirAll(snap, 0o755))
		require.NoError(t, os.Symlink(filepath.Join(repo, "blobs"), filepath.Join(fake, "blobs")))
		require.NoError(t, os.Symlink("../../blobs/"+blob, filepath.Join(snap, "model.safetensors")))
		refused(t, snap)
	})
	t.Run("models-- name that links to a plain directory", func(t *testing.T) {
		// evil/models--org--evil -> plain/, which holds snapshots/<commit>
		// and blobs/: the structure counts where the path resolves, and
		// plain/ is no repo folder, so nothing around the snapshot is let
		// in.
		plain := filepath.Join(top, "plain")
		snap := filepath.Join(plain, "snapshots", hubCommit)
		require.NoError(t, os.MkdirAll(snap, 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(plain, "blobs"), 0o755))
		data, err := os.ReadFile(filepath.Join(good, "model.safetensors"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(plain, "blobs", blob), data, 0o644))
		require.NoError(t, os.Symlink("../../blobs/"+blob, filepath.Join(snap, "model.safetensors")))
		evil := filepath.Join(top, "evil")
		require.NoError(t, os.Mkdir(evil, 0o755))
		require.NoError(t, os.Symlink(plain, filepath.Join(evil, "models--org--evil")))
		refused(t, filepath.Join(evil, "models--org--evil", "snapshots", hubCommit))
	})
	t.Run("models-- name that links to a real repo is that repo", func(t *testing.T) {
		alias := filepath.Join(top, "alias")
		require.NoError(t, os.Mkdir(alias, 0o755))
		require.NoError(t, os.Symlink(repo, filepath.Join(alias, "models--org--alias")))
		c, err := Open(filepath.Join(alias, "models--org--alias", "snapshots", hubCommit))
		require.NoError(t, err)
		c.Close()
		// ... and confined to it: its sibling repo stays out.
		hostile(t, "../../../"+filepath.Base(other)+"/blobs/"+blob)
		refused(t, filepath.Join(alias, "models--org--alias", "snapshots", hubCommit2))
	})
	t.Run("refs/main that is not a commit", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(repo, "refs", "main"), []byte("../../../secret"), 0o644))
		defer os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(hubCommit), 0o644)
		_, err := Open(repo)
		require.ErrorContains(t, err, "not a commit hash")
		assert.NotContains(t, err.Error(), "TOP-SECRET")
	})
}
