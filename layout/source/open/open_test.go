package open

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

func TestRemoteRoot(t *testing.T) {
	for _, tc := range []struct {
		src, root, top, rel, err string
	}{
		{src: "s3://bk1/run/step", top: "s3://bk1/run/step", rel: "."},
		{src: "s3://bk1/run/step", root: "s3://bk1/run", top: "s3://bk1/run", rel: "step"},
		{src: "s3://bk1/run/step/", root: "s3://bk1/run/", top: "s3://bk1/run/", rel: "step"},
		{src: "s3://bk1/run/step", root: "s3://bk1", top: "s3://bk1", rel: "run/step"},
		{src: "s3://bk1/run", root: "s3://bk1/run", top: "s3://bk1/run", rel: "."},
		{src: "s3://bk1/runs/step", root: "s3://bk1/run", err: "is not inside --root"},
		{src: "s3://bk1/run/step", root: "s3://bk2/run", err: "is not inside --root"},
		{src: "s3://bk1/run", root: "s3://bk1/run/step", err: "is not inside --root"},
		{src: "s3://bk1/run/step", root: "/local", err: "--root"},
		{src: "s3://bk1/run/../x", err: "plain path"},
		{src: "gs://bk1/run/step", root: "gs://bk1/run", top: "gs://bk1/run", rel: "step"},
		{src: "az://bk1/run/step", root: "az://bk1", top: "az://bk1", rel: "run/step"},
		{src: "gs://bk1/run/step", root: "s3://bk1/run", err: "--root"},
		{src: "s3://bk1/run/step", root: "az://bk1/run", err: "--root"},
		{src: "az://bk1/run//x", err: "plain path"},
		{src: "gs://bk1/run/./x", err: "plain path"},
		{src: "az://Bk1/run", err: "invalid bucket name"},
		{src: "az://b--k/run", err: "invalid bucket name"},
		{src: "/local/run", root: "gs://bk1", err: "is not inside --root"},
	} {
		top, rel, err := remoteRoot(tc.src, tc.root)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.src+" in "+tc.root)
			continue
		}
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.top, top, tc.src)
		assert.Equal(t, tc.rel, rel, tc.src)
	}
}

func TestOpenLocal(t *testing.T) {
	top := t.TempDir()
	repo := filepath.Join(top, "models--org--tiny")
	commit := strings.Repeat("ab", 20)
	snap := filepath.Join(repo, "snapshots", commit)
	require.NoError(t, os.MkdirAll(snap, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "blobs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "blobs", "x"), []byte("weights"), 0o644))
	require.NoError(t, os.Symlink("../../blobs/x", filepath.Join(snap, "model.safetensors")))
	plain := filepath.Join(top, "plain")
	require.NoError(t, os.MkdirAll(filepath.Join(plain, "step"), 0o755))

	for _, tc := range []struct {
		name, loc, root string
		writable        bool
		top, rel        string
		hub             bool
		err             string
	}{
		{name: "directory", loc: plain, top: plain, rel: "."},
		{name: "inside root", loc: filepath.Join(plain, "step"), root: plain, top: plain, rel: "step"},
		{name: "root itself", loc: plain, root: plain, top: plain, rel: "."},
		{name: "outside root", loc: plain, root: filepath.Join(plain, "step"), err: "is not inside --root"},
		{name: "sibling of root", loc: repo, root: plain, err: "is not inside --root"},
		{name: "hub snapshot", loc: snap, top: repo, rel: "snapshots/" + commit, hub: true},
		{name: "hub snapshot written", loc: snap, writable: true, top: snap, rel: "."},
		{name: "missing", loc: filepath.Join(top, "nothing"), err: "no such file"},
		{name: "remote written", loc: "s3://bk1/run", writable: true, err: "only a local directory can be written"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(context.Background(), tc.loc, tc.root, Options{Writable: tc.writable})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, tc.top, s.Tree.Path("."))
			assert.Equal(t, tc.rel, s.Rel)
			assert.Equal(t, tc.hub, s.Hub)
			assert.Nil(t, s.Store)
			dir, err := s.Dir()
			require.NoError(t, err)
			got, ok := source.OnDisk(dir)
			assert.True(t, ok)
			assert.Equal(t, tc.loc, got)
		})
	}
	s, err := Open(context.Background(), snap, "", Options{})
	require.NoError(t, err)
	defer s.Close()
	dir, err := s.Dir()
	require.NoError(t, err)
	b, err := source.ReadFile(dir, "model.safetensors", 64)
	require.NoError(t, err, "a snapshot's links into blobs/ are inside its tree")
	assert.Equal(t, "weights", string(b))
}

// Scheme names the store of a location, and nothing for a local path,
// however much it looks like a URL.
func TestScheme(t *testing.T) {
	for loc, want := range map[string]string{
		"s3://bucket/ckpt": "s3://", "gs://bucket/ckpt": "gs://", "az://container/ckpt": "az://",
		"/data/ckpt": "", "ckpt": "", "S3://bucket": "", "s3:/bucket": "", "./s3://x": "", "http://host/ckpt": "",
	} {
		require.Equal(t, want, Scheme(loc), loc)
		require.Equal(t, want != "", IsRemote(loc), loc)
	}
}
